"""Calibration data from an .npz file (one array per model input, samples on axis 0): its axes and missing
inputs read from the arrays' headers alone (check and plan), and the rows a compile needs read and checked."""

from __future__ import annotations

import functools
import math
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from compiler.data.input_values import IMPLIED_ROLES, NUMPY_DTYPES, implied_input, token_range
from compiler.data.problems import DataProblem
from compiler.diagnostics import StageError, error
from compiler.ir.types import DataKind, DataSource
from compiler.models.axes import Axis, axes_of
from compiler.models.index import ModelIndex, TensorInfo
from compiler.models.inputs import InputRole, role_of


def npz_problems(source: DataSource, index: ModelIndex) -> list[DataProblem]:
    """Model inputs an npz file has no array for, or arrays of different sample counts: read from the zip's directory
    at check time (no array data), so a missing `attention_mask` is not found minutes into a compile."""
    if source.kind is not DataKind.NPZ or not source.path:
        return []
    try:
        with zipfile.ZipFile(source.path) as archive:
            members = _arrays_in(archive)
            present = set(members)
            rows = {t.name: _npy_header(archive.open(members[t.name]))[0] for t in index.inputs if t.name in present}
    except (OSError, zipfile.BadZipFile, ValueError):
        return []  # missing or unreadable: reported with its own message
    tokens = _token_input(index)
    missing = [t.name for t in index.inputs if t.name not in present
               and not (tokens is not None and tokens.name in present and role_of(t) in IMPLIED_ROLES)]
    problems = [DataProblem("Q402", f"`{source.path}` has no array for model input `{name}`",
                            f"arrays present: {', '.join(sorted(present)) or 'none'}; the model needs: "
                            f"{', '.join(t.name for t in index.inputs)}", "missing input") for name in missing]
    samples = {name: shape[0] if shape else 0 for name, shape in rows.items()}
    if len(set(samples.values())) > 1:  # samples are rows: a shorter mask would pair with the wrong ids
        listed = ", ".join(f"`{name}` {count}" for name, count in samples.items())
        problems.append(DataProblem("Q403", f"`{source.path}`: the model's inputs have different numbers of samples "
                                    f"({listed})", "every input array needs one row per sample, in the same order",
                                    "missing input"))
    return problems


def npz_axes(source: DataSource) -> dict[Axis, int]:
    """The sample count and sequence and past lengths an npz source's arrays give (none for other data)."""
    if source.kind is not DataKind.NPZ or not source.path:
        return {}
    try:
        return dict(_npz_header_axes(source.path, Path(source.path).stat().st_mtime_ns))
    except OSError:
        return {}  # `qrc check` reports a missing file (Q401); the estimate keeps the recipe's numbers


@dataclass(frozen=True)
class _Header:
    """An npz member as axes_of reads it."""

    name: str
    dtype: str
    shape: tuple[int, ...]


@functools.lru_cache(maxsize=16)
def _npz_header_axes(path: str, mtime_ns: int) -> tuple[tuple[Axis, int], ...]:
    """The sample count and the sequence and past lengths an npz's arrays give, by what their names and ranks
    mean (the first array with each axis), once per file version (check, plan and report each ask)."""
    headers = []
    try:
        with zipfile.ZipFile(path) as archive:
            for name, member in _arrays_in(archive).items():
                with archive.open(member) as handle:
                    shape, _, dtype = _npy_header(handle)
                headers.append(_Header(name, str(dtype), tuple(int(d) for d in shape)))
    except (OSError, ValueError, zipfile.BadZipFile, KeyError):
        pass  # `qrc check` reports an unreadable file (Q401)
    found: dict[Axis, int] = {}
    for header in sorted(headers, key=lambda h: role_of(h) is not InputRole.TOKENS):  # token ids say it first
        for axis, size in zip(axes_of(header), header.shape, strict=False):
            if axis in (Axis.BATCH, Axis.SEQUENCE, Axis.PAST):
                found.setdefault(axis, size)
    return tuple(found.items())


def read_npz(source: DataSource, index: ModelIndex, rows: int | None = None) -> dict[str, np.ndarray]:
    """An npz file's arrays for the model's inputs, checked against their names, dtypes, shapes and id ranges:
    at most `rows` samples of each are read (a file of 10⁶ samples calibrating on 128 reads 128 rows)."""
    span = source.span_of("data")
    assert source.path is not None  # `data npz "PATH"` (elaboration requires the path)
    path = Path(source.path)
    try:
        with zipfile.ZipFile(path) as archive:
            arrays = {name: _read_rows(archive, member, rows) for name, member in _arrays_in(archive).items()}
    except FileNotFoundError:
        raise StageError(error("Q401", f"calibration data `{source.path}` not found", span, "no such file",
                                 help="paths are relative to the current folder")) from None
    except Exception as exc:  # a corrupt or non-npz file: numpy raises several types
        raise StageError(error("Q401", f"`{source.path}` is not a readable .npz file ({type(exc).__name__})",
                                 span, "unreadable", help="save it with numpy.savez(path, input_ids=..., ...)")) from None
    _imply_missing(index, arrays)
    for info in index.inputs:
        _check_input(source, info, arrays, span, index)
    _check_lengths(source, index, arrays, span)
    return {info.name: arrays[info.name] for info in index.inputs}


def _token_input(index: ModelIndex) -> TensorInfo | None:
    """The model's token-id input, where it has one."""
    return next((t for t in index.inputs if role_of(t) is InputRole.TOKENS), None)


def _imply_missing(index: ModelIndex, arrays: dict[str, np.ndarray]) -> None:
    """A decoder's cache and positions the file has no array for, from its token ids (an empty cache, positions
    from 0: what tokenised text feeds), so an npz of `input_ids` and `attention_mask` calibrates an exported
    decoder as it calibrates the model it came from."""
    tokens = _token_input(index)
    ids = arrays.get(tokens.name) if tokens is not None else None
    if ids is None or ids.ndim != 2:
        return
    for info in index.inputs:
        if info.name not in arrays:
            implied = implied_input(index, info, ids.shape[0], ids.shape[1])
            if implied is not None:
                arrays[info.name] = implied


def _arrays_in(archive: zipfile.ZipFile) -> dict[str, str]:
    """An npz's array names → their members (`input_ids` → `input_ids.npy`)."""
    return {m.removesuffix(".npy"): m for m in archive.namelist() if m.endswith(".npy")}


def _npy_header(handle) -> tuple:
    """(shape, fortran order, dtype) of an .npy stream, read from its header only."""
    major, _ = np.lib.format.read_magic(handle)
    read = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
    return read(handle)


def _read_rows(archive: zipfile.ZipFile, member: str, rows: int | None) -> np.ndarray:
    """The first `rows` rows of one .npy member, read from its header and then only the bytes those rows
    take (C order); a Fortran-order array is read whole. Object arrays are refused (they would unpickle)."""
    with archive.open(member) as handle:
        shape, fortran, dtype = _npy_header(handle)
        if dtype.hasobject:
            raise ValueError(f"{member} holds Python objects")
        if fortran or not shape:
            return np.lib.format.read_array(archive.open(member), allow_pickle=False)
        count = shape[0] if rows is None else min(rows, shape[0])
        per_row = math.prod(shape[1:])
        data = bytearray(handle.read(count * per_row * dtype.itemsize))
        if len(data) != count * per_row * dtype.itemsize:
            raise ValueError(f"{member} is truncated")
        return np.frombuffer(data, dtype).reshape((count, *shape[1:]))


def _check_lengths(source: DataSource, index: ModelIndex, arrays: dict[str, np.ndarray], span) -> None:
    """Inputs that share a symbolic dimension (`sequence`) must agree on it, sample count included."""
    seen: dict[str, tuple[str, int]] = {}
    for info in index.inputs:
        for axis, dim in enumerate(info.shape):
            if isinstance(dim, str) and axis < arrays[info.name].ndim:
                size = arrays[info.name].shape[axis]
                first = seen.setdefault(dim, (info.name, size))
                if axis > 0 and first[1] != size:
                    raise StageError(error("Q403", f"`{info.name}` has {dim} {size} in `{source.path}` but "
                                             f"`{first[0]}` has {first[1]}", span, "lengths differ",
                                             help="pad or truncate every input of a sample to one length"))


def _check_input(source: DataSource, info: TensorInfo, arrays: dict[str, np.ndarray], span, index: ModelIndex) -> None:
    if info.name not in arrays:
        raise StageError(error("Q402", f"`{source.path}` has no array for model input `{info.name}`", span,
                                 "missing input", help=f"arrays present: {', '.join(sorted(arrays)) or 'none'}; "
                                 f"the model needs: {', '.join(t.name for t in index.inputs)}"))
    arr, want = arrays[info.name], NUMPY_DTYPES.get(info.dtype)
    if want is not None and arr.dtype != want:
        raise StageError(error("Q403", f"input `{info.name}` is {arr.dtype} in `{source.path}`; the model wants "
                                 f"{info.dtype}", span, "wrong dtype", help=f"save it as {info.dtype}"))
    if arr.ndim != len(info.shape) or any(isinstance(d, int) and d > 0 and i > 0 and arr.shape[i] != d
                                          for i, d in enumerate(info.shape)):
        shape = "[samples, " + ", ".join(str(d) for d in info.shape[1:]) + "]"
        raise StageError(error("Q403", f"input `{info.name}` has shape {list(arr.shape)} in `{source.path}`; the "
                                 f"model wants {shape}", span, "wrong shape", help="samples go on axis 0"))
    limit = token_range(index, info) if np.issubdtype(arr.dtype, np.integer) else None
    if limit and limit > 1 and arr.size and (arr.min() < 0 or arr.max() >= limit):
        raise StageError(error("Q403", f"input `{info.name}` in `{source.path}` has values from {arr.min()} to "
                                 f"{arr.max()}; the model's vocabulary is 0 … {limit - 1}", span, "ids out of range",
                                 help="tokenise with the model's own tokenizer"))
