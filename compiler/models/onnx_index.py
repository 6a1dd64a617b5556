"""Index an ONNX file without its weights: `load_external_data=False`, shapes from initializer headers."""

from __future__ import annotations

import math
from pathlib import Path

from compiler.models import names
from compiler.models.axes import Axis
from compiler.models.errors import ModelError
from compiler.models.graph import GraphSummary, summarize
from compiler.models.index import Layer, LayerKind, ModelFormat, ModelIndex, Norm, TensorInfo, norm_module
from compiler.models.onnx_write import INLINE_LIMIT, inline_size
from compiler.safe_files import read_json, regular_input

_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 6: "int32", 7: "int64", 9: "bool", 10: "float16", 11: "float64",
           16: "bfloat16", 17: "float8_e4m3fn", 19: "float8_e5m2", 21: "uint4", 22: "int4"}
_BITS = {"float32": 32, "uint8": 8, "int8": 8, "int32": 32, "int64": 64, "bool": 8, "float16": 16, "float64": 64,
         "bfloat16": 16, "float8_e4m3fn": 8, "float8_e5m2": 8, "uint4": 4, "int4": 4}


def index_onnx(path: Path, ref: str, family: str = "onnx") -> ModelIndex:
    """Index an .onnx file: layers from its weight-bearing nodes, inputs, outputs, graph shapes (no weights read)."""
    import onnx

    if not regular_input(path):  # a FIFO or a device would block onnx.load forever
        raise ModelError("Q250", f"`{ref}` is not a regular file (a FIFO, a socket or a device)",
                         "give the path of an .onnx file")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # onnx raises DecodeError, OSError, … for a file that is not a model
        raise ModelError("Q250", f"`{ref}` is not a readable ONNX model ({type(exc).__name__})",
                         "check the path; qrc reads .onnx files (external data is kept external)") from None
    _validate(model, path, ref)
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    layers = _unique(_layers(graph, inits))
    total = sum(math.prod(t.dims) * _BITS.get(_dtype(t.data_type), 32) // 8 for t in inits.values())
    inline = sum(size for t in inits.values() if (size := inline_size(t)) > INLINE_LIMIT)  # what open_model splits
    inputs = tuple(_tensor_info(v) for v in graph.input if v.name not in inits)
    outputs = tuple(_tensor_info(v) for v in graph.output)
    config = side_config(path.parent)
    return ModelIndex(ref, ModelFormat.ONNX, family, tuple(layers), inputs, outputs, total, config,
                      graph=graph_summary(model, config), norms=_norms(graph, inits),
                      opset=next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None),
                      inline_bytes=inline)


def graph_summary(model, config: tuple[tuple[str, int | float | str], ...]) -> GraphSummary:
    """The graph summary of `model` (its weights external or absent), with the axes its config fixes: what an index
    holds, and what a backend that changed the graph (onnx/rotation.py) takes again."""
    fixed = {axis: v for axis, key in ((Axis.HEADS, "num_key_value_heads"), (Axis.HEAD_DIM, "head_dim"))
             if isinstance(v := dict(config).get(key), int)}
    return summarize(_without_weights(model), {t.name for t in model.graph.initializer}, fixed)


# Nodes that apply a normalisation's weight (input 1 for the LayerNormalization family, either operand of Mul)
# and leave the weighted activations in output 0 (Skip… variants also return the residual sum, untouched).
_NORM_OPS = frozenset({"LayerNormalization", "SimplifiedLayerNormalization", "SkipLayerNormalization",
                       "SkipSimplifiedLayerNormalization", "Mul"})


def _norms(graph, inits) -> tuple[Norm, ...]:
    """Normalisations whose per-channel weight is an initializer named like one: the node applying it, its
    bias (LayerNormalization's input 2, or an Add of a 1-D initializer right after a Mul) and the value
    the result leaves in."""
    consumers: dict[str, list] = {}
    for node in graph.node:
        for value in node.input:
            consumers.setdefault(value, []).append(node)
    out = []
    for node in graph.node:
        if node.op_type not in _NORM_OPS:
            continue
        weight = next((v for v in node.input[:3] if _rank(inits.get(v)) == 1 and norm_module(v)
                       and len(consumers.get(v, [])) == 1), None)  # a weight several nodes share is no one norm's
        if weight is None or (node.op_type != "Mul" and node.input[1:2] != [weight] and node.input[2:3] != [weight]):
            continue
        bias, output = None, node.output[0]
        if node.op_type == "Mul":
            after = consumers.get(output, [])
            if len(after) == 1 and after[0].op_type == "Add" and any(_rank(inits.get(v)) == 1 for v in after[0].input):
                bias = next(v for v in after[0].input if _rank(inits.get(v)) == 1)
                output = after[0].output[0]
        elif node.op_type == "LayerNormalization" and len(node.input) > 2 and node.input[2]:
            bias = node.input[2]
        elif node.op_type == "SkipLayerNormalization" and len(node.input) > 3 and node.input[3]:
            bias = node.input[3]
        module = norm_module(weight)
        assert module is not None  # the weight was chosen for being a norm's
        out.append(Norm(module, weight, bias, inits[weight].dims[0], names.block_of(module), output))
    return tuple(out)


def side_config(folder: Path) -> tuple[tuple[str, int], ...]:
    """The architecture numbers exporters write next to the model: onnxruntime-genai's `genai_config.json`
    (the builder), else transformers' `config.json` (optimum, and qrc's own exports). A decoder's cache
    shape needs them where the graph leaves the head size symbolic."""
    genai = json_object(folder / "genai_config.json").get("model", {})
    decoder = genai.get("decoder", {}) if isinstance(genai, dict) else {}
    numbers: dict[str, object] = {}
    if isinstance(decoder, dict) and decoder:
        numbers = {"head_dim": decoder.get("head_size"), "hidden_size": decoder.get("hidden_size"),
                   "num_attention_heads": decoder.get("num_attention_heads"),
                   "num_key_value_heads": decoder.get("num_key_value_heads"),
                   "num_hidden_layers": decoder.get("num_hidden_layers"), "vocab_size": genai.get("vocab_size")}
    else:
        hf = json_object(folder / "config.json")
        hf = {**hf, **hf.get("text_config", {})} if isinstance(hf.get("text_config"), dict) else hf
        numbers = {k: hf.get(k) for k in ("head_dim", "hidden_size", "num_attention_heads", "num_key_value_heads",
                                          "num_hidden_layers", "vocab_size")}
    return tuple((k, v) for k, v in numbers.items() if isinstance(v, int) and not isinstance(v, bool) and v > 0)


def json_object(path: Path) -> dict:
    """A JSON object file, or {} when it is absent or not an object (the side file is optional)."""

    try:
        data = read_json(path, 64 << 20)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _validate(model, path: Path, ref: str) -> None:
    """onnx's own checker (graph order, dangling inputs, duplicate names, opsets, external data confined to
    the model's folder), then every external tensor's bytes exist: what onnxruntime would otherwise reject
    with a traceback halfway through a compile. Reads the graph and file sizes only."""
    import onnx

    try:
        _check_graph(model, path)
    except Exception as exc:  # ValidationError, and the checker's own errors on unreadable files
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError("Q250", f"`{ref}` is not a valid ONNX model: {first[:200]}",
                         "re-export the model; onnx.checker.check_model reports the same") from None
    for tensor in model.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            _check_external(tensor, path, ref)


# Operators onnxruntime registers in the standard ONNX domain although ONNX has no such operator: the
# model builders of onnxruntime-genai and optimum write them there. onnx's checker knows no schema for
# them; they are checked as what they are, onnxruntime's.
ORT_OPS_IN_ONNX_DOMAIN = frozenset({"SimplifiedLayerNormalization"})


def _check_graph(model, path: Path) -> None:
    import onnx

    if not any(n.op_type in ORT_OPS_IN_ONNX_DOMAIN and n.domain in ("", "ai.onnx") for n in model.graph.node):
        onnx.checker.check_model(str(path))
        return
    light = _without_weights(model)  # external data is checked by _check_external, in the model's folder
    for node in light.graph.node:
        if node.op_type in ORT_OPS_IN_ONNX_DOMAIN and node.domain in ("", "ai.onnx"):
            node.domain = "com.microsoft"
    if not any(o.domain == "com.microsoft" for o in light.opset_import):
        light.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    onnx.checker.check_model(light)


def _check_external(tensor, path: Path, ref: str) -> None:
    info = {e.key: e.value for e in tensor.external_data}
    data = path.parent / info.get("location", "")
    if not data.resolve().is_relative_to(path.parent.resolve()):
        raise ModelError("Q250", f"`{ref}`: the external data of `{tensor.name}` is outside the model's folder "
                         f"(`{info.get('location')}`)", "keep the data file next to the model")
    end = int(info.get("offset", 0) or 0) + int(info.get("length", 0) or 0)
    size = data.stat().st_size if data.is_file() else -1
    if size < end:
        raise ModelError("Q250", f"`{ref}`: the external data of `{tensor.name}` ends at byte {end:,} of "
                         f"`{info.get('location')}`, which has {max(size, 0):,} bytes", "the data file is truncated: "
                         "copy it again next to the model")


_SMALL = 4096  # elements: constants such as Reshape targets and axes, which shape inference reads


def _without_weights(model):
    """A copy without the bytes of large initializers (weights): cheap to shape-infer. Their dims stay,
    as graph inputs, so inference still knows their shapes."""
    import onnx

    light = onnx.ModelProto()
    light.CopyFrom(model)
    kept = []
    for tensor in light.graph.initializer:
        if math.prod(tensor.dims) <= _SMALL and tensor.data_location != onnx.TensorProto.EXTERNAL:
            kept.append(tensor)
            continue
        light.graph.input.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims)))
    del light.graph.initializer[:]
    light.graph.initializer.extend(kept)
    return light





def _dtype(code: int) -> str:
    return _DTYPES.get(code, f"onnx-type-{code}")


def _layers(graph, inits) -> list[Layer]:
    layers = []
    for node in graph.node:
        found = _weight_of(node, inits)
        if found is None:
            continue
        kind, weight, in_f, out_f = found
        name = names.from_weight_name(weight.name) or names.from_node_name(node.name) or weight.name
        activation = node.input[1] if kind is LayerKind.EMBEDDING else node.input[0]
        layers.append(Layer(name, kind, node.op_type, weight.name, activation, tuple(weight.dims),
                            _dtype(weight.data_type), in_f, out_f, names.block_of(name)))
    return layers


def _weight_of(node, inits):
    """(kind, weight, in_features, out_features) for a weight-bearing node, else None."""
    if node.op_type == "MatMul" and len(node.input) > 1 and _rank(inits.get(node.input[1])) == 2:
        w = inits[node.input[1]]
        return LayerKind.LINEAR, w, w.dims[0], w.dims[1]
    if node.op_type == "Gemm" and _rank(inits.get(node.input[1])) == 2:
        w = inits[node.input[1]]
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        return (LayerKind.LINEAR, w, w.dims[1], w.dims[0]) if trans_b else (LayerKind.LINEAR, w, w.dims[0], w.dims[1])
    if node.op_type == "Conv" and _rank(inits.get(node.input[1])) >= 3:
        w = inits[node.input[1]]
        return LayerKind.CONV, w, math.prod(w.dims[1:]), w.dims[0]
    if node.op_type == "Gather" and _rank(inits.get(node.input[0])) == 2:
        w = inits[node.input[0]]
        return LayerKind.EMBEDDING, w, w.dims[0], w.dims[1]
    return None


def _rank(tensor) -> int:
    return len(tensor.dims) if tensor is not None else -1


def _unique(layers: list[Layer]) -> list[Layer]:
    """Two nodes that normalise to one name (a shared weight) keep distinct names: `name`, `name.1`."""
    seen: dict[str, int] = {}
    out = []
    for layer in layers:
        count = seen.get(layer.name, 0)
        seen[layer.name] = count + 1
        if count:
            from dataclasses import replace

            layer = replace(layer, name=f"{layer.name}.{count}")
        out.append(layer)
    return out


def _tensor_info(value) -> TensorInfo:
    t = value.type.tensor_type
    dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim)
    return TensorInfo(value.name, _dtype(t.elem_type), dims)
