"""Model facts without weights: `index_model(ref)` for built-ins, .onnx files and HF-style folders."""

from __future__ import annotations

from pathlib import Path

from compiler.models import builtin
from compiler.models.errors import ModelError
from compiler.models.index import Layer, ModelIndex, TensorInfo

__all__ = ["Layer", "ModelError", "ModelIndex", "TensorInfo", "index_model"]


def index_model(ref: str) -> ModelIndex:
    """Index a model reference: `builtin:NAME[?k=v…]`, a path to an .onnx file, or an HF-style folder.

    Raises:
        ModelError: the model cannot be found or read (the error carries a diagnostic code).
    """
    from compiler.models.hf_index import index_hf
    from compiler.models.onnx_index import index_onnx

    if ref.startswith(builtin.PREFIX):
        name, _ = builtin.parse_ref(ref)
        return index_onnx(builtin.onnx_path(ref), ref, family=name)
    path = Path(ref)
    if path.is_dir():
        return index_hf(path, ref)
    if path.is_file():
        if path.suffix.lower() != ".onnx":
            raise ModelError("Q250", f"`{ref}` is neither an .onnx file nor a model folder",
                             "give an .onnx file, an HF-style folder (config.json, *.safetensors) or builtin:NAME")
        return index_onnx(path, ref)
    raise ModelError("Q250", f"model `{ref}` not found",
                     "paths are relative to the current folder; built-ins: "
                     + ", ".join(f"builtin:{n}" for n in builtin.NAMES))
