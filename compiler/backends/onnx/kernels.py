"""Which onnxruntime CPU kernel each quantized layer of an emitted ONNX graph becomes, as the plan says it.

onnxruntime's graph optimizer fuses QDQ groups into integer kernels only in some forms. On x86 (MLAS):
- a MatMul whose input is uint8 runs as MatMulIntegerToFloat (uint8 × int8 or uint8, float out);
- an int8 input is rewritten to uint8 only where one node reads its DequantizeLinear, so the MatMuls that
  share an input (q/k/v, gate/up) dequantize their weights and multiply in float, every forward;
- Conv becomes QLinearConv and Gemm QGemm, except a Gemm whose output is a graph output;
- a MatMul on a 2-D input followed by a bias Add is first rewritten to a float Gemm (BERT's pooler), whose
  DequantizeLinear inputs then stay;
- a weight-only MatMul (DequantizeLinear on the weight, any 8- or 4-bit grid) becomes MatMulNBits (onnxruntime
  1.32's DQ→MatMulNBits fusion); other weight-only ops stay DequantizeLinear + the float op.
tests/test_onnx_kernels.py checks these against the graph onnxruntime optimizes, layer by layer.
"""

from __future__ import annotations

from collections import Counter

from compiler.ir.types import EmitFormat, Granularity, QType, Scheme
from compiler.models.graph import GraphSummary
from compiler.resolve.assignment import Assignment, LayerAssignment


# here, not in rewrite.py (which imports onnx: 0.9 s), so that the spec every compile loads stays light
def uses_matmul_nbits(fmt: EmitFormat, op_type: str, scheme: Scheme) -> bool:
    """Whether a node of `op_type` has its weight emitted as a MatMulNBits (weight-only groups on MatMul with
    that format)."""
    return (fmt is EmitFormat.MATMUL_NBITS and op_type == "MatMul" and scheme.activations is None
            and scheme.quantized_weights.granularity is Granularity.GROUP)


_FUSED = {"MatMul": "MatMulIntegerToFloat", "Conv": "QLinearConv", "Gemm": "QGemm"}


def layer_kernels(assignment: Assignment, fmt: EmitFormat) -> dict[str, str]:
    """Each quantized layer's name → the kernel onnxruntime's CPU provider runs it with."""
    graph = assignment.model.graph
    quantized = [a for a in assignment.layers if not a.scheme.is_none]
    readers = Counter(a.layer.input for a in quantized if a.scheme.activations is not None)
    outputs = _graph_output_readers(graph) if graph is not None else set()
    gemms = _float_gemms(graph) if graph is not None else set()
    return {a.layer.name: _kernel(a, fmt, readers[a.layer.input], a.layer.weight in outputs, a.layer.weight in gemms)
            for a in quantized}


def kernel_words(assignment: Assignment, fmt: EmitFormat) -> str:
    """`onnxruntime CPU kernels: 56 MatMulIntegerToFloat, 1 DequantizeLinear + float MatMul` (most first)."""
    counts = Counter(layer_kernels(assignment, fmt).values())
    if not counts:
        return ""
    return "onnxruntime CPU kernels: " + ", ".join(f"{n} {k}" for k, n in counts.most_common())


def _kernel(a: LayerAssignment, fmt: EmitFormat, readers: int, writes_graph_output: bool, float_gemm: bool) -> str:
    op, scheme = a.layer.op, a.scheme
    act, weights = scheme.activations, scheme.quantized_weights
    if uses_matmul_nbits(fmt, op, scheme) or (act is None and op == "MatMul"):
        return "MatMulNBits"
    if float_gemm:
        return "DequantizeLinear + float Gemm"
    fused = _FUSED.get(op)
    if act is None or fused is None or weights.qtype.bits != 8 or (op == "Gemm" and writes_graph_output):
        return f"DequantizeLinear + float {op}"
    if act.qtype is QType.INT8 and readers > 1:  # onnxruntime's S8→U8 rewrite needs a single reader
        return f"DequantizeLinear + float {op}"
    return fused


def _graph_output_readers(graph: GraphSummary) -> set[str]:
    """The weights of nodes that write a graph output."""
    outputs = set(graph.outputs)
    return {name for node in graph.nodes if outputs & set(node.outputs) for name in node.inputs}


def _float_gemms(graph: GraphSummary) -> set[str]:
    """The weights of MatMuls onnxruntime turns into a float Gemm first: a 2-D input, the output read by an Add."""
    readers: dict[str, list[str]] = {}
    for node in graph.nodes:
        for name in node.inputs:
            readers.setdefault(name, []).append(node.op)
    found = set()
    for node in graph.nodes:
        value = graph.value(node.inputs[0]) if node.op == "MatMul" and len(node.inputs) == 2 else None
        if value is not None and value.dims is not None and len(value.dims) == 2 and \
                readers.get(node.outputs[0]) == ["Add"]:
            found.add(node.inputs[1])
    return found
