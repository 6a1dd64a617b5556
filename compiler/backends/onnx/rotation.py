"""QuaRot's rotations on the ONNX backend (docs/onnx.md, Rotations): the torch backend's R1, R2 and R4 (same seeds,
same matrices: compiler/quant/rotations.py), on a copy of the graph made before anything is calibrated or rounded.

- R1 and R2 are folded into the initializers (onnx/rotation_structure.py says which): each norm's weights go into
  the layers reading its output, which take W·Q, the embedding E·Q, the layers writing the residual stream Qᵀ·W;
  v_proj's columns of each head Hᵀ, o_proj's rows of each head H. The norms' weights become ones. A tied head is
  untied: the final norm folds into a head tensor of its own (`lm_head.weight`, float), the embedding's transpose
  it read goes.
- R4 runs in the graph, where no rotation can be folded (the SiLU product before each down projection): the down
  projection's input x becomes x·D before it, in standard ops (a sign Mul, then the Hadamard as two small MatMuls,
  Aᵀ·X·C for x read as blocks of a×c with F = A ⊗ C: n·(a + c) products a token, 1536 · 200 for SmolLM2's), and the
  down projection's weight takes W·D. Its input keeps its name, so its observers, GPTQ's Hessian and its input
  quantizer read the rotated values.

The copy is written one initializer at a time (onnx/smoothing.py's rewrite): what rotating holds is one tensor in
float32, its rotated copy and the factors (onnx/cost.py counts it). Calibration, rounding, emission and
verification then run on it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from compiler.backends import BackendError
from compiler.backends.onnx.calibrate import first_output
from compiler.backends.onnx.files import ModelFiles
from compiler.backends.onnx.rewrite import weight_axes, weight_nodes
from compiler.backends.onnx.rotation_structure import Downs, Fold, downs_of, fold_of
from compiler.backends.onnx.smoothing import Rewrite, chain, rewrite_initializers
from compiler.backends.result import FOLD_TOLERANCE, output_change
from compiler.data.batches import probe_feed
from compiler.diagnostics import error
from compiler.ir.types import OnlineRotation, Transform
from compiler.models.index import ModelIndex
from compiler.quant.rotations import SLICE, Turn, random_hadamard
from compiler.resolve.rotation_widths import down_width

HEAD = "lm_head.weight"  # a tied head's own tensor once untied
EMBEDDING = "model.embed_tokens.weight"  # an embedding's own tensor, untied from the head it gathered from
ONLINE = "qrc.online_r4"  # the prefix of the online rotation's initializers and nodes


@dataclass(frozen=True)
class Rotations:
    """Q (R1), H (R2, None: values not rotated) and D (R4, None: no online rotation), from one seed: Q from it, H
    from seed + 1, D from seed + 2, as the torch backend draws them."""

    q: Turn
    h: np.ndarray | None
    d: Turn | None
    down_width: int = 0  # the down projections' input width D turns (a multiple of its order: block-diagonal)

    @classmethod
    def seeded(cls, hidden: int, head: int | None, down: int | None, block: int | None, seed: int = 0) -> Rotations:
        """The rotations of these widths (`block`: Q and D block-diagonal with blocks of that order)."""
        h = random_hadamard(head, seed + 1).astype(np.float32) if head else None
        return cls(Turn.seeded(block or hidden, seed), h, Turn.seeded(block or down, seed + 2) if down else None,
                   down or 0)


Rows = Callable[[np.ndarray, np.ndarray], None]  # (the weight as [out, in] float32 rows, where its result goes)


@dataclass(frozen=True)
class _Computed:
    """A rewrite by `rows`, which reads the weight as [out, in] float32 rows and writes its result into a float32
    buffer of the initializer's stored layout (its input axis `axis`) seen alike: no transposed copy of the result
    is made before it is written."""

    rows: Rows
    axis: int

    def apply(self, values: np.ndarray) -> np.ndarray:
        as_rows = values.astype(np.float32, copy=False)
        out = np.empty(values.shape, np.float32)
        self.rows(as_rows if self.axis == 1 else as_rows.T, out if self.axis == 1 else out.T)
        return out.astype(values.dtype, copy=False)


@dataclass(frozen=True)
class _Vector:
    """A rewrite of a bias by `turn`, in float32, read back in its own dtype."""

    turn: Callable[[np.ndarray], np.ndarray]

    def apply(self, values: np.ndarray) -> np.ndarray:
        return self.turn(values.astype(np.float32)).astype(values.dtype)


def _bias_turn(q: Turn, heads: np.ndarray | None, value_rows: int) -> Callable[[np.ndarray], np.ndarray]:
    """A writer's bias (value_rows -1) turns with the stream, b·Q; v's (the last `value_rows` of a fused qkv's) with
    each head's values, b·H per head (R2), as their weights' rows do."""
    def turn(bias: np.ndarray) -> np.ndarray:
        if value_rows < 0:
            return q.right(bias[None, :])[0]
        if heads is None:
            return bias
        first = bias.shape[0] - value_rows
        bias[first:] = (bias[first:].reshape(-1, heads.shape[0]) @ heads).reshape(-1)
        return bias
    return turn


@dataclass(frozen=True)
class _Ones:
    """A folded norm's weight."""

    def apply(self, values: np.ndarray) -> np.ndarray:
        return np.ones_like(values)


def rotate(files: ModelFiles, fold: Fold, rotations: Rotations, where: Path | None = None) -> ModelFiles:
    """The rotated copy of the model `files` holds (onnx/rotation_structure.py's `fold` of it), written under
    `where` (the recipe's `memory { disk }`; else the temporary folder)."""
    inits = {t.name: t for t in files.light.graph.initializer}
    weights = {w for w, _ in fold.readers} | set(fold.writers) | ({fold.head} if fold.head else set())
    axes = {name: weight_axes(node)[1] for node, name in weight_nodes(files.light, weights)}
    gammas: dict[str, np.ndarray] = {}

    def gamma(name: str) -> np.ndarray:
        if name not in gammas:
            gammas[name] = files.array(inits[name]).astype(np.float32)
        return gammas[name]

    q, h, d = rotations.q, rotations.h, rotations.d
    plan: dict = {name: _Ones() for name in fold.norms}
    values = dict(fold.values)
    for weight, norm in fold.readers:
        plan[weight] = _Computed(_reader(q, partial(gamma, norm), h if weight in values else None,
                                         values.get(weight, 0)), axes[weight])
    for weight in fold.writers:
        plan[weight] = _Computed(_writer(q, h if weight in fold.heads_in else None,
                                         d if weight in fold.downs else None), axes[weight])
    for bias, value_rows in fold.biases:
        plan[bias] = _Vector(_bias_turn(q, h, value_rows))
    added: dict[str, Callable[[], np.ndarray]] = {}
    if fold.gather is None:
        plan[fold.embedding] = _Computed(lambda rows, out: _sliced(rows, q.right, out), 1)
    else:  # the embedding gathered from the head's transpose gets a tensor of its own, rotated
        source = inits[fold.embedding]

        def own_embedding() -> np.ndarray:  # [vocab, hidden], from the head's [hidden, vocab]
            stored = files.array(source)
            out = np.empty(stored.shape[::-1], np.float32)
            _sliced(stored.astype(np.float32, copy=False).T, q.right, out)
            return out.astype(stored.dtype, copy=False)
        added[EMBEDDING] = own_embedding
    head = _reader(q, partial(gamma, fold.final_norm), None)
    if fold.head is not None:
        plan[fold.head] = _Computed(head, axes[fold.head])
    else:  # the head's own tensor, [in, out] as the MatMul reads it
        embedding = inits[fold.embedding]

        def untied() -> np.ndarray:  # [hidden, vocab], from the embedding's [vocab, hidden]
            rows = files.array(embedding)
            out = np.empty(rows.shape[::-1], np.float32)
            head(rows.astype(np.float32, copy=False), out.T)
            return out.astype(rows.dtype, copy=False)
        added[HEAD] = untied
    dtype = helper.tensor_dtype_to_np_dtype(inits[fold.writers[0]].data_type) if fold.writers else np.float32

    def edit(model: onnx.ModelProto) -> None:
        if fold.head is None:
            _untie(model, fold.head_node)
        if fold.gather is not None:
            _untie(model, fold.gather, EMBEDDING, 0)
        if d is not None:
            _online(model, fold.down_inputs, d, rotations.down_width, dtype)

    return rewrite_initializers(files, plan, added, edit, "rotated", where)


@dataclass(frozen=True)
class OnlineDown:
    """R4 alone, after SmoothQuant's fold (`transform smoothquant { online r4 }`, docs/onnx.md): each down
    projection's weight W·diag(s) (the smoothing's rewrite, if any) then ·D, and its input turned by D in the graph
    as QuaRot's R4 is (`_online`). D is the torch backend's for the same seed (seed + 2), so both backends write the
    same rotation. Given to the smoothing (onnx/smoothing.py), which writes one copy with both."""

    downs: Downs
    d: Turn

    @classmethod
    def seeded(cls, downs: Downs, width: int, seed: int = 0) -> OnlineDown:
        """D of the down projections' input `width`."""
        return cls(downs, Turn.seeded(width, seed + 2))

    def planned(self, plan: Mapping[str, Rewrite], light: onnx.ModelProto) -> dict[str, Rewrite]:
        """`plan` with each down projection's rewrite followed by ·D on its input axis."""
        axes = {name: weight_axes(node)[1] for node, name in weight_nodes(light, set(self.downs.weights))}
        turn = _Computed(lambda w, out: _sliced(w, self.d.right, out), 0)
        out: dict[str, Rewrite] = dict(plan)
        for weight in self.downs.weights:
            chain(out, weight, replace(turn, axis=axes[weight]))
        return out

    def edit(self, model: onnx.ModelProto) -> None:
        """The online turn before each down projection, in the down weights' dtype."""
        inits = {t.name: t for t in model.graph.initializer}
        dtype = helper.tensor_dtype_to_np_dtype(inits[self.downs.weights[0]].data_type)
        _online(model, self.downs.inputs, self.d, self.d.width, dtype)


def online_down(t: Transform, index: ModelIndex) -> OnlineDown | None:
    """`transform smoothquant { online r4 }`: R4 after the fold (OnlineDown); None without it; Q273 where the graph
    has no down projection to turn (check said so already where the graph was known)."""
    if OnlineRotation.R4 not in t.online or t.kind.rotates:
        return None
    downs, width = downs_of(index), down_width(index)
    if isinstance(downs, str) or width is None:
        raise BackendError(error("Q273", f"`online r4` cannot turn this graph: {downs}", t.span_of("online") or t.span,
                                 "no down projection to turn", help="drop `online r4`"))
    return OnlineDown.seeded(downs, width)


def rotated_copy(files: ModelFiles, index: ModelIndex, widths: tuple[int, int | None, int | None, int | None],
                 span, where: Path | None = None) -> ModelFiles:
    """The model's rotated copy (under `where`, else the temporary folder), checked against the original (`files`
    closed either way); Q273 where the graph does not take the rotation."""
    fold = fold_of(index)
    if isinstance(fold, str):
        files.close()
        raise BackendError(error("Q273", f"this graph cannot be rotated: {fold}", span, "no rotation here",
                                 help="rotations fold into Llama-family decoders as exporters write them"))
    hidden, head, down, block = widths
    try:
        rotated = rotate(files, fold, Rotations.seeded(hidden, head, down, block), where)
        try:
            refuse_changed(files.path, rotated, index, span)
        except BaseException:
            rotated.close()
            raise
    finally:
        files.close()
    return rotated


def _sliced(rows: np.ndarray, turn: Callable[[np.ndarray], np.ndarray], out: np.ndarray) -> None:
    """out = `turn`(rows), SLICE rows at a time: the float32 scratch of one slice (`out` may be `rows`)."""
    for first in range(0, rows.shape[0], SLICE):
        out[first:first + SLICE] = turn(rows[first:first + SLICE])


def _reader(q: Turn, gamma: Callable[[], np.ndarray], heads: np.ndarray | None, value_rows: int = 0) -> Rows:
    """A layer reading a norm's output: W·diag(γ)·Q; its last `value_rows` rows (v_proj's, or the v part of a
    fused qkv_proj) of each head then Hᵀ (R2)."""
    def rows(w: np.ndarray, out: np.ndarray) -> None:
        scale = gamma()[None, :]
        _sliced(w, lambda part: q.right(part * scale), out)
        if heads is not None:
            size, first = heads.shape[0], out.shape[0] - value_rows
            part = out[first:].reshape(-1, size, out.shape[1])
            out[first:] = np.einsum("ji,kjc->kic", heads, part).reshape(value_rows, out.shape[1])
    return rows


def _writer(q: Turn, heads: np.ndarray | None, down: Turn | None) -> Rows:
    """A layer writing the stream: Qᵀ·W; o_proj's columns of each head then ·H (R2); a down projection's then ·D
    (R4)."""
    def rows(w: np.ndarray, out: np.ndarray) -> None:
        _sliced(w.T, q.right, out.T)
        if heads is not None:
            out[:] = (out.reshape(out.shape[0], -1, heads.shape[0]) @ heads).reshape(out.shape)
        if down is not None:
            _sliced(out, down.right, out)
    return rows


def _untie(model: onnx.ModelProto, reader: str, own: str = HEAD, at: int = 1) -> None:
    """Node `reader` reads tensor `own` at input `at`; the transpose of the other tensor it read goes when nothing
    else reads it (the head's MatMul the embedding's transpose, or the embedding's Gather the head's)."""
    node = next(n for n in model.graph.node if n.name == reader)
    transposed = node.input[at]
    node.input[at] = own
    if not any(transposed in n.input for n in model.graph.node):
        kept = [n for n in model.graph.node if transposed not in n.output]
        del model.graph.node[:]
        model.graph.node.extend(kept)


def _online(model: onnx.ModelProto, inputs: tuple[str, ...], d: Turn, width: int, dtype) -> None:
    """x·D before each down projection (x `width` wide), x keeping its name (its producer's output renamed)."""
    a, c = d.halves()
    runs = width // d.width
    constants = {f"{ONLINE}.signs": np.tile(d.signs, runs).astype(dtype), f"{ONLINE}.a_t": a.T.astype(dtype),
                 f"{ONLINE}.c": c.astype(dtype),
                 f"{ONLINE}.blocks": np.array([-1, runs, a.shape[0], c.shape[0]], np.int64)}
    model.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in constants.items())
    nodes = list(model.graph.node)
    for x in inputs:
        producer = next(n for n in nodes if x in n.output)
        raw = f"{x}.unrotated"
        producer.output[:] = [raw if o == x else o for o in producer.output]
        for n in nodes:
            if n is not producer and x in n.input and not _is_down(n):
                n.input[:] = [raw if i == x else i for i in n.input]
        stem = f"{producer.name.rsplit('/', 1)[0]}/{ONLINE}"
        step = [
            helper.make_node("Mul", [raw, f"{ONLINE}.signs"], [f"{x}.signed"], name=f"{stem}/Mul"),
            helper.make_node("Shape", [raw], [f"{x}.shape"], name=f"{stem}/Shape"),
            helper.make_node("Reshape", [f"{x}.signed", f"{ONLINE}.blocks"], [f"{x}.blocks"], name=f"{stem}/Reshape"),
            helper.make_node("MatMul", [f"{x}.blocks", f"{ONLINE}.c"], [f"{x}.c"], name=f"{stem}/MatMul_c"),
            helper.make_node("MatMul", [f"{ONLINE}.a_t", f"{x}.c"], [f"{x}.ac"], name=f"{stem}/MatMul_a"),
            helper.make_node("Reshape", [f"{x}.ac", f"{x}.shape"], [x], name=f"{stem}/Reshape_back")]
        at = nodes.index(producer) + 1
        nodes[at:at] = step
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def _is_down(node: onnx.NodeProto) -> bool:
    return node.op_type in ("MatMul", "Gemm", "MatMulNBits") and "down_proj" in node.name


def refuse_changed(original: Path, rotated: ModelFiles, index: ModelIndex, span) -> None:
    """Q422 unless the rotated copy computes what the original computes, on one synthetic sample of a few tokens
    (one session at a time): the structure found the fold, but the head width R2 turns comes from the config beside
    the graph, which nothing else ties to the attention. Where synthetic data cannot fill the model, verification
    (if asked) is the check."""
    feed = probe_feed(index)
    if feed is None:
        return
    before, after = (first_output(path, feed, arena=False) for path in (original, rotated.path))
    change = output_change(before, after)
    if change > FOLD_TOLERANCE[np.asarray(before).dtype == np.float32]:
        raise BackendError(error("Q422", f"rotating the graph changed its float output by {change:.2%}: its heads "
                                 "are not what the config beside it says, or something reads the residual stream "
                                 "that the rotation does not fold", span, "not an equivalent rotation",
                                 help="check the config.json (or genai_config.json) beside the model against the "
                                 "graph, or compile without `transform quarot`"))
