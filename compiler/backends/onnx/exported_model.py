"""An HF folder on the ONNX backend is compiled from its export: the export op's resolver resolves the recipe
again against the exported graph (the executor, after exporting; the spec's `planned`, when the export is
already cached). Light: reads the exported graph without its weights (onnx only, no torch, no onnxruntime)."""

from __future__ import annotations

from pathlib import Path

from compiler.plan.ops import Resolver
from compiler.resolve.assignment import Assignment


def quantized_layers(assignment: Assignment) -> dict[str, str]:
    """Quantized layer name → scheme name: what must agree between a folder and its export."""
    return {a.layer.name: a.scheme.name for a in assignment.layers if not a.scheme.is_none}


def resolve_export(resolve: Resolver, exported: Path, folder: Assignment) -> Assignment:
    """`resolve` (the export op's resolver) applied to the export of the folder `folder` was resolved on: the
    executor, after exporting."""
    from compiler.models.onnx_index import index_onnx

    return resolve(index_onnx(exported, folder.model.ref, family=folder.model.family), {})
