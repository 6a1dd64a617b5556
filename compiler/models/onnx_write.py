"""Writing an ONNX model atomically: staged under temporary names in the destination folder, data file
renamed in first and the model last, so an error or a kill never leaves a partial file in place."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def file_mode() -> int:
    """The mode a file the user writes gets under the current umask (temporary files start at 0600)."""
    current = os.umask(0)
    os.umask(current)
    return 0o666 & ~current


def write_atomically(model, destination: Path, external: bool) -> list[Path]:
    """Write `model` (and `<name>.data` when `external`) to `destination`; returns the files written."""
    staging = stage(model, destination, external)
    try:
        return commit(staging, destination)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def stage(model, destination: Path, external: bool, side: dict[str, bytes] | None = None) -> Path:
    """Write `model` complete into a hidden folder beside `destination` (which is not touched), and the
    `side` files (name → bytes) that go beside it; the folder."""
    import onnx

    destination.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=destination.parent, prefix=f".{destination.name}.qrc-"))
    try:
        staged = staging / destination.name
        if external:
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
