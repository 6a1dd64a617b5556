"""Lowering: recipe + resolved model → the Plan a backend executes, op by op.

The shared planner keeps what every backend has in common: the context a pass reads (the chosen mode, the
workload, the cost model's phase peaks), the passes that do not depend on how a backend runs (the memory
mode, the mixed-precision search, emission), and the constructors of the ops the backends' own passes make.
Each backend supplies its whole pass sequence (its spec's `lowering`: compiler/backends/*/lowering.py), so
nothing here asks which backend it plans for."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from compiler.ir.kinds import TransformData
from compiler.ir.types import (
    AttentionKernel,
    EmitFormat,
    MemoryMode,
    RecipeIR,
    Rounding,
    Scheme,
    SensitivityMetric,
    )
from compiler.ir.values import human_bytes
from compiler.models.builtin import PREFIX as BUILTIN_PREFIX
from compiler.models.index import ModelFormat
from compiler.plan.decision import ModeDecision, ModeEstimate
from compiler.plan.ops import (
    AssignPrecision,
    Buffer,
    CalibrateChunk,
    Emit,
    LoadModel,
    ModelAccess,
    PlanOp,
    QuantizeStrategy,
    QuantizeWeights,
    ScoreSensitivity,
    SelectMemoryMode,
    Smooth,
    Verify,
)
from compiler.plan.target import CostModel, PhaseName
from compiler.plan.workload import Search, Workload
from compiler.resolve.assignment import Assignment
from compiler.resolve.mixed import choices_of
from compiler.resolve.pipeline import resolver

INITIAL_BUFFERS = (Buffer.RECIPE, Buffer.CALIBRATION_DATA, Buffer.VERIFY_DATA)


@dataclass(frozen=True)
class Context:
    """Everything a lowering pass reads."""

    ir: RecipeIR
    assignment: Assignment
    workload: Workload
    decision: ModeDecision
    estimate: ModeEstimate
    passes: int  # low_memory passes over the data
    costs: CostModel

    @property
    def mode(self) -> MemoryMode:
        """The chosen memory mode."""
        assert self.decision.mode is not None
        return self.decision.mode

    @property
    def chunks(self) -> int:
        """Chunks over the calibration samples."""
        return math.ceil(self.workload.samples / self.workload.chunk)

    def phase(self, name: PhaseName) -> int:
        """The cost model's peak for one phase under the chosen mode."""
        return self.costs.phase(self.workload, self.mode, self.workload.chunk, self.passes, name)

    @property
    def needs_data(self) -> bool:
        """The calibration samples are read: some layer rounds with them, or the transform's statistics come
        from them."""
        return self.layers_need_data or self.workload.transform is not None

    @property
    def layers_need_data(self) -> bool:
        """Some layer rounds with data (GPTQ) or has static input ranges (the KV cache's scales too), under any
        searched choice; a transform's statistics aside (its own op gathers them)."""
        w, ir = self.workload, self.ir
        if w.gptq or w.imatrix_layers or w.learned_layers or w.observed or ir.kv_cache is not None:
            return True
        if ir.mixed_precision is None or w.search is None:
            return False
        return any(needs_data(ir.scheme(c)) for c in choices_of(ir))

    @property
    def runs_model(self) -> bool:
        """Some op runs the model (samples through it, or the search)."""
        return self.streams or self.workload.search is not None

    @property
    def streams(self) -> bool:
        """Samples run through the model (calibration or verification)."""
        return self.needs_data or self.ir.verify is not None

    @property
    def after_search(self) -> tuple[Buffer, ...]:
        """The buffer the search produces, for the ops that must wait for it."""
        return (Buffer.PRECISION,) if self.ir.mixed_precision is not None and self.workload.search is not None else ()

    @property
    def range_buffer(self) -> Buffer:
        """What observing produces: final ranges (minmax) or histograms that a search turns into ranges."""
        return Buffer.HISTOGRAMS if self.ir.calibration.method.histogram else Buffer.RANGES


Pass = Callable[[Context], list[PlanOp]]


def needs_data(scheme: Scheme) -> bool:
    """GPTQ and the imatrix search round with their layer's inputs, learned rounding with its block's; static
    activations (and NVFP4's global input scale) need their ranges."""
    act = scheme.activations
    return scheme.rounding in (Rounding.GPTQ, Rounding.IMATRIX, Rounding.AUTOROUND) or (act is not None and act.calibrated)


def observed_layers(ctx: Context) -> tuple[str, ...]:
    """The layers whose inputs are observed."""
    wanted = set(ctx.workload.needed)
    return tuple(a.layer.name for a in ctx.assignment.layers if a.layer.input in wanted)


def block_layers(ctx: Context) -> tuple[str, ...]:
    """The quantized layers inside the blocks."""
    return tuple(n for n in ctx.workload.quantized_layers if ctx.assignment.of(n).layer.block)


def head_layers(ctx: Context) -> tuple[str, ...]:
    """Quantized layers outside the blocks that run before the first block (embeddings)."""
    layers = ctx.workload.index.layers
    first = next((i for i, x in enumerate(layers) if x.block), len(layers))
    head = {x.name for x in layers[:first]}
    return tuple(n for n in ctx.workload.quantized_layers if n in head)


def transform_words(w: Workload, checked: str) -> str:
    """The transform's pass, in words: it runs first, and its fold is checked (`checked` says how)."""
    t = w.transform
    assert t is not None
    stats = "|x| maxima" if t.data is TransformData.MAXIMA else "mean |x| and XᵀX"
    search = f", search {t.grid + 1} strengths" if t.alpha_search else \
        f", alpha {t.alpha:g}" if "alpha" in t.kind.settings else \
        f", search {t.grid} ratios" if "grid" in t.kind.settings else ""
    return f"{t.kind.name} over {len(w.smoothing)} mapping(s): {stats}{search}, fold, {checked}"


# ---- ops every backend makes the same way ------------------------------------------------------------
def load_op(ctx: Context, access: ModelAccess, how: str, resident: int, inputs: tuple[Buffer, ...],
            builtin_form: ModelFormat, rotation: tuple[int, int | None, int | None, int | None] | None = None,
            rotated_when: str = "as it is read") -> LoadModel:
    """`load_model`: the model opened as `access` says (`how` in words), `resident` bytes of weights read; a
    built-in is opened in the backend's own form (`builtin_form`); `rotated_when`: when the backend rotates the
    weights, in words; `rotation`: the (hidden, head, online down,
    block) widths of a rotation folded into the weights as they are read."""
    w = ctx.workload
    builtin = ctx.ir.model.startswith(BUILTIN_PREFIX)
    form = f"built-in, {w.backend.value} form" if builtin else w.index.format.value
    attention = ctx.ir.calibration.attention
    if attention is not AttentionKernel.MODEL:
        how += f", {attention.value} attention"
    if rotation is not None and not rotation[0]:  # R4 alone, turned after SmoothQuant's fold
        how += (f"; each down projection's weight turned by a {rotation[2]}-wide random Hadamard once the smoothing "
                "has folded, its input online: the runtime rotates it as it runs")
    elif rotation is not None:
        assert ctx.ir.transform is not None  # the rotation is the recipe's transform
        what = "learned rotation" if ctx.ir.transform.kind.learns else "random Hadamard"
        how += (f"; every weight rotated {rotated_when} ({ctx.ir.transform.kind.name}: the residual stream by a "
                f"{rotation[0]}-wide {what}" + (f", each head's values by a {rotation[1]}-wide one"
                                                if rotation[1] else "")
                + (f"; the down projections' inputs by a {rotation[2]}-wide "
                   f"{'random Hadamard' if ctx.ir.transform.kind.learns else 'one'}, online: the runtime rotates them "
                   "as it runs" if rotation[2] else "")
                + (f"; block-diagonal: each {rotation[3]} channels turned by one {rotation[3]}-wide Hadamard"
                   if rotation[3] else "") + ")")
    return LoadModel(summary=f"open {ctx.ir.model} ({form}) {how}", inputs=inputs, outputs=(Buffer.MODEL,),
                     peak_bytes=ctx.costs.runtime(ctx.workload) + resident, model=ctx.ir.model,
                     format=builtin_form if builtin else w.index.format, weights=w.weights_bytes, access=access,
                     attention=attention, rotation=rotation)


def smooth_op(ctx: Context, checked: str, inputs: tuple[Buffer, ...] | None = None) -> list[PlanOp]:
    """`smooth`: the transform over the whole model first (`checked`: how its fold is checked), when the recipe
    has one; `inputs`: what the backend's handler reads (default: the model, the data, the mode, the search)."""
    w, t = ctx.workload, ctx.workload.transform
    if t is None:
        return []
    reads = inputs if inputs is not None else (Buffer.MODEL, Buffer.CALIBRATION_DATA, Buffer.MEMORY_MODE) + ctx.after_search
    # R4 alone (`online r4`) turns the down projections in the same rewrite, after the fold
    turned = f"; then each down projection turned by a {w.online_width}-wide random Hadamard, its input online" \
        if w.online_width and not w.rotated else ""
    return [Smooth(summary=f"{transform_words(w, checked)}{turned}; the model is rewritten with the scales before any "
                   "statistic is gathered", inputs=reads, outputs=(Buffer.MODEL,), peak_bytes=ctx.phase(PhaseName.CALIBRATE),
                   transform=t.kind, mappings=len(w.smoothing), settings=t, calibration=ctx.ir.calibration)]


def calibrate_op(ctx: Context, summary: str, layers: tuple[str, ...], outputs: tuple[Buffer, ...],
                 inputs: tuple[Buffer, ...] | None = None) -> CalibrateChunk:
    """`calibrate_chunk` × chunks × passes: whole-model forward passes over the calibration samples; `inputs`:
    what the backend's handler reads (default: the model, the data, the mode, the search)."""
    w = ctx.workload
    reads = inputs if inputs is not None else (Buffer.MODEL, Buffer.CALIBRATION_DATA, Buffer.MEMORY_MODE) + ctx.after_search
    return CalibrateChunk(summary=summary, inputs=reads,
                          outputs=outputs, peak_bytes=ctx.phase(PhaseName.CALIBRATE), repeat=ctx.chunks * ctx.passes,
                          layers=layers, chunk=w.chunk, samples=w.samples, seqlen=w.seqlen, passes=ctx.passes,
                          method=ctx.ir.calibration.method.name, observed=len(w.observed), **statistics(ctx))


def statistics(ctx: Context) -> dict:
    """What an op that gathers statistics carries: the calibration settings, the transform it folds first, the
    KV cache it observes."""
    return {"calibration": ctx.ir.calibration, "transform": ctx.workload.transform, "kv_cache": ctx.ir.kv_cache}


def quantize_op(ctx: Context, names: list[str], inputs: tuple[Buffer, ...], strategy: QuantizeStrategy,
                how: str, waits_for_search: bool = True) -> QuantizeWeights:
    """`quantize_weights` for `names`, rounded as `strategy` says (`how` in words); `waits_for_search`: the op
    reads the searched precision itself (a backend whose prepare_run read it does not)."""
    roundings = tuple(sorted({ctx.assignment.of(n).scheme.rounding for n in names}, key=lambda r: r.name))
    summary = f"round {len(names)} weights ({', '.join(r.name for r in roundings)}), {how}"
    return QuantizeWeights(summary=summary, inputs=inputs + (ctx.after_search if waits_for_search else ()), outputs=(Buffer.QPARAMS,),
                           peak_bytes=ctx.phase(PhaseName.QUANTIZE), repeat=len(names), layers=tuple(names),
                           count=len(names), rounding=roundings, strategy=strategy, calibration=ctx.ir.calibration)


def verify_op(ctx: Context, summary: str, inputs: tuple[Buffer, ...]) -> list[PlanOp]:
    """`verify` as the backend describes it, with the recipe's gate; nothing without a `verify` block."""
    v = ctx.ir.verify
    if v is None:
        return []
    return [Verify(summary=summary, inputs=inputs,
                   outputs=(Buffer.VERIFY_REPORT,), peak_bytes=ctx.phase(PhaseName.VERIFY), samples=v.samples,
                   metric=v.metric, bound=v.bound, threshold=v.threshold, **held_out(ctx))]


def held_out(ctx: Context) -> dict:
    """What an op that runs the held-out samples carries: where they are held out from, in which chunks."""
    v = ctx.ir.verify
    assert v is not None
    return {"data": ctx.ir.calibration.data, "chunk": min(ctx.ir.calibration.chunk, v.samples)}


def gate(ctx: Context) -> str:
    """The verification gate, in words."""
    v = ctx.ir.verify
    assert v is not None
    return f"fail (Q501) unless {v.metric.value} {v.bound.value} {v.threshold:g}"


# ---- passes every backend shares ----------------------------------------------------------------------
def lower_mode(ctx: Context) -> list[PlanOp]:
    """`select_memory_mode`: the decision, with its numbers."""
    d = ctx.decision
    return [SelectMemoryMode(summary=d.reason, inputs=(Buffer.MODEL,), outputs=(Buffer.MEMORY_MODE,),
                             peak_bytes=ctx.costs.runtime(ctx.workload), mode=ctx.mode, requested=d.requested,
                             estimate=ctx.estimate.peak_ram, ram_budget=d.ram_budget, vram=ctx.ir.memory.vram,
                             disk=Path(ctx.ir.memory.disk) if ctx.ir.memory.disk else None)]


KldWords = Callable[[Search, int, int], str]  # (search, chunks, chunk) → what scoring by kld costs, in words


def mixed_precision_pass(kld_words: KldWords) -> Pass:
    """The search's two ops, with the backend's way of scoring by kld described by `kld_words`."""
    def lower_mixed_precision(ctx: Context) -> list[PlanOp]:
        """Scoring runs first: the schemes it chooses decide what the later ops calibrate and round."""
        mp, search = ctx.ir.mixed_precision, ctx.workload.search
        if mp is None or search is None:
            return []
        chunk = min(ctx.workload.chunk, search.samples)
        chunks = math.ceil(search.samples / chunk)
        cost = {SensitivityMetric.SNR: f"weights only: each searched weight rounded {search.choices} ways",
                SensitivityMetric.MSE: f"{chunks} forward pass(es) of {chunk} samples for XᵀX",
                SensitivityMetric.KLD: kld_words(search, chunks, chunk)}[search.metric]
        where = ctx.ir.memory.disk or "$QRC_CACHE"
        score = ScoreSensitivity(
            summary=f"score {search.units} units ({search.params:,} params) by {search.metric.value} for "
            f"{', '.join(mp.choices)}: {cost}; cached by content hash under {where}/sensitivity",
            inputs=(Buffer.MODEL, Buffer.MEMORY_MODE) + (() if search.metric is SensitivityMetric.SNR
                                                         else (Buffer.CALIBRATION_DATA,)),
            outputs=(Buffer.SENSITIVITY,), peak_bytes=ctx.phase(PhaseName.SCORE),
            metric=search.metric, units=search.units, samples=search.samples, params_searched=search.params,
            choices=tuple(ctx.ir.scheme(c) for c in choices_of(ctx.ir)), data=ctx.ir.calibration.data,
            chunk=ctx.ir.calibration.chunk)
        assign = AssignPrecision(summary="greedy: the most loss saved per extra bit first, never above "
                                 f"{mp.budget_bits:g} bits per weight (scales included); a group is one unit, so "
                                 "it never ends mixed", inputs=(Buffer.SENSITIVITY,), outputs=(Buffer.PRECISION,),
                                 peak_bytes=ctx.costs.runtime(ctx.workload), budget_bits=mp.budget_bits, choices=choices_of(ctx.ir),
                                 metric=search.metric, resolve=resolver(ctx.ir))
        return [score, assign]
    return lower_mixed_precision


def emit_pass(reads_ranges: bool, streams_weights: Callable[[Workload, MemoryMode], bool] = lambda w, m: False,
              kernels: Callable[[Context, EmitFormat], str] = lambda ctx, fmt: "",
              reads: tuple[Buffer, ...] = (Buffer.MODEL, Buffer.QPARAMS)) -> Pass:
    """`emit`: where and in which format; `reads_ranges`: the emitter writes the observed input ranges (a
    backend that takes them where it rounds each block has written them by then); `streams_weights`: whether
    each rounded weight goes to the output at once (the backend's cost model decides); `kernels`: the
    backend's words for the kernels a runtime will run the output with ('' for none); `reads`: what the
    backend's handler reads besides the ranges."""
    def lower_emit(ctx: Context) -> list[PlanOp]:
        """`emit`: where and in which format."""
        w, emit = ctx.workload, ctx.ir.emit
        fmt = emit.format if emit else ctx.costs.default_format
        path = emit.path if emit else "(-o PATH)"
        # a recipe that rounds nothing (a compressed-tensors source written as floats) has no quantize op
        inputs = tuple(b for b in reads if b is not Buffer.QPARAMS or w.quantized_layers)
        inputs += (Buffer.RANGES,) if reads_ranges and w.observed else ()
        words = kernels(ctx, fmt)
        return [Emit(summary=f"write {fmt.name} to {path} atomically (temp file + rename), "
                     f"{human_bytes(w.quantized_bytes)} of weights" + (f"; {words}" if words else ""), inputs=inputs, outputs=(Buffer.EMITTED_MODEL,),
                     peak_bytes=ctx.phase(PhaseName.EMIT), format=fmt, path=path, bytes=w.quantized_bytes,
                     accuracy_level=emit.accuracy_level if emit else 4, kv_cache=ctx.ir.kv_cache,
                     streams_weights=streams_weights(w, ctx.mode))]
    return lower_emit


def lower(ctx: Context, passes: Sequence[Pass]) -> tuple[PlanOp, ...]:
    """The backend's passes in order: the plan's ops in execution order."""
    ops: list[PlanOp] = []
    for lowering in passes:
        ops.extend(lowering(ctx))
    return tuple(ops)
