"""The ONNX backend's spec: light (no onnxruntime import), registered in compiler.backends.registry."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from compiler.backends.onnx.cost import COSTS
from compiler.backends.onnx.exported_model import quantized_layers, resolve_export
from compiler.backends.onnx.lowering import LOWERING
from compiler.backends.onnx.recipe_checks import check_recipe
from compiler.backends.onnx.runtimes import onnx_runtimes
from compiler.backends.onnx.support import check_supported
from compiler.backends.spec import BackendSpec, OutputKind
from compiler.ir.types import Backend, BackendFacts, EmitFormat, QType, RecipeIR
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


# onnxruntime's x86 CPU kernels (MLAS) multiply uint8 activations by int8 weights (U8S8); an int8 activation
# it fuses only where a single MatMul reads it (its S8→U8 rewrite), and elsewhere it dequantizes and runs the
# MatMul in float: slower than the float model (bench/onnx_w8a8_speed.py, a 55M decoder: 97 ms against 25.6
# float and 16.8 with uint8). An asymmetric uint8 grid is the int8 one shifted by 128, so the default costs
# nothing in accuracy. On ONNX the presets and a bare `activations …` therefore mean uint8; a recipe that
# names `int8` gets it (with Q437). QDQ holds static ranges only (onnxruntime's `quantize_static` form), so
# `W8A8` is the static preset. Smoothing scales fold into norms, and into an MLP's up → down pair where the graph
# shows the gated product (resolve/smoothing.py gated_pair; else Q264); GPTQ rounds MatMul weights only
# (Q226); 4-bit and block-scaled DequantizeLinear need opset 21 (Q265).
FACTS = BackendFacts(default_format=EmitFormat.QDQ, activation_qtype=QType.UINT8, static_activations_only=True,
                     takes_model=("builtin:", ".onnx"), smooths_into_norms_only=True)

SPEC = BackendSpec(
    backend=Backend.ONNX,
    facts=FACTS,
    formats=lambda: (EmitFormat.QDQ, EmitFormat.MATMUL_NBITS),
    output=OutputKind.FILE,
    output_help="a file path ending in .onnx",
    costs=COSTS,
    lowering=LOWERING,
    check=check_supported,
    check_recipe=check_recipe,
    executor="compiler.backends.onnx.execute:execute",
    planned=planned_assignment,
    runtimes=onnx_runtimes,
)
