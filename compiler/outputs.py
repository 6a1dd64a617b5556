"""Outputs never replace inputs: an output path equal to, inside or containing the model (or its
external data), or a symlink, is refused before any work (Q416)."""

from __future__ import annotations

from pathlib import Path

from compiler.models import ModelError, builtin, resolve_path


def _model_paths(ref: str) -> list[Path]:
    """The files and folders a model reference reads (none for built-ins, which live in qrc's cache)."""
    if ref.startswith(builtin.PREFIX):
        return []
    try:
        path = resolve_path(ref)
    except ModelError:
        return []
    if path.is_file():
        return [path] + sorted(path.parent.glob(path.name + ".data")) + sorted(path.parent.glob(path.stem + ".onnx_data"))
    return [path]


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
