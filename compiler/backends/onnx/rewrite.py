"""The quantized graph: weights as DequantizeLinear (int8 per-tensor/per-channel, blocked int4/int8 at
opset 21) or com.microsoft.MatMulNBits, and QuantizeLinear/DequantizeLinear pairs on the inputs of
activation-quantized layers. Everything else in the graph is left as it was."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from compiler.backends.onnx.kernels import uses_matmul_nbits
from compiler.ir.types import EmitFormat, QType, Scheme
from compiler.models.index import Layer
from compiler.quant import qparams
from compiler.quant.pack_int32 import offset_bytes, pack_int4
from compiler.quant.weights import QuantizedWeight, round_weight
from compiler.resolve.assignment import Assignment

_UNSIGNED_OFFSET = {QType.INT4: 8, QType.INT8: 128}  # signed values into MatMulNBits' unsigned domain
_TYPES = {QType.INT8: TensorProto.INT8, QType.UINT8: TensorProto.UINT8, QType.INT4: TensorProto.INT4,
          QType.UINT4: TensorProto.UINT4}
MS_DOMAIN = "com.microsoft"


@dataclass(frozen=True)
class WeightJob:
    """A weight to quantize: its layer and the scheme it gets."""
    layer: Layer
    scheme: Scheme


def float_type(dtype: str):
    """The numpy type of an ONNX float type name: scales and zero points are written in the type of the
    tensor they rescale (fp16 and bf16 graphs: ONNX requires DequantizeLinear's scale to match its output)."""
    if dtype == "float16":
        return np.float16
    if dtype == "bfloat16":
        import ml_dtypes  # onnx's own dependency for bf16 arrays

        return ml_dtypes.bfloat16
    return np.float32


def weight_axes(node: onnx.NodeProto) -> tuple[int, int]:
    """(output-channel axis, input axis) of a layer's weight as it is stored."""
    if node.op_type == "Gemm" and any(a.name == "transB" and a.i for a in node.attribute):
        return 0, 1
    if node.op_type in ("Conv", "Gather"):
        return 0, 1
    return 1, 0  # MatMul B: [K, N]


def weight_nodes(model: onnx.ModelProto, weights) -> list[tuple[onnx.NodeProto, str]]:
    """(first node reading it, name) for each of `weights` (a collection of initializer names), in graph order."""
    seen: dict[str, onnx.NodeProto] = {}
    for node in model.graph.node:
        for name in node.input:
            if name in weights and name not in seen:
                seen[name] = node
    return [(node, name) for name, node in seen.items()]


def tensor(name: str, array: np.ndarray, qtype: QType | None = None) -> onnx.TensorProto:
    """An initializer from an array, in the scheme's integer type when `qtype` is given."""
    if qtype is None or qtype.bits == 8:
        return numpy_helper.from_array(np.array(array, order="C"), name)  # 0-d stays 0-d
    raw = pack_int4(np.asarray(array).reshape(-1)).tobytes()
    return helper.make_tensor(name, _TYPES[qtype], list(array.shape), vals=raw, raw=True)


def dequantize_nodes(node: onnx.NodeProto, weight: str, qw: QuantizedWeight, scale_type=np.float32) -> tuple[list, list, str]:
    """Initializers and the DequantizeLinear node that replace a float weight (scales in `scale_type`, the
    weight's own float type)."""
    out = f"{weight}_dequantized"
    assert not np.issubdtype(qw.zero_point.dtype, np.floating), "float zero points are MatMulNBits' (Q277)"
    inits = [tensor(f"{weight}_quantized", qw.q, qw.qtype), tensor(f"{weight}_scale", qw.scale.astype(scale_type)),
             tensor(f"{weight}_zero_point", qw.zero_point.astype(qparams.np_type(qw.qtype)), qw.qtype)]
    attrs: dict[str, int] = {}
    if qw.axis is not None:
        attrs["axis"] = qw.axis
    if qw.block_size:
        attrs["block_size"] = qw.block_size
    dq = helper.make_node("DequantizeLinear", [i.name for i in inits], [out], name=f"{weight}_DequantizeLinear", **attrs)  # type: ignore[arg-type]  # onnx stubs type **kwargs as doc_string
    return inits, [dq], out


def matmul_nbits(node: onnx.NodeProto, weight: str, qw: QuantizedWeight, symmetric: bool, scale_type=np.float32,
                 accuracy_level: int = 0) -> tuple[list, onnx.NodeProto]:
    """MatMulNBits: B uint8 [N, k_blocks, block·bits/8], scales [N, k_blocks] in the input's float type,
    zero points packed (asymmetric)."""
    bits, block = qw.qtype.bits, qw.block_size
    assert block is not None  # MatMulNBits takes blocked weights (uses_matmul_nbits)
    q = np.ascontiguousarray(offset_bytes(qw.q, _UNSIGNED_OFFSET.get(qw.qtype, 0)).T)  # [N, K]
    n, k = q.shape
    blocks = q.reshape(n, k // block, block)
    packed = pack_int4(blocks) if bits == 4 else blocks
    scales = np.ascontiguousarray(qw.scale.T.astype(scale_type))  # [N, k_blocks]
    inits = [numpy_helper.from_array(np.ascontiguousarray(packed), f"{weight}_Q{bits}"),
             numpy_helper.from_array(scales, f"{weight}_scales")]
    inputs = [node.input[0], inits[0].name, inits[1].name]
    if not symmetric:
        inits.append(numpy_helper.from_array(_nbits_zero_points(qw, scale_type), f"{weight}_zero_points"))
        inputs.append(inits[-1].name)
    new = helper.make_node("MatMulNBits", inputs, list(node.output), name=f"{node.name}_Q{bits}", domain=MS_DOMAIN,
                           K=k, N=n, bits=bits, block_size=block, accuracy_level=accuracy_level)
    return inits, new


def _nbits_zero_points(qw: QuantizedWeight, scale_type) -> np.ndarray:
    """MatMulNBits' zero points [N, k_blocks] in its unsigned domain: integers packed like the weight, or float
    ones (`rounding hqq`) in the scales' type, one per block unpacked, which the op takes as they are."""
    offset = _UNSIGNED_OFFSET.get(qw.qtype, 0)
    if np.issubdtype(qw.zero_point.dtype, np.floating):
        return np.ascontiguousarray((qw.zero_point + np.float32(offset)).T.astype(scale_type))
    zp = offset_bytes(qw.zero_point, offset).T
    return np.ascontiguousarray(pack_int4(zp) if qw.qtype.bits == 4 else zp)


def activation_nodes(tensor_name: str, scale: np.ndarray, zp: np.ndarray, qtype: QType,
                     scale_type=np.float32) -> tuple[list, list, str]:
    """QuantizeLinear/DequantizeLinear on an activation: (initializers, nodes, the dequantized tensor's name);
    the scale in `scale_type`, the activation's float type."""
    q, dq = f"{tensor_name}_QuantizeLinear", f"{tensor_name}_DequantizeLinear"
    inits = [tensor(f"{tensor_name}_scale", scale.astype(scale_type)),
             tensor(f"{tensor_name}_zero_point", zp.astype(qparams.np_type(qtype)))]
    names = [i.name for i in inits]
    nodes = [helper.make_node("QuantizeLinear", [tensor_name, *names], [f"{q}_output_0"], name=q),
             helper.make_node("DequantizeLinear", [f"{q}_output_0", *names], [f"{dq}_output_0"], name=dq)]
    return inits, nodes, f"{dq}_output_0"


@dataclass(frozen=True)
class Replacement:
    """What replaces one float weight: its new initializers and nodes. `output` is the dequantized weight
    every reader of the float weight reads instead (QDQ); None when `nodes` replace the node that read it
    (MatMulNBits)."""

    initializers: tuple[onnx.TensorProto, ...]
    nodes: tuple[onnx.NodeProto, ...]
    output: str | None


def replacement(node: onnx.NodeProto, weight: str, qw: QuantizedWeight, job: WeightJob, fmt: EmitFormat,
                accuracy_level: int = 0) -> Replacement:
    """The initializers and nodes of one rounded weight, for the (first) node that reads it; scales in the
    weight's own float type. Made as soon as the weight is rounded, so the rounded arrays need not wait
    for the rewrite (the emitter may move the initializers' bytes to the data file at once)."""
    scale_type = float_type(job.layer.dtype)
    if uses_matmul_nbits(fmt, node.op_type, job.scheme):
        inits, new = matmul_nbits(node, weight, qw, job.scheme.quantized_weights.symmetric, scale_type, accuracy_level)
        return Replacement(tuple(inits), (new,), None)
    inits, nodes, out = dequantize_nodes(node, weight, qw, scale_type)
    return Replacement(tuple(inits), tuple(nodes), out)


def rewrite(model: onnx.ModelProto, jobs: dict[str, WeightJob], replacements: dict[str, Replacement],
            activations: dict[str, tuple], kept: set[str], fmt: EmitFormat) -> onnx.ModelProto:
    """Rewrite `model` in place and return it. `jobs`: weight name → layer and scheme; `replacements`:
    weight name → what replaces it (`replacement`); `activations`: tensor → (scale, zero point, qtype,
    consumers) for the inputs of activation-quantized layers; `kept`: the float initializers that stay."""
    graph = model.graph
    new_inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []
    emitted_acts: dict[str, str] = {}
    replaced: dict[str, str] = {}  # float weight → its dequantized value (a shared weight is quantized once)
    for node in graph.node:
        weight = next((i for i in node.input if i in jobs), None)
        scale_type = float_type(jobs[weight].layer.dtype) if weight else np.float32
        node = _quantize_inputs(node, activations, emitted_acts, new_inits, nodes, scale_type)
        if weight is None:
            nodes.append(node)
            continue
        swap = replacements[weight]
        if swap.output is None:
            if weight in replaced:
                raise AssertionError(f"MatMulNBits weight {weight} is read by more than one node")
            replaced[weight] = ""
            new_inits += swap.initializers
            nodes += swap.nodes
            continue
        if weight not in replaced:
            new_inits += swap.initializers
            nodes += swap.nodes
            replaced[weight] = swap.output
        node.input[:] = [replaced.get(i, i) for i in node.input]
        nodes.append(node)
    used = {i for n in nodes for i in n.input}
    dropped = [t.name for t in graph.initializer if t.name in used and t.name not in kept and t.name not in jobs]
    if dropped:
        raise AssertionError(f"float initializer {dropped[0]} is neither kept nor quantized")
    remaining = [t for t in graph.initializer if t.name in used] + new_inits
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.initializer[:]
    graph.initializer.extend(remaining)
    if fmt is EmitFormat.MATMUL_NBITS and not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    return model


def quantize_for(w: np.ndarray, node: onnx.NodeProto, job: WeightJob) -> QuantizedWeight:
    """Round a weight for the node that reads it (its axes decide channels and groups)."""
    return _quantize(w, node, job)


SLICE_BYTES = 16 << 20  # float bytes of a weight rounded at once (cost.py charges this scratch)


def _quantize(w: np.ndarray, node: onnx.NodeProto, job: WeightJob) -> QuantizedWeight:
    """The weight rounded in slices of output channels on every core (the same bytes as in one piece, a
    fraction of the scratch memory), with the sums of its SQNR taken on the way."""
    channel, inp = weight_axes(node)
    return round_weight(w, job.scheme.quantized_weights, job.scheme.rounding, channel, inp, slice_bytes=SLICE_BYTES,
                        measure=True)


def _quantize_inputs(node, activations, emitted, new_inits, nodes, scale_type):
    for i, name in enumerate(node.input):
        spec = activations.get(name)
        if spec is None or node.name not in spec[3]:
            continue
        if name not in emitted:
            i_, n_, out = activation_nodes(name, spec[0], spec[1], spec[2], scale_type)
            new_inits += i_
            nodes += n_
            emitted[name] = out
        node.input[i] = emitted[name]
    return node


def activation_consumers(assignment: Assignment, model) -> dict[str, set[str]]:
    """For each activation to quantize, the nodes of the activation-quantized layers that read it."""
    by_weight: dict[str, list] = {}
    for node in model.graph.node:
        for name in node.input:
            by_weight.setdefault(name, []).append(node)
    out: dict[str, set[str]] = {}
    for a in assignment.layers:
        if a.scheme.is_none or a.scheme.activations is None:
            continue
        for node in by_weight.get(a.layer.weight, []):
            if a.layer.input in node.input:
                out.setdefault(a.layer.input, set()).add(node.name)
    return out
