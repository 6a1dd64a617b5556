"""Canonical text of an ONNX model, for goldens (docs/development.md, "Golden files"): sorted opsets, no
producer fields, nodes in a canonical topological order, sorted attributes, integer tensors by hash, float
tensors by summary. The scales and zero points of activations (what QuantizeLinear nodes read) are measured on
calibration data through onnxruntime: they are written `~x`, which tests/golden.py compares within a
tolerance."""

from __future__ import annotations

import hashlib
import heapq

import numpy as np
import onnx
from onnx import helper, numpy_helper

from compiler.canonical import TINY, fmt


def dump(model: onnx.ModelProto, base_dir: str | None = None) -> str:
    """The canonical text of `model` (goldens): stable order, tensors by hash or summary."""
    g = model.graph
    lines = [f"ir_version {model.ir_version}",
             "opsets " + ", ".join(f"{o.domain or 'ai.onnx'}:{o.version}" for o in sorted(model.opset_import, key=lambda o: o.domain)),
             "metadata " + ", ".join(f"{p.key}={p.value}" for p in sorted(model.metadata_props, key=lambda p: p.key))]
    lines += ["inputs"] + [f"  {_value(v)}" for v in g.input]
    lines += ["outputs"] + [f"  {_value(v)}" for v in g.output]
    lines += ["nodes"] + [f"  {_node(n)}" for n in _topological(g)]
    calibrated = {x for n in g.node if n.op_type == "QuantizeLinear" for x in n.input[1:]}
    lines += ["initializers"] + [f"  {_tensor(t, base_dir, t.name in calibrated)}"
                                 for t in sorted(g.initializer, key=lambda t: t.name)]
    return "\n".join(lines) + "\n"


def _value(v: onnx.ValueInfoProto) -> str:
    t = v.type.tensor_type
    dims = ", ".join(str(d.dim_value) if d.HasField("dim_value") else d.dim_param for d in t.shape.dim)
    return f"{v.name}: {helper.tensor_dtype_to_np_dtype(t.elem_type).name}[{dims}]"


def _node(n: onnx.NodeProto) -> str:
    attrs = ", ".join(f"{a.name}={_attr(a)}" for a in sorted(n.attribute, key=lambda a: a.name))
    domain = f"{n.domain}." if n.domain else ""
    return (f"{n.name} = {domain}{n.op_type}({', '.join(n.input)})" + (f" {{{attrs}}}" if attrs else "")
            + f" -> {', '.join(n.output)}")


def _attr(a: onnx.AttributeProto) -> str:
    value = helper.get_attribute_value(a)
    if isinstance(value, float):
        return fmt(value)
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, list):
        return "[" + ", ".join(fmt(v) if isinstance(v, float) else str(v) for v in value) + "]"
    return str(value)


def _topological(g: onnx.GraphProto) -> list[onnx.NodeProto]:
    """Kahn's algorithm, always taking the ready node that comes first in the file: a stable order."""
    producer = {o: i for i, n in enumerate(g.node) for o in n.output}
    deps = [{producer[x] for x in n.input if x in producer} for n in g.node]
    users: dict[int, list[int]] = {}
    for i, d in enumerate(deps):
        for j in d:
            users.setdefault(j, []).append(i)
    remaining = [len(d) for d in deps]
    ready = [i for i, r in enumerate(remaining) if r == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(g.node[i])
        for j in users.get(i, []):
            remaining[j] -= 1
            if remaining[j] == 0:
                heapq.heappush(ready, j)
    return order


def _tensor(t: onnx.TensorProto, base_dir: str | None, calibrated: bool) -> str:
    arr = numpy_helper.to_array(t, base_dir=base_dir or "")
    head = f"{t.name}: {helper.tensor_dtype_to_np_dtype(t.data_type).name}[{', '.join(map(str, t.dims))}]"
    mark = "~" if calibrated else ""
    if arr.size <= TINY:
        return head + " = [" + ", ".join(mark + (fmt(v) if arr.dtype.kind == "f" else str(int(v))) for v in arr.ravel()) + "]"
    if arr.dtype.kind == "f":
        a = arr.astype(np.float64)
        return head + f" min={mark}{fmt(a.min())} max={mark}{fmt(a.max())} mean={mark}{fmt(a.mean())}"
    return head + " sha256:" + hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()[:16]
