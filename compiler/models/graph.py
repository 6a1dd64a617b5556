"""A compact, weight-free summary of an ONNX graph for the memory model: values with symbolic shapes,
nodes in execution order, and which values are weights, graph inputs and graph outputs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import SimpleNamespace

from compiler.models.axes import Axis, axes_of

_ELEM_BYTES = {1: 4, 2: 1, 3: 1, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 16: 2, 17: 1, 19: 1}


@dataclass(frozen=True, slots=True)
class Value:
    """A value of the graph: dtype, dims (ints or symbols), producer."""
    name: str
    elem_bytes: int
    dims: tuple[int | str | None, ...] | None  # None: rank unknown; a str is symbolic, None unknown
    elem_type: int = 1  # onnx.TensorProto data type

    def bytes(self, sizes: Mapping[str, int], default: int) -> int:
        """Bytes at a binding: a symbol in `sizes` takes its size there, any other symbolic or unknown dim
        `default` (the sequence length: what shape inference leaves unnamed is mostly a sequence)."""
        if self.dims is None:
            return 0
        n = self.elem_bytes
        for d in self.dims:
            n *= d if isinstance(d, int) else sizes.get(d or "", default)
        return n


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
    symbols: tuple[tuple[str, Axis | int], ...] = field(default=())  # the inputs' symbolic dims by meaning

    @property
    def batch_symbol(self) -> str:
        """The symbol of the batch axis (`batch` when the inputs name none)."""
        return next((s for s, meaning in self.symbols if meaning is Axis.BATCH), "batch")

    def sizes(self, batch: int, seqlen: int, past: int = 0) -> dict[str, int]:
        """Every known symbol's size for `batch` samples of `seqlen` new tokens after `past` cached ones."""
        by_axis = {Axis.BATCH: batch, Axis.SEQUENCE: seqlen, Axis.PAST: past, Axis.TOTAL: past + seqlen}
        return {s: (m if isinstance(m, int) else by_axis.get(m, seqlen)) for s, m in self.symbols}

    def value(self, name: str) -> Value | None:
        """The value named `name`, if the graph has it."""
        return self._by_name.get(name)

    @cached_property
    def _by_name(self) -> dict[str, Value]:
        return {v.name: v for v in self.values}

    def producers(self) -> dict[str, Node]:
        """Each value's producing node."""
        return {out: node for node in self.nodes for out in node.outputs}


def summarize(model, weights: set[str], fixed: Mapping[Axis, int] | None = None) -> GraphSummary:
    """Shape-infer a weight-free ModelProto copy and keep what the memory model needs.

    `weights` are the initializer names (in the light copy some are graph inputs, kept only for shapes);
    `fixed` gives axes the model's config knows (key/value heads, head size) where the graph is symbolic.
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
    symbols = _symbols([values[i] for i in inputs if i in values], fixed or {})
    return GraphSummary(tuple(values.values()), nodes, inputs, tuple(o.name for o in graph.output), symbols)


_FLOAT_TYPES = {1: "float32", 10: "float16", 16: "bfloat16", 11: "float64"}


def _symbols(inputs: list[Value], fixed: Mapping[Axis, int]) -> tuple[tuple[str, Axis | int], ...]:
    """Each symbolic dim of the graph inputs → what it counts (the first input naming it decides)."""
    found: dict[str, Axis | int] = {}
    for value in inputs:
        info = SimpleNamespace(name=value.name, dtype=_FLOAT_TYPES.get(value.elem_type, "int"), shape=value.dims or ())
        for dim, meaning in zip(value.dims or (), axes_of(info), strict=True):
            if isinstance(dim, str):
                found.setdefault(dim, fixed.get(meaning, meaning))
    return tuple(found.items())
