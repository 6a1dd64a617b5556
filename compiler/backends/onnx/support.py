"""What the ONNX backend cannot do, found by `qrc check` at the recipe text that asks for it (every
searched choice included), so `compile` never starts work it would refuse."""

from __future__ import annotations

from compiler.backends.onnx.export_decoder import DECODER_FAMILIES
from compiler.backends.onnx.kernels import layer_kernels
from compiler.backends.onnx.layer_checks import check_layers
from compiler.backends.onnx.rotation_check import check_inline_split, check_rotation
from compiler.diagnostics import Diagnostics
from compiler.ir.types import ActivationMode, EmitFormat, Granularity, QType, RecipeIR
from compiler.models.index import ModelFormat
from compiler.resolve.assignment import Assignment, LayerAssignment
from compiler.resolve.choices import each_choice

# HF folders the export op can turn into ONNX (compiler/backends/onnx/export.py and export_decoder.py,
# which imports torch only when it exports)
EXPORTABLE_FAMILIES = ("bert", *DECODER_FAMILIES)


def check_supported(ir: RecipeIR, assignment: Assignment, diags: Diagnostics) -> None:
    """Q415 for an HF folder the exporter cannot export (a family it does not know, a compressed-tensors folder);
    Q222 for image rows (a VLM's processor feeds a torch forward); Q273 for a graph a rotation cannot take; Q410 for each scheme with dynamic or per-token activations (QDQ holds static per-tensor ranges);
    Q437 (a warning) for each scheme whose int8 activations onnxruntime's x86 kernels run slower than float."""
    check_layers(ir, assignment, diags)
    check_rotation(ir, assignment, diags)
    check_inline_split(ir, assignment, diags)
    index = assignment.model
    if index.format is ModelFormat.HF and index.family not in EXPORTABLE_FAMILIES:
        diags.error("Q415", f"the ONNX backend cannot export `{index.family}` folders to ONNX yet", ir.model_span,
                    "not exportable", help="use `backend torch` for this folder, or give an .onnx file exported "
                    f"yourself (exported here: {', '.join(EXPORTABLE_FAMILIES)})")
    elif index.format is ModelFormat.HF and index.compressed_source:  # the exporters trace float modules
        diags.error("Q415", "the ONNX backend cannot export a compressed-tensors folder (its weights are stored "
                    "quantized)", ir.model_span, "not exportable",
                    help="compile it to a float folder first (`backend torch`, every layer `-> none`), or compile it "
                    "with `backend torch`")
    rows = ir.calibration.data.rows
    if rows is not None and rows.image:  # image rows go through a VLM's processor into its torch forward
        diags.error("Q222", "`image` rows calibrate vision-language models on the torch backend",
                    ir.calibration.data.span_of("image"), "not on onnx", help="use `backend torch` for a VLM folder")
    seen: set[str] = set()
    fmt = ir.emit.format if ir.emit else EmitFormat.QDQ
    for candidate in each_choice(ir, assignment):
        for a in candidate.layers:
            act = a.scheme.activations
            if a.scheme.is_none or act is None or a.scheme.name in seen:
                continue
            if act.mode is ActivationMode.DYNAMIC or act.granularity is Granularity.PER_TOKEN:
                seen.add(a.scheme.name)
                diags.error("Q410", f"scheme `{a.scheme.name}`: dynamic or per-token activations are not supported "
                            "by the ONNX backend", a.scheme.span or (a.rule.span if a.rule else None), "not supported",
                            help="use static per_tensor activations, or a weight-only scheme")
        _warn_slow_int8(candidate, fmt, seen, diags)


def dequantized_int8(assignment: Assignment, fmt: EmitFormat) -> list[LayerAssignment]:
    """The layers whose int8 activations onnxruntime's x86 kernels leave dequantized, run in float (an exported
    folder's graph comes later: there, any int8 activations)."""
    unknown_graph = assignment.model.graph is None
    kernels = {} if unknown_graph else layer_kernels(assignment, fmt)
    return [a for a in assignment.layers
            if a.scheme.activations is not None and a.scheme.activations.qtype is QType.INT8
            and (unknown_graph or kernels.get(a.layer.name, "").startswith("DequantizeLinear"))]


def _warn_slow_int8(assignment: Assignment, fmt: EmitFormat, warned: set[str], diags: Diagnostics) -> None:
    """Q437 once per scheme whose int8 activations leave some of its layers dequantized in float."""
    slow: dict[str, list[LayerAssignment]] = {}
    for a in dequantized_int8(assignment, fmt):
        if a.scheme.name not in warned:
            slow.setdefault(a.scheme.name, []).append(a)
    for name, layers in slow.items():
        warned.add(name)
        first = layers[0]
        diags.warning("Q437", f"scheme `{name}`: onnxruntime's x86 CPU kernels take uint8 activations; "
                      f"{len(layers)} layer(s) read an int8 input that several layers share (e.g. "
                      f"{first.layer.name}) and run dequantized, in float, slower than the float model",
                      first.scheme.span or (first.rule.span if first.rule else None), "int8 activations",
                      help="drop `int8` (on ONNX activations are uint8 by default: the same grid shifted by 128, "
                      "run by MatMulIntegerToFloat), or keep it for a runtime with int8×int8 kernels")
