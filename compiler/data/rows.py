"""`data dataset`: the rows of a local dataset, read through Hugging Face `datasets` (JSON/JSONL, Parquet, CSV,
Arrow files, a folder of them, or a `save_to_disk` folder), rendered (a text column as it is, chat messages
through the tokenizer's own chat template) and tokenised into samples of exactly `seqlen` tokens.

Memory stays flat in the dataset's size: files are streamed (`streaming=True`), only the rows that become
samples are kept, and a `save_to_disk` folder is memory-mapped. `shuffle` takes the rows in the order of
`datasets.Dataset.shuffle(seed)` (numpy's `default_rng(seed).permutation` of the row count), so a recipe and a
script that shuffles with `datasets` calibrate on the same rows; the rows are then fetched in one streaming
pass per window of that order rather than by loading the dataset.

Nothing here reaches the network: `datasets` runs offline and a name that is not a local path must be in the
Hugging Face cache already."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from compiler.data.dataset_schema import MISSING_HELP, TEMPLATE_FILES, local_folder, saved_folder, tokenizer_location
from compiler.data.templates import TemplateRenderer
from compiler.diagnostics import Diagnostic, StageError, error
from compiler.ir.types import DataSource, RowPolicy
from compiler.models.side_files import linked_outside

# the builder `datasets` reads each file suffix with
BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv", ".arrow": "arrow"}
STREAM_BLOCK = 1 << 20  # bytes of a JSON file parsed at once (datasets' default is 10 MiB)
MAX_CHARS_PER_TOKEN = 64  # a row is cut at seqlen × this many characters before tokenising: no token is longer
WINDOW = 256  # shuffled rows fetched by the first streaming pass (each further pass fetches twice as many)


@dataclass(frozen=True)
class TokenRows:
    """Samples as token ids and the attention mask (1: a token of the row, 0: padding), [samples, seqlen], and
    what a processor gives beside them (an image's pixel values: one row per sample)."""

    ids: np.ndarray
    mask: np.ndarray
    extra: dict[str, np.ndarray] = field(default_factory=dict)


def dataset_rows(source: DataSource, model_ref: str, needed: int) -> TokenRows:
    """The first `needed` samples of `source` (fewer when the dataset runs out), tokenised."""
    assert source.rows is not None and source.path is not None  # `data dataset "PATH"` (elaboration)
    tokenizer = load_tokenizer(source, model_ref)
    if not source.rows.messages:
        return _samples(_texts(source, _open(source), None), tokenizer, source, needed)
    location = tokenizer_location(source, model_ref)
    assert location is not None  # load_tokenizer found it
    with TemplateRenderer(tokenizer, location, source.span_of("messages") or source.span_of("data")) as renderer:
        return _samples(_texts(source, _open(source), renderer), tokenizer, source, needed)


# ---- opening ----------------------------------------------------------------------------------------------

def offline_datasets():
    """The `datasets` module, imported with the Hugging Face libraries kept off the network."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import datasets
    except ImportError:
        raise StageError(error("Q400", "`data dataset` needs the `datasets` package", None, "missing package",
                               help="pip install -e '.[hf]'")) from None
    datasets.disable_progress_bars()  # qrc draws its own
    if "torch" not in sys.modules:  # its IterableDataset imports torch only to share an epoch counter with
        datasets.config.TORCH_AVAILABLE = False  # DataLoader workers: ~250 MiB an ONNX compile does not need
    return datasets


def _open(source: DataSource):
    """The split's rows: a memory-mapped Dataset for a save_to_disk folder, else a streaming IterableDataset."""
    assert source.rows is not None
    span = source.span_of("data")
    path = local_folder(source)
    if path is None:
        raise StageError(error("Q401", f"dataset `{source.path}` is not a local file or folder", span, "not found",
                               help=MISSING_HELP))
    datasets = offline_datasets()
    split = source.rows.split
    try:
        if saved_folder(path):
            saved = datasets.load_from_disk(str(path))
            if isinstance(saved, datasets.DatasetDict):
                if split not in saved:
                    raise _no_split(source, sorted(saved))
                saved = saved[split]
            return saved
        if path.is_dir():
            return datasets.load_dataset(str(path), split=split, streaming=True)
        builder = BUILDERS.get(path.suffix.lower())
        if builder is None:
            raise StageError(error("Q401", f"`{source.path}`: qrc reads datasets from {', '.join(sorted(BUILDERS))} "
                                   "files and folders", span, "unknown format",
                                   help="convert it, or save it with `datasets.Dataset.save_to_disk` and give the folder"))
        extra = {"chunksize": STREAM_BLOCK} if builder == "json" else {}
        return datasets.load_dataset(builder, data_files={split: str(path)}, split=split, streaming=True, **extra)
    except StageError:
        raise
    except ValueError as exc:  # datasets names a missing split in a ValueError
        if "split" in str(exc).lower():
            raise _no_split(source, []) from None
        raise _unreadable(source, exc) from None
    except Exception as exc:  # pyarrow, pandas and datasets raise many types for a corrupt file
        raise _unreadable(source, exc) from None


def _no_split(source: DataSource, present: list[str]) -> StageError:
    assert source.rows is not None
    where = source.span_of("split") or source.span_of("data")
    listed = f"splits present: {', '.join(present)}" if present else "name a split the dataset has"
    return StageError(error("Q435", f"dataset `{source.path}` has no split `{source.rows.split}`", where, "no such split",
                            help=listed))


def _unreadable(source: DataSource, exc: Exception) -> StageError:
    return StageError(error("Q401", f"cannot read dataset `{source.path}` ({type(exc).__name__}: {str(exc)[:120]})",
                            source.span_of("data"), "unreadable",
                            help="a JSON/JSONL, Parquet, CSV or Arrow file, or a `save_to_disk` folder"))


# ---- rows in order ----------------------------------------------------------------------------------------

def ordered_rows(source: DataSource) -> Iterator[Any]:
    """What each row gives (`_column`), in the order samples are taken."""
    return _ordered(source, _open(source))


def columns(source: DataSource) -> list[str]:
    """The columns `source` reads: its text or messages column, and an image column before it."""
    assert source.rows is not None
    return ([source.rows.image] if source.rows.image else []) + [source.rows.field]


def _column(source: DataSource, rows) -> Iterator[Any]:
    """What each row gives, in file order: its text (or messages) column, or (image, text) with an image
    column (batches of 1,000 rows: the other columns are never decoded)."""
    wanted = columns(source)
    names = getattr(rows, "column_names", None)
    missing = [name for name in wanted if names is not None and name not in names]
    if missing:
        raise _no_field(source, list(names or []), missing[0])
    try:
        for batch in rows.select_columns(wanted).iter(batch_size=1000):
            yield from (zip(*(batch[name] for name in wanted), strict=True) if len(wanted) > 1 else batch[wanted[0]])
    except (KeyError, ValueError) as exc:
        named = next((name for name in wanted if name in str(exc)), None)
        if named is not None:
            raise _no_field(source, [], named) from None
        raise _unreadable(source, exc) from None


def _no_field(source: DataSource, present: list[str], column: str) -> StageError:
    assert source.rows is not None
    key = "image" if column == source.rows.image else "messages" if source.rows.messages else "text"
    where = source.span_of(key) or source.span_of("data")
    listed = f"columns present: {', '.join(present)}" if present else "name a column the rows have"
    return StageError(error("Q434", f"dataset `{source.path}` has no column `{column}`", where,
                            "no such column", help=listed))


def _ordered(source: DataSource, rows) -> Iterator[Any]:
    """The field of each row in the order samples are taken: file order, or `Dataset.shuffle(seed)`'s."""
    assert source.rows is not None
    if not source.rows.shuffle:
        yield from _column(source, rows)
        return
    count = len(rows) if hasattr(rows, "__len__") else _row_count(source, rows)
    order = np.random.default_rng(source.seed).permutation(count).tolist()
    start, window = 0, WINDOW
    while start < count:  # windows double: a pass per window, and few passes however many rows a sample takes
        wanted = order[start:start + window]
        if hasattr(rows, "select"):  # memory-mapped: read just these rows
            picked = _column(source, rows.select(sorted(wanted)))
            found = dict(zip(sorted(wanted), picked, strict=True))
        else:
            found = _fetched(source, rows, set(wanted))
        yield from (found[i] for i in wanted)
        start, window = start + window, 2 * window


_COUNTS: dict[tuple, int] = {}  # (file, its version, split, columns) → rows: the full pass is made once per file


def _row_count(source: DataSource, rows) -> int:
    """How many rows a streamed split has: one pass over the file, once per file version (calibration and
    verification both shuffle the same rows)."""
    assert source.rows is not None
    path = local_folder(source)
    version = path.stat().st_mtime_ns if path is not None else None
    key = (str(path), version, source.rows.split, tuple(columns(source)))
    if key not in _COUNTS:
        _COUNTS[key] = sum(1 for _ in _column(source, rows))
    return _COUNTS[key]


def _fetched(source: DataSource, rows, wanted: set[int]) -> dict[int, Any]:
    """The rows at `wanted` (file positions), in one streaming pass that stops after the last of them."""
    last, found = max(wanted), {}
    for i, value in enumerate(_column(source, rows)):
        if i in wanted:
            found[i] = value
        if i >= last:
            break
    return found


def _texts(source: DataSource, rows, renderer: TemplateRenderer | None) -> Iterator[str]:
    """Each row as the text the model reads: its text column, or its messages through the chat template
    (`renderer`: in a child process, under a deadline and size caps)."""
    assert source.rows is not None
    for number, value in enumerate(_ordered(source, rows)):
        if source.rows.messages:
            if not _is_chat(value):
                raise StageError(error(
                    "Q434", f"dataset `{source.path}`: column `{source.rows.field}` of row {number} is not a list of "
                    "chat messages", source.span_of("messages"), "not messages",
                    help='each row needs a non-empty list of {"role": ..., "content": ...}; use `text` for a text '
                    "column"))
            assert renderer is not None
            yield renderer.render(value, number)
        elif isinstance(value, str):
            yield value
        elif value is not None:
            raise StageError(error(
                "Q434", f"dataset `{source.path}`: column `{source.rows.field}` holds {type(value).__name__}, not text",
                source.span_of("text") or source.span_of("data"), "not text",
                help="name a column of strings with `text`, or chat messages with `messages`"))


def _is_chat(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m for m in value)


# ---- tokenising -------------------------------------------------------------------------------------------

def load_tokenizer(source: DataSource, model_ref: str):
    """The tokenizer of the model folder (or of `tokenizer`: a folder, or a tokenizers JSON file) through
    transformers' tokenizers backend, which reads its chat template too (and imports no torch)."""
    span = source.span_of("tokenizer") or source.span_of("data")
    location = tokenizer_location(source, model_ref)
    if location is None:
        raise StageError(error("Q216", "`data dataset` needs a tokenizer: the model has no folder with one", span,
                               "no tokenizer", help='add `tokenizer "FOLDER"` (a folder with tokenizer.json)'))
    try:
        from transformers import PreTrainedTokenizerFast
    except ImportError:
        raise StageError(error("Q400", "`data dataset` needs transformers for its tokenizer", span, "missing package",
                               help="pip install -e '.[hf]'")) from None
    outside = linked_outside(location, [location / name for name in (*TEMPLATE_FILES, "tokenizer.json",
                                                                      "tokenizer_config.json")]) \
        if location.is_dir() else []
    if outside:  # transformers would read what the link points to: /etc/passwd as the chat template
        raise StageError(error("Q401", f"`{outside[0]}` links outside the tokenizer folder `{location}`", span,
                               "links outside", help="copy the file into the folder; qrc reads no file a tokenizer "
                               "folder only links to"))
    try:
        if location.is_dir():
            tokenizer = PreTrainedTokenizerFast.from_pretrained(str(location), local_files_only=True)
        else:
            tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(location))
    except Exception as exc:  # transformers and tokenizers raise many types for unreadable files
        raise StageError(error("Q401", f"cannot load the tokenizer at `{location}` ({type(exc).__name__})", span,
                               "unreadable", help="a folder with tokenizer.json (and tokenizer_config.json)")) from None
    assert source.rows is not None
    if source.rows.messages and not tokenizer.chat_template:
        raise StageError(no_template(source, location))
    return tokenizer


def no_template(source: DataSource, location: Path) -> Diagnostic:
    """Q436: chat rows need the tokenizer's own template, and it has none."""
    return error("Q436", f"the tokenizer at `{location}` has no chat template to render `messages` with",
                 source.span_of("messages") or source.span_of("data"), "no chat template",
                 help="give a tokenizer folder whose tokenizer_config.json (or chat_template.jinja) has one, or "
                 "read a text column with `text`")


def _samples(texts: Iterator[str], tokenizer, source: DataSource, needed: int) -> TokenRows:
    """`needed` samples of exactly seqlen tokens by the row policy (fewer when the rows run out)."""
    assert source.rows is not None
    seqlen, policy = source.seqlen, source.rows.policy
    pad = next((t for t in (tokenizer.pad_token_id, tokenizer.eos_token_id) if t is not None), 0)
    special = not source.rows.messages  # a chat template writes its own special tokens
    ids: list[list[int]] = []
    packed: list[int] = []
    for text in texts:
        if len(ids) >= needed:
            break
        tokens = tokenizer(text[:seqlen * MAX_CHARS_PER_TOKEN], add_special_tokens=special)["input_ids"]
        if policy is RowPolicy.PACK:
            packed.extend(tokens)
            while len(packed) >= seqlen and len(ids) < needed:
                ids.append(packed[:seqlen])
                del packed[:seqlen]
        elif tokens and (policy is RowPolicy.PAD or len(tokens) >= seqlen):
            ids.append(tokens[:seqlen])
    mask = np.zeros((len(ids), seqlen), np.int64)
    out = np.full((len(ids), seqlen), pad, np.int64)
    for row, tokens in enumerate(ids):
        out[row, :len(tokens)] = tokens
        mask[row, :len(tokens)] = 1
    return TokenRows(out, mask)
