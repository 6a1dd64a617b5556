"""An HF folder on the ONNX backend is compiled from its export: the export op's resolver resolves the recipe
again against the exported graph (the executor, after exporting; the spec's `planned`, when the export is
already cached). Light: reads the exported graph without its weights (onnx only, no torch, no onnxruntime)."""

from __future__ import annotations

from pathlib import Path

from compiler.backends import BackendError
from compiler.diagnostics import error
from compiler.plan.ops import Resolver
from compiler.resolve.assignment import Assignment
from compiler.source import Span


def quantized_layers(assignment: Assignment) -> dict[str, str]:
    """Quantized layer name → scheme name: what must agree between a folder and its export."""
    return {a.layer.name: a.scheme.name for a in assignment.layers if not a.scheme.is_none}


def resolve_export(resolve: Resolver, exported: Path, folder: Assignment) -> Assignment:
    """`resolve` (the export op's resolver) applied to the export of the folder `folder` was resolved on: the
    executor, after exporting."""
    from compiler.models.onnx_index import index_onnx

    return resolve(index_onnx(exported, folder.model.ref, family=folder.model.family), {})


def refuse_other_layers(span: Span | None, planned: Assignment, exported: Assignment) -> None:
    """Q423: the export must quantize exactly the layers the plan did, with the same schemes: a layer the
    exporter renamed would otherwise be left float (or quantized against the recipe) without a word."""
    before, after = quantized_layers(planned), quantized_layers(exported)
    if before == after:
        return
    differ = sorted(set(before.items()) ^ set(after.items()))
    raise BackendError(error(
        "Q423", f"the ONNX export names or assigns {len(differ)} quantized layer(s) differently from the folder "
        f"(e.g. `{differ[0][0]}`)", span, "export does not match the plan",
        help="compile the folder with `backend torch`, or export it once and compile the .onnx file with rules "
        "for its names (`qrc inspect FILE.onnx`)"))
