"""Lowering: recipe + resolved model → the Plan a backend executes, op by op. Each pass is a small function;
PASSES orders them as they run. What differs between backends is asked of the backend's cost model
(compiler.plan.target.CostModel), never decided here by naming a backend."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from compiler.ir.types import (
    ActivationMode,
    Backend,
    CalibrationMethod,
    MemoryMode,
    RecipeIR,
    Rounding,
    Scheme,
    SensitivityMetric,
    TransformKind,
)
from compiler.ir.values import human_bytes
from compiler.models.builtin import PREFIX as BUILTIN_PREFIX
from compiler.models.index import ModelFormat
from compiler.plan import memory
from compiler.plan.ops import (
    AssignPrecision,
    CacheBlockInputs,
    CacheLocation,
    CalibrateChunk,
    CaptureReference,
    Emit,
    ExportOnnx,
    LoadModel,
    ModeDecision,
    ModeEstimate,
    PlanOp,
    PropagateRanges,
    QuantizeWeights,
    RunBlock,
    ScoreSensitivity,
    SearchPercentile,
    SelectMemoryMode,
    Verify,
)
from compiler.plan.target import CostModel, PhaseName
from compiler.plan.workload import Workload
from compiler.resolve.assignment import Assignment
from compiler.resolve.mixed import choices_of

INITIAL_BUFFERS = ("recipe", "calibration_data", "verify_data")


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
    def blockwise(self) -> bool:
        """The run goes block by block (cached block inputs), not through the whole model at once."""
        w = self.workload
        if self.costs.rounds_in_blocks:
            return self.mode is not MemoryMode.FULL and bool(w.blocks)
        return self.mode is MemoryMode.OFFLOAD

    @property
    def needs_data(self) -> bool:
        """Some layer rounds with data (GPTQ) or has static input ranges, under any searched choice."""
        w, ir = self.workload, self.ir
        if w.gptq or w.observed or ir.kv_cache is not None or w.transform is not None:  # the KV cache's scales and
            return True  # the transform's statistics come from calibration
        if ir.mixed_precision is None or w.search is None:
            return False
        return any(_needs_data(ir.scheme(c)) for c in choices_of(ir))

    @property
    def runs_model(self) -> bool:
        """Some op runs the model (samples through it, or the search); otherwise the torch backend rounds
        file to file without building it."""
        return self.streams or self.workload.search is not None

    @property
    def streams(self) -> bool:
        """torch: samples run through the model (calibration or verification)."""
        return self.needs_data or self.ir.verify is not None


def _needs_data(scheme: Scheme) -> bool:
    """GPTQ rounds with its layer's inputs; static activations need their ranges."""
    act = scheme.activations
    return scheme.rounding is Rounding.GPTQ or (act is not None and act.mode is ActivationMode.STATIC)


def lower_export(ctx: Context) -> list[PlanOp]:
    """`export_onnx`: an HF folder compiled by a backend that reads ONNX graphs."""
    if not ctx.costs.reads_graph_only or ctx.workload.index.format is not ModelFormat.HF:
        return []
    if ctx.workload.index.graph is not None:  # planned against the cached export (backends' `planned`)
        return [ExportOnnx(summary=f"the export of {ctx.ir.model} is in the cache (made by an earlier compile, "
                           "keyed by the folder's file names, sizes and mtimes): nothing to export; later ops read "
                           "its graph, layer names unchanged", inputs=("recipe",), outputs=("onnx_model",),
                           peak_bytes=ctx.costs.runtime, folder=ctx.ir.model, exporter="torch.onnx")]
    return [ExportOnnx(summary=f"export the folder {ctx.ir.model} to ONNX with torch.onnx (once: cached by the "
                       "folder's file names, sizes and mtimes); later ops read the exported graph, layer names unchanged",
                       inputs=("recipe",), outputs=("onnx_model",), peak_bytes=ctx.phase(PhaseName.EXPORT),
                       folder=ctx.ir.model, exporter="torch.onnx")]


def lower_load(ctx: Context) -> list[PlanOp]:
    """`load_model`: how the model is opened."""
    w = ctx.workload
    lazy_graph = ctx.costs.reads_graph_only  # weights stay in the data file
    streamed = lazy_graph or not ctx.runs_model or ctx.mode in (MemoryMode.OFFLOAD, MemoryMode.MULTI_GPU)
    resident = 0 if streamed else w.weights_bytes
    if lazy_graph:
        how = "graph only: weights stay in the data file until a session or the quantizer reads them"
    elif not ctx.runs_model:
        how = ("its safetensors files only: no model definition is built, since nothing runs the model "
               "(data-free rounding, nothing to verify); tensor by tensor, file to file")
    else:
        how = "lazily, one block at a time" if not resident else "whole"
    form = f"built-in, {w.backend.value} form" if ctx.ir.model.startswith("builtin:") else w.index.format.value
    inputs = ("onnx_model",) if lower_export(ctx) else ("recipe",)
    return [LoadModel(summary=f"open {ctx.ir.model} ({form}) {how}", inputs=inputs, outputs=("model",),
                      peak_bytes=ctx.costs.runtime + resident, model=ctx.ir.model, format=w.index.format,
                      weights=w.weights_bytes)]


def lower_mode(ctx: Context) -> list[PlanOp]:
    """`select_memory_mode`: the decision, with its numbers."""
    d = ctx.decision
    return [SelectMemoryMode(summary=d.reason, inputs=("model",), outputs=("memory_mode",),
                             peak_bytes=ctx.costs.runtime, mode=ctx.mode, requested=d.requested,
                             estimate=ctx.estimate.peak_ram, ram_budget=d.ram_budget)]


def lower_mixed_precision(ctx: Context) -> list[PlanOp]:
    """Scoring runs first: the schemes it chooses decide what the later ops calibrate and round."""
    mp, search = ctx.ir.mixed_precision, ctx.workload.search
    if mp is None or search is None:
        return []
    w = ctx.workload
    chunk = min(w.chunk, search.samples)
    chunks = math.ceil(search.samples / chunk)
    cost = {SensitivityMetric.SNR: f"weights only: each searched weight rounded {search.choices} ways",
            SensitivityMetric.MSE: f"{chunks} forward pass(es) of {chunk} samples for XᵀX",
            SensitivityMetric.KLD: (f"{chunks} × (2 forward + 1 backward) passes of {chunk} samples (first-order estimate)"
                                    if ctx.costs.kld_by_gradient else
                                    f"{chunks} × {1 + search.units * search.choices} forward passes of {chunk} samples "
                                    "(each unit under each choice, measured)")}[search.metric]
    where = ctx.ir.memory.disk or "$QRC_CACHE"
    score = ScoreSensitivity(
        summary=f"score {search.units} units ({search.params:,} params) by {search.metric.value} for "
        f"{', '.join(mp.choices)}: {cost}; cached by content hash under {where}/sensitivity",
        inputs=("model",) if search.metric is SensitivityMetric.SNR else ("model", "calibration_data"),
        outputs=("sensitivity",), peak_bytes=ctx.phase(PhaseName.SCORE),
        metric=search.metric, units=search.units, samples=search.samples, params_searched=search.params)
    assign = AssignPrecision(summary=f"greedy: the most loss saved per extra bit first, never above {mp.budget_bits:g} "
                             "bits per weight (scales included); a group is one unit, so it never ends mixed",
                             inputs=("sensitivity",), outputs=("precision",), peak_bytes=ctx.costs.runtime,
                             budget_bits=mp.budget_bits, choices=tuple(mp.choices))
    return [score, assign]


def _range_buffer(ctx: Context) -> str:
    return "ranges" if ctx.ir.calibration.method is CalibrationMethod.MINMAX else "histograms"


def _after_search(ctx: Context) -> tuple[str, ...]:
    return ("precision",) if ctx.ir.mixed_precision is not None and ctx.workload.search is not None else ()


def lower_calibration(ctx: Context) -> list[PlanOp]:
    """The forward passes that gather statistics: whole-model chunks, or cached block inputs and blocks."""
    if ctx.costs.rounds_in_blocks:
        return _torch_streams(ctx)
    w = ctx.workload
    if not w.calibrate or not ctx.needs_data:
        return []  # e.g. weight-only mixed precision: its forward passes belong to score_sensitivity
    if ctx.blockwise:
        return _blockwise(ctx)
    return [_calibrate_chunks(ctx, _observed_layers(ctx), (_range_buffer(ctx),))]


def _statistics(ctx: Context) -> list[str]:
    """What calibration gathers, in words."""
    w = ctx.workload
    parts = ["input ranges"] if w.observed or (ctx.ir.kv_cache is None and w.transform is None) else []
    parts += [_transform_words(w)] if w.transform else []
    return parts + (["GPTQ Hessians"] if w.gptq else []) + (["KV cache ranges"] if ctx.ir.kv_cache else [])


def _transform_words(w) -> str:
    """The transform's pass, in words: it runs first, and its fold is checked."""
    t = w.transform
    stats = "|x| maxima" if t.kind is TransformKind.SMOOTHQUANT else "mean |x| and XᵀX"
    search = f", search {t.grid} ratios" if t.kind is TransformKind.AWQ else f", alpha {t.alpha:g}"
    checked = "float output checked unchanged" if w.backend is Backend.TORCH else "readers exact from the graph"
    return f"{t.kind.value} over {len(w.smoothing)} mapping(s): {stats}{search}, fold, {checked}"


def _calibrate_chunks(ctx: Context, layers: tuple[str, ...], outputs: tuple[str, ...]) -> CalibrateChunk:
    w = ctx.workload
    if ctx.costs.rounds_in_blocks:
        summary = (f"forward {w.chunk} samples × {w.seqlen} tokens through the whole model, hooks gathering the "
                   "statistics its layers round with (" + ", ".join(_statistics(ctx)) + ")")
    else:
        tensors = (f"{len(w.observed)} tensors" if w.index.graph is not None else
                   f"the inputs of {len(w.needed)} layers (tensor names from the exported graph)")
        hessians = f" and GPTQ Hessians of {len(w.hessian_inputs)} layer inputs" if w.hessian_inputs else ""
        first = f"first {_transform_words(w)} (the model rewritten with the scales, one weight at a time); " \
            if w.transform else ""
        summary = (first + f"forward {w.chunk} samples × {w.seqlen} tokens; update observers of {tensors}{hessians}; "
                   "keep nothing else (the model's own outputs are dropped from the graph)")
    return CalibrateChunk(summary=summary, inputs=("model", "calibration_data", "memory_mode") + _after_search(ctx),
                          outputs=outputs, peak_bytes=ctx.phase(PhaseName.CALIBRATE), repeat=ctx.chunks * ctx.passes,
                          layers=layers, chunk=w.chunk, samples=w.samples, seqlen=w.seqlen, passes=ctx.passes,
                          method=ctx.ir.calibration.method, observed=len(w.observed))


def _observed_layers(ctx: Context) -> tuple[str, ...]:
    wanted = set(ctx.workload.needed)
    return tuple(a.layer.name for a in ctx.assignment.layers if a.layer.input in wanted)


def _block_layers(ctx: Context) -> tuple[str, ...]:
    return tuple(n for n in ctx.workload.quantized_layers if ctx.assignment.of(n).layer.block)


def _head_layers(ctx: Context) -> tuple[str, ...]:
    """Quantized layers outside the blocks that run before the first block (embeddings)."""
    layers = ctx.workload.index.layers
    first = next((i for i, x in enumerate(layers) if x.block), len(layers))
    head = {x.name for x in layers[:first]}
    return tuple(n for n in ctx.workload.quantized_layers if n in head)


def _torch_streams(ctx: Context) -> list[PlanOp]:
    """torch: the calibration stream (when a layer needs data) and the verification streams run through the
    model; block by block, or whole in full mode (hooks on every layer)."""
    if not ctx.streams:
        return []
    ops: list[PlanOp] = []
    if not ctx.blockwise:
        if ctx.ir.verify is not None:
            ops.append(CaptureReference(
                summary=f"run the float model on {ctx.ir.verify.samples} held-out samples and keep its outputs "
                "(the model is then rounded in place)", inputs=("model", "verify_data"), outputs=("reference",),
                peak_bytes=ctx.phase(PhaseName.VERIFY), samples=ctx.ir.verify.samples))
        if ctx.needs_data:
            ops.append(_calibrate_chunks(ctx, ctx.workload.quantized_layers, ("statistics",)))
        return ops
    return _blockwise(ctx)


def _blockwise(ctx: Context) -> list[PlanOp]:
    w, rounds = ctx.workload, ctx.costs.rounds_in_blocks
    where = CacheLocation.DISK if w.disk and ctx.mode is MemoryMode.OFFLOAD else CacheLocation.RAM
    streams = []
    if ctx.needs_data:
        streams.append("calibration")
    if rounds and ctx.ir.verify is not None:  # an HF folder's quantized side is its emitted folder (lower_verify)
        streams.append("verification (float and quantized)" if ctx.ir.model.startswith(BUILTIN_PREFIX)
                       else "verification (float)")
    head = _head_layers(ctx) if rounds else ()
    rounding_head = f"; round {len(head)} layers before the blocks first" if head else ""
    cache = CacheBlockInputs(
        summary=f"run the model up to the first block; cache its inputs {where.value} (per sample: hidden states only; "
        "per-sample-constant inputs once)" + (f"; streams: {', '.join(streams)}" if rounds else "") + rounding_head,
        inputs=("model", "calibration_data", "memory_mode") + _after_search(ctx),
        outputs=("block_inputs",) + (("qparams",) if head else ()), peak_bytes=ctx.phase(PhaseName.CALIBRATE),
        layers=head, samples=w.samples, seqlen=w.seqlen, per_sample=w.seqlen * w.hidden * 4, where=where)
    outputs = ("block_inputs",) + (("qparams",) if rounds else (_range_buffer(ctx),))
    ranges = f"input ranges ({ctx.ir.calibration.method.value}), " if rounds and w.observed else ""
    ranges += "KV cache ranges, " if rounds and ctx.ir.kv_cache is not None else ""
    if rounds:
        what = (_transform_words(w) + "; " if w.transform else "") + "compute float outputs, " + ranges + ("quantize the block (GPTQ with its Hessians)" if w.gptq else
                                                      "quantize the block")
    else:
        what = (f"(after {_transform_words(w)}, its own pass over the segments) " if w.transform else "") + \
            "observe its tensors" + (" (GPTQ: round its layers once every chunk has passed, free their "
                                        "Hessians)" if w.hessian_inputs else "")
    run = RunBlock(summary=f"per block: load weights, {what}, outputs become the next block's inputs",
                   inputs=("model", "block_inputs"), outputs=outputs, peak_bytes=ctx.phase(PhaseName.CALIBRATE),
                   repeat=max(1, len(w.blocks)), layers=_block_layers(ctx) if rounds else _observed_layers(ctx),
                   blocks=len(w.blocks), chunk=w.chunk, gptq=w.gptq)
    return [cache, run]


def lower_ranges(ctx: Context) -> list[PlanOp]:
    """`search_percentile` and `propagate_ranges`: observations become ranges."""
    w, cal = ctx.workload, ctx.ir.calibration
    if not w.observed or ctx.costs.rounds_in_blocks:  # there each block's ranges are taken where it is rounded
        return []
    ops: list[PlanOp] = []
    if cal.method is not CalibrationMethod.MINMAX:
        detail = {CalibrationMethod.PERCENTILE: f"percentile {cal.percentile:g}",
                  CalibrationMethod.LAYERWISE_PERCENTILE: "candidates " + ", ".join(f"{c:g}" for c in cal.candidates)
                  + f" scored by {cal.score_metric.value}"}.get(cal.method, cal.method.value)
        ops.append(SearchPercentile(summary=f"ranges from {cal.bins}-bin histograms ({detail})", inputs=("histograms",),
                                    outputs=("ranges",), peak_bytes=ctx.costs.runtime + memory.observer_bytes(w),
                                    method=cal.method, bins=cal.bins, tensors=len(w.observed)))
    if cal.passthrough:
        which = (f"({w.inherited} of {len(w.needed)} needed tensors not observed)" if w.index.graph is not None else
                 "(which ones the exported graph shows)")
        ops.append(PropagateRanges(summary=f"outputs of {', '.join(cal.passthrough)} inherit their producer's range "
                                   + which,
                                   inputs=("ranges",), outputs=("ranges",), peak_bytes=ctx.costs.runtime,
                                   inherited=w.inherited, needed=len(w.needed), observed=len(w.observed)))
    return ops


def _rounded_elsewhere(ctx: Context) -> set[str]:
    """Layers an earlier op rounds: in blocks (and before them) on a backend that rounds there."""
    if ctx.costs.rounds_in_blocks and ctx.streams and ctx.blockwise:
        return set(_block_layers(ctx)) | set(_head_layers(ctx))
    return set()


def lower_quantize(ctx: Context) -> list[PlanOp]:
    """`quantize_weights`: the layers no earlier op rounded."""
    w = ctx.workload
    done = _rounded_elsewhere(ctx)
    names = [n for n in w.quantized_layers if n not in done]
    if not names:
        return []
    inputs = ["model"]
    if w.observed and not ctx.costs.rounds_in_blocks:
        inputs.append("ranges")
    tail_runs = ctx.costs.rounds_in_blocks and ctx.streams and ctx.blockwise and (
        ctx.ir.verify is not None or any(_needs_data(ctx.assignment.of(n).scheme) for n in names))
    whole = ctx.costs.rounds_in_blocks and ctx.streams and not ctx.blockwise
    if tail_runs:
        inputs.append("block_inputs")
    elif whole and ctx.needs_data:
        inputs.append("statistics")
    inputs += _after_search(ctx)
    roundings = tuple(sorted({ctx.assignment.of(n).scheme.rounding for n in names}, key=lambda r: r.value))
    if ctx.costs.rounds_in_blocks and not ctx.runs_model:
        how = "file to file: read → quantize → write → free, one tensor at a time"
    elif whole:
        how = "in the resident model, each computing like the emitted one from then on"
    elif tail_runs:
        how = ("the model's tail runs on the last block's outputs (its layers' statistics), then streamed: "
               "load → quantize → write → free")
    else:
        how = "streamed: load → quantize → write → free"
    summary = f"round {len(names)} weights ({', '.join(r.value for r in roundings)}), {how}"
    peak = ctx.phase(PhaseName.QUANTIZE)
    return [QuantizeWeights(summary=summary, inputs=tuple(inputs), outputs=("qparams",), peak_bytes=peak,
                            repeat=len(names), layers=tuple(names), count=len(names), rounding=roundings)]


def lower_emit(ctx: Context) -> list[PlanOp]:
    """`emit`: where and in which format."""
    w, emit = ctx.workload, ctx.ir.emit
    fmt = emit.format if emit else ctx.costs.default_format
    path = emit.path if emit else "(-o PATH)"
    inputs = ("model", "qparams") + (("ranges",) if w.observed and not ctx.costs.rounds_in_blocks else ())
    return [Emit(summary=f"write {fmt.value} to {path} atomically (temp file + rename), "
                 f"{human_bytes(w.quantized_bytes)} of weights", inputs=inputs, outputs=("emitted_model",),
                 peak_bytes=ctx.phase(PhaseName.EMIT), format=fmt, path=path, bytes=w.quantized_bytes)]


def lower_verify(ctx: Context) -> list[PlanOp]:
    """`verify`: how the emitted model is compared with float."""
    v = ctx.ir.verify
    if v is None:
        return []
    gate = f"fail (Q501) unless {v.metric.value} {v.bound.value} {v.threshold:g}"
    # an HF folder's output is run as transformers loads it (the backend opens it block by block); a built-in's
    # output has no loader outside qrc, so qrc's own rounded model is what runs
    emitted = "qrc's quantized model" if ctx.ir.model.startswith(BUILTIN_PREFIX) else \
        "the emitted folder as transformers loads it (compressed-tensors), one block at a time,"
    if ctx.costs.rounds_in_blocks and ctx.blockwise:
        summary = (f"run {v.samples} held-out samples through {emitted} against the float stream carried through "
                   f"every block beside the calibration stream, at the model's output; {gate}")
        inputs: tuple[str, ...] = ("block_inputs", "emitted_model", "verify_data")
    elif ctx.costs.rounds_in_blocks:
        summary = (f"run {v.samples} held-out samples through {emitted} against the float outputs kept before "
                   f"rounding; {gate}")
        inputs = ("model", "reference", "emitted_model", "verify_data")
    else:
        summary = (f"run float and emitted model on {v.samples} held-out samples; "
                   f"fail (Q501) unless {v.metric.value} {v.bound.value} {v.threshold:g}")
        inputs = ("model", "emitted_model", "verify_data")
    return [Verify(summary=summary, inputs=inputs, outputs=("verify_report",), peak_bytes=ctx.phase(PhaseName.VERIFY),
                   samples=v.samples, metric=v.metric, bound=v.bound, threshold=v.threshold)]


PASSES: tuple[Callable[[Context], list[PlanOp]], ...] = (
    lower_export, lower_load, lower_mode, lower_mixed_precision, lower_calibration, lower_ranges, lower_quantize,
    lower_emit, lower_verify,
)


def lower(ctx: Context) -> tuple[PlanOp, ...]:
    """Every pass in order: the plan's ops in execution order."""
    ops: list[PlanOp] = []
    for lowering in PASSES:
        ops.extend(lowering(ctx))
    return tuple(ops)
