"""A compact, weight-free summary of an ONNX graph for the memory model: values with symbolic shapes,
nodes in execution order, and which values are weights, graph inputs and graph outputs."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

_ELEM_BYTES = {1: 4, 2: 1, 3: 1, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 16: 2, 17: 1, 19: 1}


@dataclass(frozen=True, slots=True)
class Value:
    """A value of the graph: dtype, dims (ints or symbols), producer."""
    name: str
    elem_bytes: int
    dims: tuple[int | str | None, ...] | None  # None: rank unknown; a str is symbolic, None unknown
    elem_type: int = 1  # onnx.TensorProto data type

    def bytes(self, batch: int, seqlen: int, batch_symbol: str) -> int:
        """Bytes at a binding: the batch symbol → `batch`, every other symbolic or unknown dim → `seqlen`."""
        if self.dims is None:
            return 0
        n = self.elem_bytes
        for d in self.dims:
            n *= batch if d == batch_symbol else (d if isinstance(d, int) else seqlen)
        return n

    def scales_with_batch(self, batch_symbol: str) -> bool:
        """Whether its first dim is the batch."""
        return self.dims is not None and batch_symbol in self.dims


@dataclass(frozen=True, slots=True)
class Node:
    """A node: its op, inputs and outputs."""
    name: str
    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class GraphSummary:
    """What the memory model needs of an ONNX graph: values with shapes, and nodes in order."""
    values: tuple[Value, ...]
    nodes: tuple[Node, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    batch_symbol: str

    def value(self, name: str) -> Value | None:
        """The value named `name`, if the graph has it."""
        return self._by_name.get(name)

    @cached_property
    def _by_name(self) -> dict[str, Value]:
        return {v.name: v for v in self.values}

    def producers(self) -> dict[str, Node]:
        """Each value's producing node."""
        return {out: node for node in self.nodes for out in node.outputs}


def summarize(model, weights: set[str]) -> GraphSummary:
    """Shape-infer a weight-free ModelProto copy and keep what the memory model needs.

    `weights` are the initializer names (in the light copy some are graph inputs, kept only for shapes).
    """
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # a graph the shape inference cannot handle still gets a (shapeless) summary
        inferred = model
    graph = inferred.graph
    weights = weights | {t.name for t in graph.initializer}
    values = {}
    for info in list(graph.input) + list(graph.value_info) + list(graph.output):
        if info.name in weights or not info.type.HasField("tensor_type"):
            continue
        t = info.type.tensor_type
        dims = None
        if t.HasField("shape"):
            dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim)
        values[info.name] = Value(info.name, _ELEM_BYTES.get(t.elem_type, 4), dims, t.elem_type)
    nodes = tuple(Node(n.name, n.op_type, tuple(n.input), tuple(n.output)) for n in graph.node)
    inputs = tuple(i.name for i in graph.input if i.name not in weights)
    first = values.get(inputs[0]) if inputs else None
    batch = first.dims[0] if first and first.dims and isinstance(first.dims[0], str) else "batch"
    return GraphSummary(tuple(values.values()), nodes, inputs, tuple(o.name for o in graph.output), batch)
