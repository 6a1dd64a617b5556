"""The ONNX backend's spec: light (no onnxruntime import), registered in compiler.backends.registry."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from compiler.backends.onnx.cost import COSTS
from compiler.backends.onnx.exported_model import quantized_layers, resolve_export
from compiler.backends.onnx.lowering import LOWERING
from compiler.backends.onnx.support import check_supported
from compiler.backends.spec import BackendSpec, OutputKind
from compiler.ir.types import Backend, EmitFormat, RecipeIR
from compiler.models import ModelError, gguf_file, local_path
from compiler.models.exports import cached_export
from compiler.models.index import ModelFormat
from compiler.resolve.assignment import Assignment
from compiler.resolve.pipeline import resolver


def planned_assignment(ir: RecipeIR, assignment: Assignment) -> Assignment:
    """What the plan is built on: for an HF folder whose export is cached, the recipe resolved against the
    export's graph (still an HF folder, so the plan keeps its `export_onnx` op), if it quantizes the same
    layers with the same schemes; otherwise the folder's own assignment (activations from its config)."""
    index = assignment.model
    folder = _export_source(index.ref) if index.format is ModelFormat.HF else None
    exported = cached_export(folder) if folder is not None and folder.is_dir() else None
    if exported is None:
        return assignment
    try:
        resolved = resolve_export(resolver(ir), exported, assignment)
    except ModelError:  # a damaged cache entry: the compile exports again; plan from the config meanwhile
        return assignment
    if quantized_layers(resolved) != quantized_layers(assignment):
        return assignment
    return replace(resolved, model=replace(resolved.model, format=ModelFormat.HF))  # keeps its export_onnx op


def _export_source(ref: str) -> Path | None:
    """The folder an export of `ref` reads: the folder, or a GGUF file's float folder where it was made already
    (planning writes nothing and reads no weights)."""
    gguf = gguf_file(ref)
    if gguf is None:
        return local_path(ref)
    from compiler.models.gguf_source import float_folder

    return float_folder(gguf, ref, create=False)


SPEC = BackendSpec(
    backend=Backend.ONNX,
    formats=(EmitFormat.QDQ, EmitFormat.MATMUL_NBITS),
    output=OutputKind.FILE,
    output_help="a file path ending in .onnx",
    costs=COSTS,
    lowering=LOWERING,
    check=check_supported,
    executor="compiler.backends.onnx.execute:execute",
    planned=planned_assignment,
)
