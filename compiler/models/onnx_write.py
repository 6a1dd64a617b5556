"""Writing an ONNX model atomically: staged under temporary names in the destination folder, data file
renamed in first and the model last, so an error or a kill never leaves a partial file in place."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from compiler.safe_files import file_mode

INLINE_LIMIT = 1024  # bytes: tensors larger than this live in the data file
COPY_PIECE = 16 << 20  # bytes of a tensor copied file to file at a time


def inline_size(tensor) -> int:
    """A tensor's bytes inside the .onnx file (0 for one in its data file). A model holding a tensor of more than
    INLINE_LIMIT this way is split into model + data before a run (backends/onnx/files.py open_model), which the
    index counts (onnx_index.py)."""
    import onnx  # imported already by every caller (they hold the model's protobuf)

    return 0 if tensor.data_location == onnx.TensorProto.EXTERNAL else tensor.ByteSize()




def write_atomically(model, destination: Path, external: bool) -> list[Path]:
    """Write `model` (and `<name>.data` when `external`) to `destination`; returns the files written."""
    staging = stage(model, destination, external)
    try:
        return commit(staging, destination)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def new_staging(destination: Path) -> Path:
    """A hidden folder beside `destination` where its files are written before they move into place."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(dir=destination.parent, prefix=f".{destination.name}.qrc-"))


def stage(model, destination: Path, external: bool, side: dict[str, bytes] | None = None,
          staging: Path | None = None, alongside: Callable[[bytes], None] | None = None) -> Path:
    """Write `model` (a ModelProto, or one already serialized) complete into a hidden folder beside
    `destination` (which is not touched), and the `side` files (name → bytes) that go beside it; the folder.
    With `staging`, the folder exists and its data file already holds every large initializer (DataFile):
    only the proto is written. `alongside`, for a model given serialized, gets its bytes while they are
    being written."""
    import onnx

    prestaged = staging is not None
    staging = staging or new_staging(destination)
    try:
        staged = staging / destination.name
        if isinstance(model, bytes):
            _write_alongside(staged, model, alongside)
        elif prestaged:
            staged.write_bytes(model.SerializeToString(deterministic=True))
        elif external:
            onnx.save(model, staged, save_as_external_data=True, all_tensors_to_one_file=True,
                      location=destination.name + ".data", size_threshold=1024)
        else:
            staged.write_bytes(model.SerializeToString(deterministic=True))
        for name, data in (side or {}).items():
            (staging / name).write_bytes(data)
        mode = file_mode()  # like any file the user writes, whatever the temp files had
        for path in staging.iterdir():
            path.chmod(mode)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return staging


def _write_alongside(path: Path, blob: bytes, alongside: Callable[[bytes], None] | None) -> None:
    """`blob` written to `path` on a thread (the write releases the GIL) while `alongside(blob)` runs here: a
    load check of a 100 MB model then costs the longer of the two, not their sum."""
    if alongside is None:
        path.write_bytes(blob)
        return
    with ThreadPoolExecutor(max_workers=1) as pool:
        written = pool.submit(path.write_bytes, blob)
        try:
            alongside(blob)
        finally:
            written.result()


class DataFile:
    """A staged model's `<name>.data`, written as the compile goes: each large initializer's bytes are
    appended as soon as it exists (the proto keeps only where they are), and the float initializers kept as
    they were are copied from the source's data file in pieces. onnx's own external-data saving needs every
    tensor in memory at once; a model beyond 2 GB under a small `ram` budget cannot afford that."""

    ALIGN = 4096  # large tensors start on a page boundary (onnxruntime can map them)

    def __init__(self, staging: Path, destination: Path):
        self.location = destination.name + ".data"
        self.path = staging / self.location
        self.handle = open(self.path, "wb")  # noqa: SIM115  # closed by close(), after the last tensor
        self.offset = 0

    def put(self, tensor):
        """`tensor` (with raw_data) with its bytes moved to the data file; a small one is returned as it is."""
        if tensor.ByteSize() <= INLINE_LIMIT:  # as compiler/backends/onnx/files.py tells inline from external
            return tensor
        data = tensor.raw_data
        start = self._start(len(data))
        self.handle.write(data)
        self._point(tensor, start, len(data))
        tensor.ClearField("raw_data")
        return tensor

    def copy(self, tensor, base_dir: Path) -> None:
        """Copy an external `tensor`'s bytes from its data file under `base_dir` into this file, and point
        it here."""
        from onnx.external_data_helper import ExternalDataInfo

        info = ExternalDataInfo(tensor)
        source = base_dir / info.location
        length = info.length if info.length is not None else source.stat().st_size - (info.offset or 0)
        start = self._start(length)
        with open(source, "rb") as handle:
            handle.seek(info.offset or 0)
            left = length
            while left:
                piece = handle.read(min(COPY_PIECE, left))
                if not piece:
                    raise OSError(f"{source} ends before tensor {tensor.name}")
                self.handle.write(piece)
                left -= len(piece)
        self._point(tensor, start, length)

    def close(self) -> None:
        """Flush and close the file (the proto that points into it is written next)."""
        self.handle.close()

    def _start(self, length: int) -> int:
        align = self.ALIGN if length >= self.ALIGN else 64
        start = -(-self.offset // align) * align
        if start > self.offset:
            self.handle.write(b"\0" * (start - self.offset))
        self.offset = start + length
        return start

    def _point(self, tensor, start: int, length: int) -> None:
        from onnx import TensorProto

        # written by hand: onnx's set_external_data insists on a raw_data field, which a copied tensor lacks
        del tensor.external_data[:]
        for key, value in (("location", self.location), ("offset", str(start)), ("length", str(length))):
            tensor.external_data.add(key=key, value=value)
        tensor.data_location = TensorProto.EXTERNAL


def commit(staging: Path, destination: Path) -> list[Path]:
    """Move a staged model into place: the data file first, the model last, so the model file appears
    complete; the files at the destination."""
    written = []
    data = staging / (destination.name + ".data")
    first = [data] if data.exists() else []
    first += sorted(p for p in staging.iterdir() if p.name not in (destination.name, data.name))
    for path in first:  # the data and the side files, then the model
        os.replace(path, destination.parent / path.name)
        written.append(destination.parent / path.name)
    os.replace(staging / destination.name, destination)
    shutil.rmtree(staging, ignore_errors=True)
    return written + [destination]
