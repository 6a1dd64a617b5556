"""Calibration and verification data as chunks of model inputs: synthetic (seeded, from the model's
shapes), npz (one array per input, samples on axis 0), text lines or a dataset's rows (tokenised: rows.py),
checked against the model's inputs."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from compiler.data.input_values import NUMPY_DTYPES, implied_input, token_range
from compiler.data.npz import npz_axes, read_npz
from compiler.data.problems import DataProblem
from compiler.diagnostics import StageError, error
from compiler.ir.types import DataKind, DataSource
from compiler.models.axes import Axis
from compiler.models.index import ModelIndex, TensorInfo
from compiler.models.inputs import Binding, InputRole, role_of, shape_at, unbindable

VERIFY_SEED_OFFSET = 1_000_003  # held-out synthetic samples: a different seed stream


@dataclass(frozen=True)
class Batches:
    """`samples` samples in chunks of `chunk`; iterate to get {input name: array} feeds."""

    source: DataSource
    index: ModelIndex
    samples: int
    chunk: int
    start: int = 0  # first sample (npz verification takes the samples after calibration's)
    seed_offset: int = 0
    arrays: dict | None = None  # npz contents

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        for first in range(self.start, self.start + self.samples, self.chunk):
            count = min(self.chunk, self.start + self.samples - first)
            if self.arrays is not None:
                yield {name: arr[first:first + count] for name, arr in self.arrays.items()}
            else:
                yield _synthetic_chunk(self.index, self.source, first, count, self.seed_offset)

    def __len__(self) -> int:
        return -(-self.samples // self.chunk)


def calibration_batches(source: DataSource, index: ModelIndex, chunk: int, held_out: int = 0) -> Batches:
    """The calibration samples of `source` for `index`'s inputs, in chunks. `held_out`: the samples
    verification takes from the same file, which calibration never uses (calibrated_count)."""
    if source.kind in FILE_KINDS:
        arrays = _file_arrays(source, index, source.samples + held_out)
        return Batches(source, index, calibrated_count(source, _count(arrays), held_out), chunk, arrays=arrays)
    return Batches(source, index, source.samples, chunk)


FILE_KINDS = (DataKind.NPZ, DataKind.TEXT, DataKind.DATASET)


def load_npz(source: DataSource, index: ModelIndex, rows: int | None = None) -> dict[str, np.ndarray]:
    """An npz file's first `rows` samples for the model's inputs, checked (npz.py), with at least one usable."""
    return _usable(source, read_npz(source, index, rows), index)


def _file_arrays(source: DataSource, index: ModelIndex, rows: int) -> dict[str, np.ndarray]:
    """The first `rows` samples of an npz, text or dataset source."""
    if source.kind is DataKind.NPZ:
        return load_npz(source, index, rows)
    if source.kind is DataKind.TEXT:
        return load_text(source, index, rows)
    from compiler.data.images import image_rows
    from compiler.data.rows import dataset_rows, ordered_rows

    assert source.rows is not None  # `data dataset` (elaboration)
    tokens = image_rows(source, index.ref, ordered_rows(source), rows) if source.rows.image else \
        dataset_rows(source, index.ref, rows)
    extra = dict(tokens.extra)
    types = extra.pop("token_type_ids", np.zeros_like(tokens.ids))
    feeds = _token_feeds(source, index, tokens.ids, tokens.mask, types, "dataset rows")
    return feeds | extra  # pixel values (and what else a processor gives) go to the model's forward as they are


def _usable(source: DataSource, arrays: dict[str, np.ndarray], index: ModelIndex) -> dict[str, np.ndarray]:
    """Q401 when the file gives no sample (an empty text file, blank lines, an npz with 0 samples or
    0-length sequences): calibrating on nothing would leave every range undefined. A decoder's past key/value
    inputs are empty by design (a prompt's first step: `(rows, heads, 0, head_dim)`) and say nothing of that."""
    past = {info.name for info in index.inputs if role_of(info) is InputRole.PAST}
    sized = [a for name, a in arrays.items() if name not in past]
    if not arrays or _count(arrays) == 0 or any(a.ndim > 1 and 0 in a.shape[1:] for a in sized):
        raise StageError(error("Q401", f"`{source.path}` has no usable sample", source.span_of("data"),
                                 "no samples", help="give at least one non-empty sample (a line of text, or an "
                                 "npz row with a non-empty sequence)"))
    return arrays


def verify_batches(source: DataSource, index: ModelIndex, samples: int, chunk: int) -> tuple[Batches, int | None]:
    """The `samples` held-out samples, never one calibration uses: a file's samples after calibration's, its
    last ones where it is too short for both (calibration then takes fewer: calibrated_count). With them the
    file's sample count when calibration was shortened so (the caller says so), else None."""
    if source.kind in FILE_KINDS:
        arrays = _file_arrays(source, index, source.samples + samples)
        total = _count(arrays)
        start = calibrated_count(source, total, samples)
        batches = Batches(source, index, min(samples, total - start), chunk, start=start, arrays=arrays)
        return batches, (total if start < source.samples else None)
    return Batches(source, index, samples, chunk, seed_offset=VERIFY_SEED_OFFSET), None


def calibrated_count(source: DataSource, total: int, held_out: int) -> int:
    """How many of a file's `total` samples calibration takes when `held_out` are kept for verification: the
    recipe's `samples`, fewer where the file cannot give both; Q448 where it cannot give one of each."""
    count = min(source.samples, total - held_out)
    if count < 1:
        raise StageError(error("Q448", f"`{source.path}` gives {total} sample{'s' if total != 1 else ''}: too few to "
                               f"hold out {held_out} for verification and calibrate on the rest",
                               source.span_of("data"), "too short to hold out",
                               help=f"give at least {held_out + 1} samples (the recipe's `samples` plus {held_out} "
                               "is best), or verify on fewer (`verify { samples N }`)"))
    return count


def _count(arrays: dict[str, np.ndarray]) -> int:
    return min(a.shape[0] for a in arrays.values())


def unsynthesisable(index: ModelIndex) -> list[DataProblem]:
    """Why synthetic data cannot fill some input of `index` honestly (never zeros instead): an integer
    input with no known range, or a shape qrc cannot bind (a cache whose head size the model hides)."""
    ranges = [f"synthetic data cannot fill the model's integer input `{t.name}`" for t in index.inputs
              if not np.issubdtype(NUMPY_DTYPES.get(t.dtype, np.float32), np.floating) and token_range(index, t) is None]
    whys = ranges + [f"synthetic data cannot shape the model's inputs: {why}" for why in unbindable(index)]
    return [DataProblem("Q253", why, 'give real samples: `data npz "FILE"` with an array for every model input, or '
                        "`data text` with a tokenizer", "no values to draw") for why in whys]


def probe_feed(index: ModelIndex, seqlen: int = 8, seed: int = 0) -> dict[str, np.ndarray] | None:
    """One synthetic sample of every input of `index` (`seqlen` tokens; a decoder's cache empty), for checking that a
    rewritten model computes what the original does; None where synthetic data cannot fill it (`unsynthesisable`)."""
    if unsynthesisable(index):
        return None
    rng = np.random.RandomState(seed)
    return {t.name: _synthetic_input(index, t, seqlen, rng) for t in index.inputs}


def _synthetic_chunk(index: ModelIndex, source: DataSource, first: int, count: int, offset: int) -> dict[str, np.ndarray]:
    feeds: dict[str, list[np.ndarray]] = {t.name: [] for t in index.inputs}
    for sample in range(first, first + count):
        rng = np.random.RandomState([source.seed + offset, sample])
        for info in index.inputs:
            feeds[info.name].append(_synthetic_input(index, info, source.seqlen, rng))
    return {name: np.concatenate(parts) for name, parts in feeds.items()}


def _synthetic_input(index: ModelIndex, info: TensorInfo, seqlen: int, rng) -> np.ndarray:
    """One sample of input `info`: a decoder's cache is empty (past 0), so its mask covers the new tokens
    and its positions start at 0, as in a generation's first step."""
    binding = Binding(1, seqlen, past=0)
    shape, dtype = shape_at(index, info, binding), NUMPY_DTYPES.get(info.dtype, np.float32)
    if isinstance(shape, str):  # refused at check time (Q253)
        raise ValueError(shape)
    role = role_of(info)
    if role is InputRole.PAST:
        return np.zeros(shape, dtype)  # no element: the past axis is 0
    if np.issubdtype(dtype, np.floating):
        return rng.standard_normal(shape).astype(dtype)
    if role is InputRole.MASK:
        return np.ones(shape, dtype)
    if role is InputRole.POSITIONS:
        return np.broadcast_to(np.arange(binding.past, binding.past + shape[-1], dtype=dtype), shape).copy()
    vocab = token_range(index, info)
    if vocab is None:  # refused at check time (Q253); never fed as zeros
        raise ValueError(f"no synthetic values for input `{info.name}`")
    if vocab == 1:
        return np.zeros(shape, dtype)  # token types: one segment, as a tokenizer gives for one sentence
    return rng.randint(0, vocab, shape).astype(dtype)


def resolve_tokenizer(source: DataSource, model_ref: str) -> Path | None:
    """The tokenizer file of `data text`: the path as written (relative to the current folder), else the same
    relative path inside the model's folder; with no `tokenizer`, the model folder's own tokenizer.json.
    None when there is none."""
    from compiler.data.dataset_schema import model_folder
    from compiler.models import ModelError, resolve_path

    model_dir = model_folder(model_ref)
    if source.tokenizer is None:
        default = model_dir / "tokenizer.json" if model_dir is not None else None
        return default if default is not None and default.is_file() else None
    try:
        path = resolve_path(source.tokenizer)
    except ModelError:
        return None
    if path.is_file():
        return path
    if model_dir is not None and not path.is_absolute() and (model_dir / path).is_file():
        return model_dir / path
    return None


def tokenizer_from_file(path: Path, named: str | None):
    """(tokenizers' Tokenizer of a tokenizers JSON file, None), or (None, the Q401 problem) where it cannot be
    loaded: `qrc check` and the compile load it alike."""
    try:
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(path)), None
    except ImportError:
        return None, DataProblem("Q401", "`data text` needs the tokenizers package", "pip install -e '.[hf]'",
                                 "missing package")
    except Exception as exc:  # noqa: BLE001 - tokenizers raises its own exception type for unreadable files
        return None, DataProblem("Q401", f"cannot load tokenizer `{named or path}` ({type(exc).__name__}: "
                                 f"{str(exc)[:80]})", "a tokenizers JSON file (tokenizer.json), as "
                                 "`tokenizers.Tokenizer.from_file` reads", "unreadable")


def path_problems(source: DataSource, model_ref: str) -> list[DataProblem]:
    """Each file the data source needs that is not there (checked by `qrc check`)."""
    from compiler.models import ModelError, resolve_path

    if source.kind is DataKind.SYNTHETIC:
        return []
    if source.kind is DataKind.DATASET:
        from compiler.data.dataset_schema import dataset_problems

        return dataset_problems(source, model_ref)
    problems = []
    try:
        data = resolve_path(source.path or "")
        found = data.is_file()
    except ModelError:
        found = False
    if not found:
        problems.append(DataProblem("Q401", f"calibration data `{source.path}` not found", "paths are relative to the "
                                    "folder qrc runs in; `package:NAME/path` names a file in a package", "not found"))
    elif source.kind is DataKind.TEXT and not _has_text(data):
        problems.append(DataProblem("Q401", f"calibration data `{source.path}` has no text (empty, or blank lines "
                                    "only)", "one sample per non-empty line", "not found"))
    tokenizer = resolve_tokenizer(source, model_ref) if source.kind is DataKind.TEXT else None
    if tokenizer is not None:  # loaded as the compile loads it: a broken one is said now, not after the model loads
        _, problem = tokenizer_from_file(tokenizer, source.tokenizer)
        if problem is not None:
            problems.append(problem)
    elif source.kind is DataKind.TEXT:
        if source.tokenizer is None:
            problems.append(DataProblem("Q216", "`data text` needs a `tokenizer`: the model has no folder with a "
                                        "tokenizer.json", 'add `{ tokenizer "tokenizer.json" }` (a tokenizers JSON '
                                        "file)", "no tokenizer"))
        else:
            problems.append(DataProblem("Q401", f"tokenizer `{source.tokenizer}` not found (looked in the current "
                                        "folder and the model's)", "give the path of a tokenizers JSON file, e.g. the "
                                        "model folder's tokenizer.json", "not found"))
    return problems


def runtime_problems(source: DataSource, index: ModelIndex, chunks: tuple[int, ...]) -> list[DataProblem]:
    """Data the model's runtime refuses at the given chunk sizes (about `chunk`), from the npz's
    headers: GroupQueryAttention (onnxruntime-genai's builder) takes a filled cache with several new tokens
    only one sample at a time (onnxruntime: "batch_size must be 1 when sequence_length > 1 and past context
    is given")."""
    graph = index.graph
    if graph is None or not any(n.op == "GroupQueryAttention" for n in graph.nodes):
        return []
    past, sequence = cache_length(source), sequence_length(source)
    if past == 0 or sequence <= 1 or max(chunks, default=1) <= 1:
        return []
    return [DataProblem("Q419", f"the model's GroupQueryAttention takes {past} cached + {sequence} new tokens only "
                        f"one sample at a time, and samples would run {max(chunks)} at a time",
                        "set `chunk 1` in `calibrate`, or give data with an empty cache (or one new token per sample)",
                        "samples per run", "chunk")]


def _has_text(path: Path) -> bool:
    """Whether a text file has a non-blank line (read in bounded pieces until one is found)."""
    try:
        return bool(_text_lines(path, 1, 1 << 16))
    except (OSError, UnicodeDecodeError):
        return True  # unreadable: reported where it is read, with its own message


def load_text(source: DataSource, index: ModelIndex, needed: int | None = None) -> dict[str, np.ndarray]:
    """The first `needed` non-empty lines of a text file (all when None), tokenised with a tokenizers JSON
    file, padded/truncated to seqlen. The file is read line by line and each line only up to what seqlen
    tokens can use, so a huge file or a 100 MiB line costs no more memory than the samples."""
    from compiler.models import ModelError, resolve_path

    span = source.span_of("data")
    assert source.path is not None  # `data text "PATH"` (elaboration requires the path)
    try:
        text_path, tok_path = resolve_path(source.path), resolve_tokenizer(source, index.ref)
    except ModelError as exc:
        raise StageError(error("Q401", exc.message, span, "not found", help=exc.help)) from None
    if tok_path is None:
        raise StageError(error("Q401", f"tokenizer `{source.tokenizer}` not found", span, "not found",
                                 help="give the path of a tokenizers JSON file, e.g. the model folder's tokenizer.json"))
    try:
        lines = _text_lines(text_path, needed, source.seqlen * _CHARS_PER_TOKEN)
    except (OSError, UnicodeDecodeError) as exc:
        raise StageError(error("Q401", f"cannot read text `{source.path}` ({type(exc).__name__})", span, "unreadable",
                                 help="a UTF-8 text file, one sample per line")) from None
    tokenizer, problem = tokenizer_from_file(tok_path, source.tokenizer)
    if problem is not None:
        raise StageError(problem.at(source, span)) from None
    tokenizer.enable_truncation(source.seqlen)
    tokenizer.enable_padding(length=source.seqlen)
    encoded = tokenizer.encode_batch(lines)
    ids, mask, types = (np.array([getattr(e, attr) for e in encoded], dtype=np.int64).reshape(len(encoded), -1)
                        for attr in ("ids", "attention_mask", "type_ids"))
    return _token_feeds(source, index, ids, mask, types, "text data")


def _token_feeds(source: DataSource, index: ModelIndex, ids: np.ndarray, mask: np.ndarray, types: np.ndarray,
                 what: str) -> dict[str, np.ndarray]:
    """The model's inputs from tokenised samples: ids, mask and token types as its inputs are named, and what
    they imply for a decoder's other inputs (positions, an empty cache)."""
    tokens = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    arrays: dict[str, np.ndarray] = {}
    for info in index.inputs:
        if info.name in tokens:
            arrays[info.name] = tokens[info.name].astype(NUMPY_DTYPES.get(info.dtype, np.int64))
            continue
        implied = implied_input(index, info, len(ids), source.seqlen)
        if implied is None:
            raise StageError(error("Q402", f"{what} cannot provide model input `{info.name}`", source.span_of("data"),
                                     "missing input", help="tokenised data gives input_ids, attention_mask, token_type_ids, "
                                     "positions and an empty key/value cache; use npz otherwise"))
        arrays[info.name] = implied
    return _usable(source, arrays, index)


_CHARS_PER_TOKEN = 64  # a token is at most this many characters: the rest of a long line is never tokenised


def _text_lines(path: Path, needed: int | None, max_chars: int) -> list[str]:
    """Non-empty, stripped lines, each cut at `max_chars`, at most `needed` of them; read in bounded pieces."""
    lines: list[str] = []
    with path.open(encoding="utf-8") as handle:
        while needed is None or len(lines) < needed:
            line = handle.readline(max_chars)
            if not line:
                break
            if not line.endswith("\n"):  # cut: skip the rest of this line without keeping it
                while (rest := handle.readline(1 << 16)) and not rest.endswith("\n"):
                    pass
            if line.strip():
                lines.append(line.strip())
    return lines


def sequence_length(source: DataSource) -> int:
    """The new tokens per sample the data gives: an npz file's sequence axis (read from its arrays'
    headers, no array data is read), else the recipe's `seqlen`."""
    found = npz_axes(source).get(Axis.SEQUENCE)
    return source.seqlen if found is None else found


def sample_count(source: DataSource) -> int:
    """The calibration samples the data gives: the recipe's `samples`, or an npz file's rows where it has
    fewer (its arrays' first axis, read from their headers; the run reads no more than that)."""
    rows = npz_axes(source).get(Axis.BATCH)
    return source.samples if rows is None else min(source.samples, rows)


def cache_length(source: DataSource) -> int:
    """The tokens already in a decoder's key/value cache per sample: an npz file's past axis (its cache
    arrays' headers), else 0 (synthetic and text data feed an empty cache)."""
    return npz_axes(source).get(Axis.PAST, 0)
