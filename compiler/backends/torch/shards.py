"""Read tensors from safetensors files one at a time, with positioned reads or (a data-free pass) a mapping of
one tensor's pages, unmapped with it (no long-lived mmap: pages of blocks already done do not stay in the
process's resident set)."""

from __future__ import annotations

import json
import math
import mmap
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from compiler.backends import BackendError
from compiler.diagnostics import error
from compiler.models import block_fp8
from compiler.models.safetensors_dtypes import SAFETENSORS_DTYPES
from compiler.models.weight_files import weight_files

# safetensors codes → torch dtypes, for every code of the shared table that this torch has
DTYPES = {code: getattr(torch, d.torch_name) for code, d in SAFETENSORS_DTYPES.items()
          if d.torch_name and hasattr(torch, d.torch_name)}
CODES = {v: k for k, v in DTYPES.items()}
_MAX_HEADER = 100 << 20
_MADV_POPULATE_READ = 22  # Linux 5.14+; Python's mmap module does not name it


@dataclass(frozen=True)
class Entry:
    """Where one tensor is: file, dtype code, shape and absolute byte range."""
    file: Path
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute offset in the file
    end: int


def decoded_entry(stored: Entry, shape: tuple[int, ...]) -> Entry:
    """A tensor decoded to float32 from a stored one (a packed or compressed form): where the stored tensor starts,
    with the byte range its float32 values take (what it reads as, for the memory figures)."""
    return Entry(stored.file, "F32", shape, stored.start, stored.start + math.prod(shape) * DTYPES["F32"].itemsize)


class Shards:
    """Every tensor of the files a folder's weights are in (models/weight_files.py: those transformers loads), by
    name. Block-scaled FP8 weights (an FP8 source checkpoint, models/block_fp8.py) read as float32
    `weight · scale_inv`, blocks of `block`."""

    def __init__(self, folder: Path, block: tuple[int, int] = (128, 128)):
        self.entries: dict[str, Entry] = {}
        for path in weight_files(Path(folder), str(folder)):
            self.entries.update(_read_header(path))
        self.block = block
        self.scaled = block_fp8.scaled_weights({name: entry.dtype for name, entry in self.entries.items()})
        self.scales = frozenset(self.scaled.values())  # not tensors of the model: the output has its own

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def stored_as_is(self, name: str) -> bool:
        """Whether the file holds the tensor's bytes as it reads (so they can be copied byte for byte)."""
        return name not in self.scaled

    def read(self, name: str) -> torch.Tensor:
        """One tensor, read with a positioned read (a block-scaled FP8 weight dequantized, float32)."""
        if name in self.scaled:
            return _dequantize_blocks(self._read(name), self._read(self.scaled[name]), self.block)
        return self._read(name)

    def slices(self, name: str) -> Iterator[tuple[int, torch.Tensor]]:
        """The tensor as `read` gives it, as (first row, rows): whole, here (a GGUF source's come in slices)."""
        yield 0, self.read(name)

    def mapped(self, name: str) -> torch.Tensor:
        """One tensor over a private mapping of its pages, faulted in here (the page cache's pages: no copy,
        no zeroed buffer); unmapped when the tensor goes, so pages of tensors done do not stay resident. For
        a data-free pass reading every weight once; a block-scaled FP8 weight is read as `read` does. The
        header was checked against the file's size: only a file truncated during the run can fault."""
        entry = self.entries.get(name)
        if name in self.scaled or entry is None or entry.end == entry.start or not hasattr(mmap, "MAP_PRIVATE"):
            return self.read(name)
        first = entry.start - entry.start % mmap.ALLOCATIONGRANULARITY
        with open(entry.file, "rb", buffering=0) as handle:
            # private and writable (torch wants a writable buffer; a write would copy the page, never reach the
            # file); MAP_POPULATE would copy every page of such a mapping, MADV_POPULATE_READ maps them as they are
            pages = mmap.mmap(handle.fileno(), entry.end - first, flags=mmap.MAP_PRIVATE,
                              prot=mmap.PROT_READ | mmap.PROT_WRITE, offset=first)
        try:
            pages.madvise(_MADV_POPULATE_READ)
        except OSError:  # before Linux 5.14: the pages fault in as the rounding reads them
            pass
        dtype = DTYPES[entry.dtype]
        count = (entry.end - entry.start) // dtype.itemsize
        return torch.frombuffer(pages, dtype=dtype, count=count, offset=entry.start - first).reshape(entry.shape)

    def _read(self, name: str) -> torch.Tensor:
        return read_entry(self.entries[name], name)


class DerivedShards:
    """Another checkpoint's tensors with some of them computed as they are read (`derive`, for the names in
    `derived`): the `Shards` interface a TorchModel reads. A derived tensor is never copied as it is stored."""

    inner: Shards  # or another checkpoint of this interface
    entries: dict[str, Entry]
    derived: frozenset[str]

    def __init__(self, inner, entries: dict[str, Entry], derived: frozenset[str]):
        self.inner, self.entries, self.derived = inner, entries, derived
        self.scaled, self.scales, self.block = inner.scaled, inner.scales, inner.block

    def derive(self, name: str) -> torch.Tensor:
        """A derived tensor's value."""
        raise NotImplementedError

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def stored_as_is(self, name: str) -> bool:
        """Whether the file holds the tensor's bytes as it reads: a derived one does not."""
        return name not in self.derived and self.inner.stored_as_is(name)

    def read(self, name: str) -> torch.Tensor:
        """One tensor, derived or the inner checkpoint's."""
        return self.derive(name) if name in self.derived else self.inner.read(name)

    def slices(self, name: str) -> Iterator[tuple[int, torch.Tensor]]:
        """A derived tensor whole; the inner checkpoint's as it gives them."""
        if name in self.derived:
            yield 0, self.derive(name)
        else:
            yield from self.inner.slices(name)

    def mapped(self, name: str) -> torch.Tensor:
        """As `read` for a derived tensor, else the inner checkpoint's mapped pages."""
        return self.derive(name) if name in self.derived else self.inner.mapped(name)


def expert_range(fused: Entry, expert: int) -> Entry:
    """The part of a fused [E, …] tensor's bytes that holds expert `expert`, as an entry of shape […]."""
    per = (fused.end - fused.start) // fused.shape[0]
    start = fused.start + expert * per
    return replace(fused, shape=tuple(fused.shape[1:]), start=start, end=start + per)


def read_entry(entry: Entry, name: str) -> torch.Tensor:
    """The tensor `entry` places (a whole tensor, or a contiguous part of one: torch/expert_shards.py), read
    with positioned reads; `name` is what a truncated file's diagnostic calls it."""
    size = entry.end - entry.start
    buffer = bytearray(size)
    with open(entry.file, "rb", buffering=0) as handle:
        handle.seek(entry.start)
        view, done = memoryview(buffer), 0
        while done < size:
            got = handle.readinto(view[done:])
            if not got:
                raise BackendError(error("Q404", f"`{entry.file.name}` ends inside tensor `{name}`", None,
                                         "truncated file", help="the checkpoint is incomplete; re-save it"))
            done += got
    dtype = DTYPES[entry.dtype]
    if size == 0:
        return torch.empty(entry.shape, dtype=dtype)
    return torch.frombuffer(buffer, dtype=dtype).reshape(entry.shape)


def _dequantize_blocks(weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """weight [out, in] float8 · scale_inv [⌈out/r⌉, ⌈in/c⌉], each scale over its r×c block, in float32."""
    rows, cols = block
    out, inp = weight.shape
    scale = scale_inv.float().repeat_interleave(rows, 0)[:out].repeat_interleave(cols, 1)[:, :inp]
    return weight.float() * scale


def _read_header(path: Path) -> dict[str, Entry]:
    with path.open("rb") as handle:
        head = handle.read(8)
        size = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if not 0 < size <= _MAX_HEADER:
            raise BackendError(error("Q404", f"`{path.name}` is not a safetensors file", None, "bad header",
                                     help="the 8-byte header length is missing or implausible"))
        raw = handle.read(size)
    # `qrc check` validated this header (models/hf_index.py); a file replaced since then still gets a coded error,
    # whatever is wrong with it (not JSON, nested past the parser, entries without offsets), not a traceback
    try:
        return _entries(path, json.loads(raw), 8 + size, os.path.getsize(path))
    except (ValueError, RecursionError, KeyError, TypeError, AttributeError) as exc:
        raise BackendError(error("Q404", f"`{path.name}` has a safetensors header qrc cannot read "
                                 f"({type(exc).__name__})", None, "unreadable header",
                                 help="the file changed after `qrc check` read it; re-save the checkpoint")) from exc


def _entries(path: Path, header: dict, base: int, file_size: int) -> dict[str, Entry]:
    """The tensors a parsed header lists, each checked against the file's size and the dtypes qrc reads."""
    entries = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = (base + int(o) for o in info["data_offsets"])
        if end > file_size or info["dtype"] not in DTYPES:
            raise BackendError(error("Q404", f"tensor `{name}` in `{path.name}` is truncated or of an unknown dtype",
                                     None, "unreadable tensor", help="re-save the checkpoint"))
        entries[name] = Entry(path, info["dtype"], tuple(info["shape"]), start, end)
    return entries
