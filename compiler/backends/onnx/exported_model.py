"""An HF folder on the ONNX backend is compiled from its export. The executor resolves the recipe again
against the exported graph; the planner does the same when the export is already cached, so that its
memory model walks the graph that will run instead of estimating activations from the config. Light:
reads the exported graph without its weights (onnx only, no torch, no onnxruntime)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from compiler.diagnostics import Diagnostics
from compiler.ir.types import RecipeIR
from compiler.models import ModelError, local_path
from compiler.models.exports import cached_export
from compiler.models.index import ModelFormat
from compiler.resolve.assignment import Assignment
from compiler.resolve.pipeline import resolve


def quantized_layers(assignment: Assignment) -> dict[str, str]:
    """Quantized layer name → scheme name: what must agree between a folder and its export."""
    return {a.layer.name: a.scheme.name for a in assignment.layers if not a.scheme.is_none}


def resolve_on_export(ir: RecipeIR, exported: Path, folder: Assignment) -> Assignment:
    """The recipe resolved against the export of the folder `folder` was resolved on (its diagnostics were
    given for the folder): the executor after exporting, the planner when the export is cached."""
    from compiler.models.onnx_index import index_onnx

    return resolve(ir, index_onnx(exported, folder.model.ref, family=folder.model.family), Diagnostics())


def planned_assignment(ir: RecipeIR, assignment: Assignment) -> Assignment:
    """What the plan is built on: for an HF folder whose export is cached, the recipe resolved against the
    export's graph (still an HF folder, so the plan keeps its `export_onnx` op), if it quantizes the same
    layers with the same schemes; otherwise the folder's own assignment (activations from its config)."""
    index = assignment.model
    folder = local_path(index.ref) if index.format is ModelFormat.HF else None
    exported = cached_export(folder) if folder is not None and folder.is_dir() else None
    if exported is None:
        return assignment
    try:
        resolved = resolve_on_export(ir, exported, assignment)
    except ModelError:  # a damaged cache entry: the compile exports again; plan from the config meanwhile
        return assignment
    if quantized_layers(resolved) != quantized_layers(assignment):
        return assignment
    return replace(resolved, model=replace(resolved.model, format=ModelFormat.HF))  # keeps its export_onnx op
