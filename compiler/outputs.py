"""Outputs never replace inputs: an output path equal to, inside or containing the model (or its
external data), or a symlink, is refused before any work (Q416)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from compiler.ir.values import human_bytes
from compiler.models import local_path


def _model_paths(ref: str) -> list[Path]:
    """The files and folders a model reference reads (none for built-ins, which live in qrc's cache)."""
    path = local_path(ref)
    if path is None:
        return []
    if path.is_file():
        return [path] + sorted(path.parent.glob(path.name + ".data")) + sorted(path.parent.glob(path.stem + ".onnx_data"))
    return [path]


def unwritable(destination: Path, needed: int = 0) -> str | None:
    """Why `destination`'s folder (or the nearest ancestor that exists: the rest is created) cannot take a
    file of `needed` bytes: not a folder, not writable, or too little free space. None when it can."""
    folder = destination.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        return f"`{folder}` is not a folder"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"cannot write to `{folder}` (permission denied)"
    free = shutil.disk_usage(folder).free
    if free < needed:
        return f"`{folder}` has {human_bytes(free)} free; the output needs about {human_bytes(needed)}"
    return None


def output_conflict(output: Path, model_ref: str) -> str | None:
    """Why writing to `output` could destroy the model's files, or None when it cannot."""
    if output.is_symlink():
        return f"`{output}` is a symbolic link: writing would replace what it points to"
    target = output.resolve()
    for path in _model_paths(model_ref):
        source = path.resolve()
        if target == source:
            return f"`{output}` is the model itself"
        if source in target.parents:
            return f"`{output}` is inside the model's folder `{path}`"
        if target in source.parents:
            return f"`{output}` contains the model `{path}`"
    return None
