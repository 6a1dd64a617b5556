"""Whether an emitted ONNX model loads where it is served, checked before it goes into place (Q425): opened in
onnxruntime, or, for a model too large to hold (offload), its quantization nodes checked against the opset's
schemas without reading a weight."""

from __future__ import annotations

from pathlib import Path

import onnx

from compiler.backends import BackendError
from compiler.diagnostics import error
from compiler.source import Span


def check_emitted(staged: Path | bytes, span: Span | None, offload: bool) -> None:
    """The staged model (its file, or the bytes being written to it) opens in onnxruntime, or the compile stops
    with Q425 and nothing is written. In offload
    (a model too large to hold) the quantization nodes qrc wrote are checked against the schemas of the
    model's opset instead, without reading a weight. (ONNX's own checker is no substitute: it refuses the
    onnxruntime-only ops exporters write in the default domain, such as SimplifiedLayerNormalization.)"""
    if offload:
        light = (onnx.load_model_from_string(staged) if isinstance(staged, bytes)
                 else onnx.load(str(staged), load_external_data=False))
        problem = _unschematic_node(light)
    else:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        # each kernel is still created (its attributes and weight shapes checked), but not prepacked: packing
        # MatMulNBits' blocks for MLAS took 0.3 s of the real SmolLM2 int4's 0.55 s check, and a session that
        # loads packs them again anyway
        options.add_session_config_entry("session.disable_prepacking", "1")
        no_kernel = ort.capi.onnxruntime_pybind11_state.NotImplemented
        try:
            ort.InferenceSession(staged if isinstance(staged, bytes) else str(staged), options,
                                 providers=["CPUExecutionProvider"])
            problem = None
        except no_kernel:  # a valid model the CPU provider has no kernel for (bfloat16 graphs): served elsewhere
            problem = None
        except Exception as exc:  # onnxruntime raises its own exception types for a model it cannot load
            problem = str(exc).strip().splitlines()[0]
    if problem:
        raise BackendError(error("Q425", f"the emitted model would not load in onnxruntime: {problem}",
                                 span, "invalid output",
                                 help="this is a qrc bug; please report it with the recipe. Nothing was written "
                                 "to the destination"))


def _unschematic_node(model: onnx.ModelProto) -> str | None:
    """The first QuantizeLinear/DequantizeLinear whose attributes or quantized type the model's opset does not
    define (what onnxruntime refuses when it loads the model), described; None when all are defined."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None:
        return None
    types = {t.name: t.data_type for t in model.graph.initializer}
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx") or node.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            continue
        schema = onnx.defs.get_schema(node.op_type, opset, "")
        unknown = [a.name for a in node.attribute if a.name not in schema.attributes]
        if unknown:
            return f"{node.op_type} `{node.name}` has `{unknown[0]}`, which opset {opset} does not define"
        quantized = node.input[0] if node.op_type == "DequantizeLinear" else None
        if quantized in types:
            allowed = {c for tc in schema.type_constraints for c in tc.allowed_type_strs}
            name = onnx.helper.tensor_dtype_to_np_dtype(types[quantized]).name
            if f"tensor({name})" not in allowed:
                return f"{node.op_type} `{node.name}` reads {name}, which opset {opset} does not take"
    return None
