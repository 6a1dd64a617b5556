"""Streaming safetensors output: the header of every shard is written first (all names, dtypes and
shapes are known from the plan), then each tensor is written at its offset as soon as it exists, so a
block's quantized weights leave memory right after the block. The folder appears atomically."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol, cast

import numpy as np
import torch

from compiler.backends.emitter import Emitter
from compiler.backends.torch.compressed import TensorSpec, nbytes
from compiler.backends.torch.cost import COPY_SLICE  # the estimate and the copy share it
from compiler.backends.torch.float_formats import portable, restored
from compiler.backends.torch.shards import CODES
from compiler.safe_files import copy_regular, folder_mode, open_regular, own_folder, replace_file

SHARD_BYTES = 2 << 30  # above this the weights are split into model-0000i-of-0000n.safetensors


class FolderWriter(Emitter):
    """The compressed-tensors emitter (compiler.backends.emitter.Emitter): sharded safetensors laid out from
    the specs, each tensor written at its offset when it exists, the folder renamed into place."""

    def __init__(self, destination: Path, specs: list[TensorSpec], shard_bytes: int = SHARD_BYTES,
                 staged: Path | None = None, reopen: bool = False):
        """`staged`: the staging folder of a resumable run (torch/resume.py), kept when the run stops; `reopen`:
        an earlier run's, whose tensors written so far stay (its headers must be this layout's)."""
        self.destination = destination
        destination.parent.mkdir(parents=True, exist_ok=True)
        # a name of its own per run: a second compile into the same place never writes into this one's files
        self.temp = staged or Path(tempfile.mkdtemp(dir=destination.parent, prefix=f".{destination.name}.qrc-tmp-"))
        own_folder(self.temp)  # a resumed run's staged folder: never one a link stands in for
        self.keep = False  # a resumable run's state points at the staged folder: `abort` leaves it
        shards = _shards(specs, shard_bytes)
        names = (["model.safetensors"] if len(shards) == 1 else
                 [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
        self.where: dict[str, tuple[int, int, TensorSpec]] = {}  # name → (file descriptor, offset, spec)
        self.files, self.missing = [], {s.name for s in specs}
        for name, shard in zip(names, shards, strict=True):
            fd = open_regular(self.temp / name, os.O_RDWR | (0 if reopen else os.O_TRUNC))
            self.files.append((name, fd, shard))
            data_start, offsets = _write_header(fd, shard, reopen)
            for spec, offset in zip(shard, offsets, strict=True):
                self.where[spec.name] = (fd, data_start + offset, spec)
        if len(shards) > 1:
            weight_map = {s.name: name for name, _, shard in self.files for s in shard}
            index = {"metadata": {"total_size": sum(nbytes(s) for s in specs)}, "weight_map": dict(sorted(weight_map.items()))}
            replace_file(self.temp / "model.safetensors.index.json", json.dumps(index, indent=2) + "\n")

    def specs(self) -> list[TensorSpec]:
        """Every tensor of the folder, in shard order."""
        return [spec for _, _, shard in self.files for spec in shard]

    def put(self, name: str, tensor: torch.Tensor) -> None:
        """Write one tensor at its place in its shard."""
        fd, offset, spec = self.where[name]
        if tensor.dtype != spec.dtype or tuple(tensor.shape) != spec.shape:
            raise ValueError(f"{name}: {tensor.dtype}{list(tensor.shape)} written where the layout has "
                             f"{spec.dtype}{list(spec.shape)}")
        if tensor.numel():  # the tensor's own memory is written: no bytes copy of a large embedding
            _write_at(fd, tensor, offset)
        self.missing.discard(name)

    def put_float(self, name: str, tensor: torch.Tensor) -> None:
        """A float tensor of the model (a transform rewrote it) in the dtype the layout gives it."""
        self.put(name, tensor.to(self.where[name][2].dtype))

    def put_encoded(self, name: str, data: np.ndarray) -> None:
        """Never called: a folder stores tensors, not a format's own blocks (formats.py BlockEncoder)."""
        raise NotImplementedError("a safetensors folder stores tensors, not encoded blocks")

    def put_rows(self, name: str, first: int, rows: torch.Tensor) -> None:
        """Write rows `first`.. of one tensor at their place (a tensor copied a slice at a time); the tensor counts
        as written once its last row is."""
        fd, offset, spec = self.where[name]
        if first == 0 and tuple(rows.shape) == tuple(spec.shape):  # the whole tensor (a vector, a scalar too)
            self.put(name, rows)
            return
        if rows.dtype != spec.dtype or rows.dim() < 1 or tuple(rows.shape[1:]) != tuple(spec.shape[1:]) \
                or first + len(rows) > spec.shape[0]:
            raise ValueError(f"{name}: rows {first}.. of {rows.dtype}{list(rows.shape)} written where the layout has "
                             f"{spec.dtype}{list(spec.shape)}")
        if len(rows):
            _write_at(fd, rows, offset + first * rows[0].numel() * rows.element_size())
        if first + len(rows) == spec.shape[0]:
            self.missing.discard(name)

    def copy_raw(self, name: str, source: Path, start: int, end: int) -> None:
        """A tensor copied byte for byte from another safetensors file (same dtype and shape), in the
        kernel where it can (copy_file_range): a large embedding never passes through Python."""
        fd, offset, spec = self.where[name]
        if end - start != nbytes(spec):
            raise ValueError(f"{name}: {end - start} bytes copied where the layout has {nbytes(spec)}")
        with open(source, "rb", buffering=0) as handle:
            done = 0
            while done < end - start:
                size = min(COPY_SLICE, end - start - done)
                try:
                    copied = os.copy_file_range(handle.fileno(), fd, size, start + done, offset + done)
                except (AttributeError, OSError):  # not Linux, or across file systems that refuse it
                    copied = os.pwrite(fd, os.pread(handle.fileno(), size, start + done), offset + done)
                if copied <= 0:
                    raise ValueError(f"{name}: the source ended early")
                done += copied
        self.missing.discard(name)

    def metadata(self, relative: str, text: str) -> None:
        """Write a text file of the folder (config.json, qrc.recipe)."""
        replace_file(self.temp / relative, text)

    def copy_file(self, source: Path, relative: str) -> None:
        """Copy another file of the source folder (tokenizer, generation config)."""
        copy_regular(source, own_folder((self.temp / relative).parent) / Path(relative).name)

    def finish(self) -> list[Path]:
        """Check every tensor was written and close the files; the folder stays staged (its files returned)
        until `commit`, so verification can run before anything appears at the destination. The files are not
        fsynced: like transformers' save_pretrained, the bytes reach the disk when the kernel writes them back
        (forcing it cost 0.6 s of a 17 s data-free compile, waiting on the disk, and readers see the page cache
        either way)."""
        if self.missing:
            raise ValueError(f"{len(self.missing)} tensors were never written (e.g. {sorted(self.missing)[0]})")
        for _, fd, _ in self.files:
            os.close(fd)
        self.files = []
        return sorted(p for p in self.temp.rglob("*") if p.is_file())

    def commit(self) -> list[Path]:
        """Move the staged folder into place (replacing an earlier output); the files at the destination."""
        old = None
        if self.destination.exists():
            old = Path(tempfile.mkdtemp(dir=self.destination.parent, prefix=f".{self.destination.name}.qrc-old-"))
            self.destination.replace(old)  # onto the empty folder just made
        os.chmod(self.temp, folder_mode())  # the output is the user's folder, not a private scratch one
        self.temp.replace(self.destination)
        if old is not None:
            shutil.rmtree(old)
        return sorted(p for p in self.destination.rglob("*") if p.is_file())

    def abort(self) -> None:
        """Remove the temporary folder (unless a resume state keeps it): nothing appears at the destination."""
        for _, fd, _ in self.files:
            os.close(fd)
        self.files = []
        if not self.keep:
            shutil.rmtree(self.temp, ignore_errors=True)

    def written(self) -> list[str]:
        """The tensors written so far."""
        return sorted(set(self.where) - self.missing)


def _write_at(fd: int, tensor: torch.Tensor, offset: int) -> None:
    """The tensor's own memory written at `offset` (no bytes copy of a large embedding)."""
    data = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
    written = 0
    while written < data.size:
        written += os.pwrite(fd, data[written:].data, offset + written)


def _shards(specs: list[TensorSpec], limit: int) -> list[list[TensorSpec]]:
    shards: list[list[TensorSpec]] = []
    current: list[TensorSpec] = []
    size = 0
    for spec in specs:
        if current and size + nbytes(spec) > limit:
            shards.append(current)
            current, size = [], 0
        current.append(spec)
        size += nbytes(spec)
    return shards + [current] if current or not shards else shards


def _write_header(fd: int, shard: list[TensorSpec], reopen: bool = False) -> tuple[int, list[int]]:
    """Header (keys sorted, data in the same order), padded with spaces to 8 bytes; the file is sized. `reopen`:
    the file an earlier run began must start with this header (its tensors so far are kept)."""
    ordered = sorted(shard, key=lambda s: s.name)
    header: dict[str, dict] = {"__metadata__": {"format": "pt"}}
    offsets: dict[str, int] = {}
    position = 0
    for spec in ordered:
        header[spec.name] = {"dtype": CODES[spec.dtype], "shape": list(spec.shape),
                             "data_offsets": [position, position + nbytes(spec)]}
        offsets[spec.name] = position
        position += nbytes(spec)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    head = len(text).to_bytes(8, "little") + text
    data_start = 8 + len(text)
    if reopen:
        if os.pread(fd, len(head), 0) != head or os.fstat(fd).st_size != data_start + position:
            raise ValueError("the staged output an earlier run left has another layout")
        return data_start, [offsets[s.name] for s in shard]
    os.pwrite(fd, head, 0)
    os.ftruncate(fd, data_start + position)
    return data_start, [offsets[s.name] for s in shard]


class RankCollector(Emitter):
    """What a rank other than the first hands on instead of writing (compiler/backends/ranks.py): the tensors
    it rounded, taken by the first rank after each round. It writes nothing, so no rank but the first ever
    leaves a file."""

    def __init__(self) -> None:
        self.missing: set[str] = set()  # what copy_unquantized would copy: the first rank copies everything
        self.tensors: dict[str, torch.Tensor] = {}
        self.encoded: dict[str, np.ndarray] = {}  # GGUF: each rounded layer's bytes as gguf_writer.GgufLayout encodes them

    def specs(self) -> list[TensorSpec]:
        """None: the first rank lays the output out."""
        return []

    def put(self, name: str, tensor: torch.Tensor) -> None:
        """Keep a rounded tensor until the first rank takes it."""
        self.tensors[name] = tensor.detach().cpu()

    def put_encoded(self, name: str, data: np.ndarray) -> None:
        """Keep a tensor's bytes in the output's own encoding (GGUF's blocks) until the first rank takes them."""
        self.encoded[name] = data

    def take(self) -> tuple[dict[str, object], dict[str, np.ndarray]]:
        """The tensors kept since the last take, ready to travel to the first rank pickled (float8 as its bytes:
        torch 2.13 pickles float8 tensors but cannot unpickle them; `unpack` gives them back), and the encoded
        ones."""
        taken, self.tensors = self.tensors, {}
        encoded, self.encoded = self.encoded, {}
        return {name: portable(tensor) for name, tensor in taken.items()}, encoded

    @staticmethod
    def unpack(handed: dict[str, object]) -> dict[str, torch.Tensor]:
        """What `take` gave, as tensors again (on the first rank)."""
        return {name: restored(value) for name, value in handed.items()}

    def copy_raw(self, name: str, *args: object, **kwargs: object) -> None:
        """Nothing: the first rank copies the unquantized tensors."""

    def metadata(self, relative: str, text: str) -> None:
        """Nothing: the first rank writes the metadata."""

    def finish(self) -> list[Path]:
        """Nothing staged here."""
        return []

    def commit(self) -> list[Path]:
        """Nothing to move into place here."""
        return []

    def abort(self) -> None:
        """Nothing to remove here."""


class OutputWriter(Emitter, Protocol):
    """The emitter of the rank that writes the output (a folder's, a file's; formats.py), as the run uses it."""

    temp: Path  # the staged output
    keep: bool  # a resumable run's state points at the staged output: `abort` leaves it
    missing: set[str]  # the tensors not written yet
    where: Mapping[str, object]  # every tensor the output holds (by checkpoint name) → its place

    def put_float(self, name: str, tensor: torch.Tensor) -> None:
        """A float tensor of the model, converted to the type the output stores it in."""
        ...

    def put_encoded(self, name: str, data: np.ndarray) -> None:
        """A tensor's bytes in the output's own encoding (formats.py BlockEncoder)."""
        ...

    def written(self) -> list[str]:
        """The tensors written so far."""
        ...


def output_writer(writer: Emitter | None) -> OutputWriter | None:
    """`writer` where this rank writes the output; None for a collector (torchrun's ranks but the first) or none."""
    return None if writer is None or isinstance(writer, RankCollector) else cast(OutputWriter, writer)
