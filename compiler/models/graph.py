"""A compact, weight-free summary of an ONNX graph for the memory model: values with symbolic shapes,
nodes in execution order, and which values are weights, graph inputs and graph outputs."""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
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

    def resolved(self, sizes: Mapping[str, int]) -> tuple[int, ...]:
        """The dims as numbers (every dim bound: see `bound`)."""
        return tuple(_size(d, sizes) or 0 for d in self.dims or ())

    def bound(self, sizes: Mapping[str, int]) -> bool:
        """Whether every dim is a number or a symbol `sizes` binds (nothing left to guess)."""
        return self.dims is not None and all(_size(d, sizes) is not None for d in self.dims)


def _size(dim: int | str | None, sizes: Mapping[str, int]) -> int | None:
    """A dim's size: a number, a symbol `sizes` binds, sums and products of those (torch.onnx names an
    attention's key length `past_sequence_length + sequence`), else None (unknown)."""
    if isinstance(dim, int):
        return dim
    if not dim:
        return None
    bound = sizes.get(dim)
    return bound if bound is not None else _arithmetic(dim, sizes)


_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}


@lru_cache(maxsize=1024)
def _parsed(dim: str) -> ast.expr | None:
    """A dim's text parsed as a Python expression (the walks ask for the same few thousand dims many times)."""
    try:
        return ast.parse(dim, mode="eval").body
    except SyntaxError:
        return None


def _arithmetic(dim: str, sizes: Mapping[str, int]) -> int | None:
    """A symbolic dim written as integer arithmetic (+, -, *, //) over symbols `sizes` binds, evaluated; None
    for any other text. Read as a whole, such a dim once counted as 1, so the scores of torch.onnx's explicit
    attention (8 × 9 × 512 × 512 floats for the real SmolLM2's calibration chunk) counted 1/512 of their bytes."""
    if not any(sign in dim for sign in "+-*/"):  # a plain name (`unk__20`): nothing to evaluate, nothing parsed
        return None
    tree = _parsed(dim)
    if tree is None:
        return None

    def value(node: ast.expr) -> int | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            return sizes.get(node.id)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            left, right = value(node.left), value(node.right)
            if left is None or right is None or (isinstance(node.op, ast.FloorDiv) and right == 0):
                return None
            return _OPERATORS[type(node.op)](left, right)
        return None

    result = value(tree)
    return result if result is not None and result >= 0 else None


# Ops whose output has as many elements as their first input (reshapes, permutations, unary maps), the
# ones with at most as many (slices), those that broadcast their inputs, and Concat (the sum): what sizes
# a value whose dims shape inference could not name (a Reshape to a computed shape: `unk__20`).
_SAME_COUNT = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Cast", "Neg",
                         "Sqrt", "Exp", "Log", "Sigmoid", "Tanh", "Relu", "Erf", "Softmax", "Abs", "Reciprocal",
                         "Cos", "Sin", "Gelu", "FastGelu", "Dropout", "LayerNormalization",
                         "SimplifiedLayerNormalization", "RotaryEmbedding", "IsNaN", "Not", "Softplus"})
_SAME_SHAPE = _SAME_COUNT - {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten"}
_AT_MOST_FIRST = frozenset({"Slice", "Split"})
_BROADCAST = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Where", "Max", "Min", "Equal", "Less", "Greater",
                        "LessOrEqual", "GreaterOrEqual", "And", "Or"})


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

    def value_bytes(self, sizes: Mapping[str, int], default: int) -> dict[str, int]:
        """Every value's bytes at a binding. Where shape inference left a dim unnamed, the value's shape comes
        from its producer's inputs where the op tells (elementwise ops, MatMul, Expand), or its element count
        does (a Reshape keeps it; one unknown dim is then solved, and the symbol learned for every value that
        shares it); only what stays unknown counts as `default` (Value.bytes). Reading the four unnamed dims
        of an attention reshape as the sequence length made a 1 MiB tensor 1 GiB."""
        key = (tuple(sorted(sizes.items())), default)
        cached = self._bytes_cache.get(key)
        if cached is not None:
            return cached
        known = dict(sizes)
        shapes = {v.name: v.resolved(known) for v in self.values if v.bound(known)}
        counts = {name: math.prod(shape) for name, shape in shapes.items()}
        for node in self.nodes:
            given = [shapes.get(i) for i in node.inputs]
            for name in node.outputs:
                value = self._by_name.get(name)
                if value is None:
                    continue
                shape = value.resolved(known) if value.bound(known) else \
                    _merged(value, known, _propagated_shape(node, given))
                count = math.prod(shape) if shape is not None else \
                    _propagated(node, [counts[i] for i in node.inputs if i in counts])
                if shape is None and count is not None:
                    shape = _solved(value, known, count)
                if shape is not None:
                    shapes[name] = shape
                    known.update(_learned(value, shape, known))
                if count is not None:
                    counts[name] = count
        out = {v.name: counts[v.name] * v.elem_bytes if v.name in counts else v.bytes(known, default)
               for v in self.values}
        self._bytes_cache[key] = out
        return out

    @cached_property
    def _bytes_cache(self) -> dict:
        return {}

    def producers(self) -> dict[str, Node]:
        """Each value's producing node."""
        return {out: node for node in self.nodes for out in node.outputs}


def _propagated_shape(node: Node, given: list[tuple[int, ...] | None]) -> tuple[int | None, ...] | None:
    """The output shape of `node` from its inputs' shapes (None where unknown), where the op tells."""
    first = given[0] if given else None
    if node.op in _SAME_SHAPE:
        return first
    if node.op in _BROADCAST:
        known = [g for g in given if g is not None]
        if not known:
            return None
        rank = max(len(g) for g in known)
        padded = [(1,) * (rank - len(g)) + g for g in known]
        return tuple(max(column) for column in zip(*padded, strict=True))
    if node.op == "Expand" and first is not None:
        # broadcast to a computed shape: a dim it expands from 1 that inference left unnamed is taken as 1, so
        # GQA's repeated key/value heads count heads/kv_heads times too little (one block's, not 128× too much)
        return first
    if node.op == "MatMul" and first is not None and len(first) >= 2:
        other = given[1] if len(given) > 1 else None
        if other is None or len(other) < 2:  # a weight: the output keeps A's leading dims and rows
            return (*first[:-1], None)
        lead = max(first[:-2], other[:-2], key=len)
        return (*lead, first[-2], other[-1])
    return None


def _merged(value: Value, sizes: Mapping[str, int], propagated: tuple[int | None, ...] | None) -> tuple[int, ...] | None:
    """`value`'s shape: its own numbers and bound symbols, the propagated dims where it has none; None when
    a dim stays unknown."""
    if value.dims is None or propagated is None or len(propagated) != len(value.dims):
        return None
    shape = [_size(own, sizes) for own in value.dims]
    merged = [n if n is not None else guess for n, guess in zip(shape, propagated, strict=True)]
    return None if None in merged else tuple(n for n in merged if n is not None)


def _solved(value: Value, sizes: Mapping[str, int], count: int) -> tuple[int, ...] | None:
    """`value`'s shape when exactly one of its dims is unknown and its element count is known."""
    known = [_size(d, sizes) for d in value.dims or ()]
    if known.count(None) != 1:
        return None
    rest = math.prod(n for n in known if n is not None)
    if rest <= 0 or count % rest:
        return None
    return tuple(count // rest if n is None else n for n in known)


def _learned(value: Value, shape: tuple[int, ...], sizes: Mapping[str, int]) -> dict[str, int]:
    """The sizes of `value`'s symbols that `sizes` did not bind, now that its shape is known."""
    return {d: n for d, n in zip(value.dims or (), shape, strict=True) if isinstance(d, str) and d and d not in sizes}


def _propagated(node: Node, counts: list[int]) -> int | None:
    """The element count of `node`'s output from its inputs' counts (those known), where the op tells."""
    if not counts:
        return None
    if node.op in _SAME_COUNT or node.op in _AT_MOST_FIRST:
        return counts[0]
    if node.op in _BROADCAST:
        return max(counts)
    if node.op == "Concat":
        return sum(counts)
    return None


def summarize(model, weights: set[str], fixed: Mapping[Axis, int] | None = None) -> GraphSummary:
    """Shape-infer a weight-free ModelProto copy and keep what the memory model needs.

    `weights` are the initializer names (in the light copy some are graph inputs, kept only for shapes);
    `fixed` gives axes the model's config knows (key/value heads, head size) where the graph is symbolic.
    """
    import onnx

    inferred = model  # a graph the shape inference cannot handle still gets a (shapeless) summary
    for data_prop in (True, False):  # data_prop computes Reshape targets from Shape/Gather/Concat chains
        try:
            inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=data_prop)
            break
        except Exception:  # noqa: S112  # retried without data propagation, then shapeless
            continue
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
