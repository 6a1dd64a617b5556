"""What the ONNX backend refuses of a layer × scheme, found by `qrc check`: GPTQ on what is not a MatMul or Gemm
(Q226), MatMulNBits on what is not a MatMul (Q237), float zero points on a weight not written as MatMulNBits
(Q277), and QDQ weights an old opset cannot hold (Q265)."""

from __future__ import annotations

from compiler.diagnostics import Diagnostics
from compiler.ir.types import EmitFormat, Granularity, RecipeIR, Rounding
from compiler.models.index import LayerKind
from compiler.models.names import compress
from compiler.resolve.assignment import Assignment, LayerAssignment
from compiler.resolve.model_checks import report_misfits, rounds_float_weights

# DequantizeLinear takes int4/uint4 and a `block_size` from opset 21 on; onnxruntime refuses such a node in a
# model of an older opset, so the written file would not load
BLOCKED_QDQ_OPSET = 21


def check_layers(ir: RecipeIR, assignment: Assignment, diags: Diagnostics) -> None:
    """Q226, Q237 (one error per rule, at its scheme) and Q265."""
    report_misfits(ir, assignment, diags, lambda a: _misfits(ir, a), _misfit_text)
    check_qdq_opset(ir, assignment, diags)


def _misfits(ir: RecipeIR, a: LayerAssignment) -> list[str]:
    if not rounds_float_weights(a):
        return []  # Q249 (the shared checks) says all there is about a weight that is not float
    nbits = ir.emit is not None and ir.emit.format is EmitFormat.MATMUL_NBITS
    if a.scheme.rounding.float_zero_points and (not nbits or a.layer.kind is not LayerKind.LINEAR
                                                or a.layer.op == "Gemm"):
        return ["Q277"]  # only MatMulNBits stores a float zero point (DequantizeLinear's are integers)
    if a.layer.kind is LayerKind.LINEAR:
        return []
    found = []
    if a.scheme.rounding is Rounding.GPTQ:
        found.append("Q226")
    if ir.emit and ir.emit.format is EmitFormat.MATMUL_NBITS and a.scheme.activations is None:
        found.append("Q237")
    return found


def _misfit_text(code: str, scheme, names: list[str], assignment: Assignment) -> tuple[str, str]:
    kinds = ", ".join(sorted({assignment.model.layer(n).kind.value for n in names}))
    listed = ", ".join(compress(names)[:4])
    if code == "Q277":
        return (f"`rounding {scheme.rounding.name}` finds float zero points, which only MatMulNBits stores; {listed} "
                f"({kinds}) would be written as DequantizeLinear, whose zero points are integers",
                "emit `format matmul_nbits` and give layers that are not MatMul a scheme with `rounding rtn` or `mse`")
    if code == "Q226":
        return (f"`rounding gptq` rounds MatMul and Gemm weights, not {listed} ({kinds})",
                "add a rule giving these layers a scheme with `rounding rtn` or `mse` (e.g. `type Embedding -> W8A16`)")
    return (f"MatMulNBits cannot take {listed} ({kinds}): it replaces MatMul only",
            'add a rule giving these layers `none` or a QDQ scheme (with activations), or emit `format qdq`')


def check_qdq_opset(ir: RecipeIR, assignment: Assignment, diags: Diagnostics) -> None:
    """Q265: QDQ weights that need opset 21 (4-bit, or a group/block scale) in an ONNX model of an older opset."""
    opset = assignment.model.opset
    if opset is None or opset >= BLOCKED_QDQ_OPSET:
        return
    needing = [a for a in assignment.layers if not a.scheme.is_none and _blocked_qdq(ir, a)]
    if not needing:
        return
    a = needing[0]
    names = ", ".join(compress([x.layer.name for x in needing])[:2])
    diags.error("Q265", f"scheme `{a.scheme.name}` writes 4-bit or group-scaled DequantizeLinear weights, which need "
                f"opset {BLOCKED_QDQ_OPSET}; the model is opset {opset} ({names})",
                a.scheme.span or (a.rule.span if a.rule else ir.span), f"needs opset {BLOCKED_QDQ_OPSET}",
                help="emit `format matmul_nbits` (MatMulNBits serves W4A16 group schemes at any opset), use a "
                f"per-channel int8 scheme, or export the model at opset {BLOCKED_QDQ_OPSET}")


def _blocked_qdq(ir: RecipeIR, a: LayerAssignment) -> bool:
    w = a.scheme.quantized_weights
    if w.qtype.bits != 4 and w.granularity not in (Granularity.GROUP, Granularity.BLOCK):
        return False
    nbits = ir.emit is not None and ir.emit.format is EmitFormat.MATMUL_NBITS
    return not (nbits and a.layer.op == "MatMul" and a.scheme.activations is None)  # MatMulNBits takes it
