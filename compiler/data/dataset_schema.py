"""Where a `data dataset` and its tokenizer are, and what `qrc check` can tell without reading rows: the columns (a Parquet or Arrow
file's schema, a CSV header, the first JSONL row, a `save_to_disk` folder's features), whether the split has a
row (Parquet metadata; the first line of a text format), and whether the tokenizer has a chat template for
`messages`. Neither `datasets` nor a tokenizer is imported here: reading a schema costs milliseconds."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from compiler.data.problems import DataProblem
from compiler.ir.types import DataSource
from compiler.safe_files import read_json, regular_input

TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
# A save_to_disk folder's dataset_dict.json and dataset_info.json hold split names and features (kilobytes);
# bounded, so that a check never reads a planted multi-GB file whole
SAVED_METADATA_LIMIT = 16 << 20
MISSING_HELP = ("give a local file or folder (paths are relative to the folder qrc runs in); qrc reads no network: "
                "for a Hub dataset, `huggingface-cli download --repo-type dataset NAME --local-dir DIR` and give DIR")


def model_folder(model_ref: str) -> Path | None:
    """The model's folder (an HF-style folder, or a GGUF file's side folder), or None for built-ins and ONNX
    files."""
    from compiler.models import model_dir

    return model_dir(model_ref)


def local_folder(source: DataSource) -> Path | None:
    """Where `source`'s rows are on this machine: its path, or a Hugging Face cache snapshot of a dataset named
    like `org/name`; None when there is neither."""
    from compiler.models import ModelError, resolve_path

    assert source.path is not None
    try:
        path = resolve_path(source.path)
    except ModelError:
        path = None
    if path is not None and path.exists():
        return path
    if source.path.count("/") == 1 and not source.path.startswith((".", "/")):
        try:
            from huggingface_hub import snapshot_download

            return Path(snapshot_download(source.path, repo_type="dataset", local_files_only=True))
        except Exception:  # not in the cache (or no huggingface_hub): reported by the caller
            return None
    return None


def saved_folder(path: Path) -> bool:
    """Whether `path` is a folder `datasets.Dataset.save_to_disk` (or DatasetDict's) wrote."""
    return path.is_dir() and ((path / "state.json").is_file() or (path / "dataset_dict.json").is_file())


def tokenizer_location(source: DataSource, model_ref: str) -> Path | None:
    """The tokenizer `data dataset` uses: `tokenizer` (a folder or a tokenizers JSON file, as written or inside
    the model folder), else the model folder when it has a tokenizer.json; None when there is none."""
    from compiler.models import ModelError, resolve_path

    model_dir = model_folder(model_ref)
    if source.tokenizer is None:
        return model_dir if model_dir is not None and (model_dir / "tokenizer.json").is_file() else None
    try:
        path = resolve_path(source.tokenizer)
    except ModelError:
        return None
    for candidate in (path, model_dir / path if model_dir is not None and not path.is_absolute() else None):
        if candidate is not None and (candidate.is_file() or (candidate / "tokenizer.json").is_file()):
            return candidate
    return None


def has_chat_template(location: Path) -> bool:
    """Whether the tokenizer at `location` carries a chat template (tokenizer_config.json's `chat_template`, or
    the template files transformers writes beside it); a lone tokenizers JSON file has none."""
    if location.is_file():
        return False
    if any((location / name).is_file() for name in TEMPLATE_FILES):
        return True
    try:
        config = read_json(location / "tokenizer_config.json", 64 << 20)
    except (OSError, ValueError):
        return False
    return bool(isinstance(config, dict) and config.get("chat_template"))


def columns_and_rows(path: Path, split: str) -> tuple[list[str] | None, bool | None]:
    """(the columns, whether the split has a row) as far as the file's metadata or first row tells; None for
    what cannot be told cheaply (then the compile finds out). Unreadable files give (None, None): the compile
    reports them with the reader's own message."""
    try:
        if path.is_dir():
            return _saved_folder(path, split)
        suffix = path.suffix.lower()
        if suffix == ".parquet":
            import pyarrow.parquet as pq

            meta = pq.ParquetFile(path).metadata
            return list(meta.schema.names), meta.num_rows > 0
        if suffix == ".arrow":
            return _arrow_columns(path), None
        if suffix == ".csv":
            with path.open(encoding="utf-8", newline="") as handle:
                reader = csv.reader(handle)
                header = next(reader, None)
                return (header, next(reader, None) is not None) if header is not None else ([], False)
        if suffix in (".jsonl", ".json"):
            return _first_json_row(path)
    except (OSError, ValueError, UnicodeDecodeError, csv.Error):
        return None, None
    except Exception:  # pyarrow's own errors for a corrupt file
        return None, None
    return None, None


def _first_json_row(path: Path) -> tuple[list[str] | None, bool | None]:
    """JSON Lines: the keys of the first non-blank line. A JSON document (an array) is not parsed here."""
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if not line.strip():
                continue
            if line.lstrip().startswith("["):
                return None, None
            row = json.loads(line)
            return (list(row) if isinstance(row, dict) else None), True
    return [], False


def _arrow_columns(path: Path) -> list[str] | None:
    import pyarrow as pa

    with pa.memory_map(str(path)) as mapped:
        try:
            return list(pa.ipc.open_stream(mapped).schema.names)
        except pa.ArrowInvalid:
            mapped.seek(0)
            return list(pa.ipc.open_file(mapped).schema.names)


def _saved_folder(path: Path, split: str) -> tuple[list[str] | None, bool | None]:
    """A `save_to_disk` folder: its dataset_info.json features (a DatasetDict's split folder first)."""
    splits = path / "dataset_dict.json"
    if splits.is_file():
        names = read_json(splits, SAVED_METADATA_LIMIT).get("splits", [])
        if split not in names:
            return None, False
        path = path / split
    info = path / "dataset_info.json"
    if not info.is_file():
        return None, None
    features = read_json(info, SAVED_METADATA_LIMIT).get("features")
    return (list(features) if isinstance(features, dict) else None), None


def json_problem(path: Path) -> str | None:
    """Why a .json/.jsonl file is no JSON the dataset reader takes, where its first character past blanks (and a
    byte order mark) says so at once, as for a text file given as a dataset: JSON Lines' rows and a JSON document
    begin with `{` or `[`. None otherwise (what else is wrong the compile reports with the reader's own message).
    Reads a chunk at a time until that character, never a whole line (a JSON document may be one line of GBs)."""
    if path.suffix.lower() not in (".jsonl", ".json") or not path.is_file():
        return None
    try:
        with path.open(encoding="utf-8") as handle:
            while chunk := handle.read(1 << 16):
                text = chunk.lstrip().lstrip("\ufeff").lstrip()
                if text:
                    return None if text[0] in "{[" else f"it begins with `{text[0]}`, not `{{` or `[`"
    except (OSError, UnicodeDecodeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def dataset_problems(source: DataSource, model_ref: str) -> list[DataProblem]:
    """What keeps a `data dataset` from giving samples, told from the file's metadata or first row: not there,
    no such column, an empty split, no tokenizer, or chat rows with a tokenizer that has no chat template."""
    assert source.rows is not None and source.path is not None
    rows = source.rows
    problems = []
    path = local_folder(source)
    if path is None:
        problems.append(DataProblem("Q401", f"dataset `{source.path}` is not a local file or folder", MISSING_HELP,
                                    "not found"))
    elif not path.is_dir() and not regular_input(path):  # a FIFO or a device would block the reader forever
        problems.append(DataProblem("Q401", f"dataset `{source.path}` is not a regular file (a FIFO, a socket or a "
                                    "device)", "give a dataset file or a save_to_disk folder", "not found"))
    elif (not_json := json_problem(path)) is not None:
        problems.append(DataProblem("Q401", f"dataset `{source.path}` is not JSON ({not_json})", "a JSON Lines file "
                                    "has one JSON object a line; a text file is read with `data text`",
                                    "unreadable"))
    else:
        columns, has_rows = columns_and_rows(path, rows.split)
        field_key = "messages" if rows.messages else "text"
        for column, key in ((rows.field, field_key), (rows.image, "image")):
            if column and columns and column not in columns:
                problems.append(DataProblem("Q434", f"dataset `{source.path}` has no column `{column}`",
                                            f"columns present: {', '.join(columns)}", "no such column", key))
        if has_rows is False:
            problems.append(DataProblem("Q435", f"dataset `{source.path}` has no rows in split `{rows.split}`",
                                        "name a split that has rows (`split \"train\"` is the default), or give a "
                                        "file with rows", "no rows", "split"))
    location = tokenizer_location(source, model_ref)
    if location is None:
        problems.append(DataProblem("Q216", "`data dataset` needs a tokenizer: the model has no folder with one" if
                                    source.tokenizer is None else f"tokenizer `{source.tokenizer}` not found (looked "
                                    "in the current folder and the model's)", 'add `tokenizer "FOLDER"` (a folder '
                                    "with tokenizer.json and, for `messages`, a chat template)", "no tokenizer",
                                    "tokenizer"))
    elif rows.messages and not has_chat_template(location):
        problems.append(DataProblem("Q436", f"the tokenizer at `{location}` has no chat template to render "
                                    "`messages` with", "give a tokenizer folder whose tokenizer_config.json (or "
                                    "chat_template.jinja) has one, or read a text column with `text`",
                                    "no chat template", "messages"))
    return problems
