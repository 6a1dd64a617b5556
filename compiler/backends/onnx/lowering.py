"""The ONNX backend's lowering: an HF folder is exported first; the model is opened as its graph (weights stay
in the data file); calibration runs whole-model chunks, or segment by segment in offload; observations become
ranges in their own ops; every weight is streamed from the data file through the rounding into the emitter."""

from __future__ import annotations

from compiler.backends.onnx.cost import export_peak, onnx_rotation
from compiler.backends.onnx.export_builder import planned_exporter
from compiler.backends.onnx.kernels import kernel_words
from compiler.backends.onnx.output_streams import streams_output
from compiler.ir.types import EmitFormat, MemoryMode
from compiler.models import model_dir
from compiler.models.index import ModelFormat
from compiler.plan import memory
from compiler.plan.lower import (
    Context,
    Pass,
    calibrate_op,
    emit_pass,
    gate,
    load_op,
    lower_mode,
    mixed_precision_pass,
    observed_layers,
    quantize_op,
    smooth_op,
    statistics,
    verify_op,
)
from compiler.plan.ops import (
    Buffer,
    CacheBlockInputs,
    CacheLocation,
    ExportOnnx,
    ModelAccess,
    PlanOp,
    PropagateRanges,
    QuantizeStrategy,
    RunBlock,
    SearchPercentile,
)
from compiler.plan.target import PhaseName
from compiler.plan.workload import Search
from compiler.resolve.pipeline import resolver
from compiler.resolve.rotation_widths import rotation_widths

CHECKED = "readers exact from the graph"  # how the transform's fold is checked
ROTATED_WHEN = "into a copy of the model written first, one tensor at a time, and compiled instead"


def _exports(ctx: Context) -> bool:
    return ctx.workload.index.format is ModelFormat.HF


def lower_export(ctx: Context) -> list[PlanOp]:
    """`export_onnx`: an HF folder is compiled through its ONNX export, by the exporter that will take it."""
    if not _exports(ctx):
        return []
    exporter = planned_exporter(model_dir(ctx.ir.model))
    if ctx.workload.index.graph is not None:  # planned against the cached export (the spec's `planned`)
        return [ExportOnnx(summary=f"the export of {ctx.ir.model} is in the cache (made by an earlier compile, "
                           "keyed by the folder's file names, sizes and mtimes): nothing to export; later ops read "
                           "its graph, layer names unchanged", inputs=(Buffer.RECIPE,), outputs=(Buffer.ONNX_MODEL,),
                           peak_bytes=ctx.costs.runtime(ctx.workload), folder=ctx.ir.model, exporter=exporter,
                           resolve=resolver(ctx.ir))]
    return [ExportOnnx(summary=f"export the folder {ctx.ir.model} to ONNX with {exporter.value} (once: cached by the "
                       "folder's file names, sizes and mtimes); later ops read the exported graph, layer names unchanged",
                       inputs=(Buffer.RECIPE,), outputs=(Buffer.ONNX_MODEL,), peak_bytes=export_peak(ctx.workload, exporter),
                       folder=ctx.ir.model, exporter=exporter, resolve=resolver(ctx.ir))]


def lower_load(ctx: Context) -> list[PlanOp]:
    """`load_model`: the graph only."""
    w = ctx.workload
    # R4 alone (`transform smoothquant { online r4 }`) is written with the smoothing's copy (the `smooth` op)
    rotation = rotation_widths(w.index, w.rotated, w.online_width, w.rotation_block) if w.rotated else None
    scratch = onnx_rotation(w).bytes - ctx.costs.runtime(w) if rotation is not None else 0
    return [load_op(ctx, ModelAccess.GRAPH, "graph only: weights stay in the data file until a session or the quantizer "
                    "reads them", scratch, (Buffer.ONNX_MODEL,) if _exports(ctx) else (Buffer.RECIPE,),
                    ModelFormat.ONNX, rotation, rotated_when=ROTATED_WHEN)]


def _kld_words(search: Search, chunks: int, chunk: int) -> str:
    return f"{chunks} × {1 + search.units * search.choices} forward passes of {chunk} samples " \
        "(each unit under each choice, measured)"


def lower_calibration(ctx: Context) -> list[PlanOp]:
    """Whole-model chunks, or (offload) cached segment inputs and segments."""
    w = ctx.workload
    if not w.calibrate or not ctx.needs_data:
        return []  # e.g. weight-only mixed precision: its forward passes belong to score_sensitivity
    if ctx.mode is MemoryMode.OFFLOAD:
        return smooth_op(ctx, CHECKED) + _segments(ctx)
    tensors = (f"{len(w.observed)} tensors" if w.index.graph is not None else
               f"the inputs of {len(w.needed)} layers (tensor names from the exported graph)")
    hessians = f" and GPTQ Hessians of {len(w.hessian_inputs)} layer inputs" if w.hessian_inputs else ""
    summary = (f"forward {w.chunk} samples × {w.seqlen} tokens; update observers of {tensors}{hessians}; "
               "keep nothing else (the model's own outputs are dropped from the graph)")
    return smooth_op(ctx, CHECKED) + [calibrate_op(ctx, summary, observed_layers(ctx), (ctx.range_buffer,))]


def _segments(ctx: Context) -> list[PlanOp]:
    w = ctx.workload
    where = CacheLocation.DISK if w.disk else CacheLocation.RAM
    cache = CacheBlockInputs(
        summary=f"run the model up to the first block; cache its inputs {where.value} (per sample: hidden states only; "
        "per-sample-constant inputs once)", inputs=(Buffer.MODEL, Buffer.CALIBRATION_DATA, Buffer.MEMORY_MODE) + ctx.after_search,
        outputs=(Buffer.BLOCK_INPUTS,), peak_bytes=ctx.phase(PhaseName.CALIBRATE), layers=(), samples=w.samples,
        seqlen=w.seqlen, per_sample=w.seqlen * w.hidden * 4, where=where, **statistics(ctx))
    what = "observe its tensors" + (" (GPTQ: round its layers once every chunk has passed, free their Hessians)"
                                 if w.hessian_inputs else "")
    rounds = (Buffer.QPARAMS,) if w.hessian_inputs else ()  # GPTQ's layers, as their segments finish
    run = RunBlock(summary=f"per block: load weights, {what}, outputs become the next block's inputs",
                   inputs=(Buffer.MODEL, Buffer.MEMORY_MODE, Buffer.BLOCK_INPUTS),
                   outputs=(Buffer.BLOCK_INPUTS, ctx.range_buffer) + rounds,
                   peak_bytes=ctx.phase(PhaseName.CALIBRATE), repeat=max(1, len(w.blocks)),
                   layers=observed_layers(ctx), blocks=len(w.blocks), chunk=w.chunk, gptq=w.gptq, **statistics(ctx))
    return [cache, run]


def lower_ranges(ctx: Context) -> list[PlanOp]:
    """`search_percentile` and `propagate_ranges`: observations become ranges."""
    w, cal = ctx.workload, ctx.ir.calibration
    if not w.observed:
        return []
    ops: list[PlanOp] = []
    if cal.method.histogram:
        ops.append(SearchPercentile(summary=f"ranges from {cal.bins}-bin histograms ({cal.method.detail()})", inputs=(Buffer.HISTOGRAMS,),
                                    outputs=(Buffer.RANGES,), peak_bytes=ctx.costs.runtime(ctx.workload) + memory.observer_bytes(w),
                                    method=cal.method.name, bins=cal.bins, tensors=len(w.observed), calibration=cal))
    if cal.passthrough:
        which = (f"({w.inherited} of {len(w.needed)} needed tensors not observed)" if w.index.graph is not None else
                 "(which ones the exported graph shows)")
        ops.append(PropagateRanges(summary=f"outputs of {', '.join(cal.passthrough)} inherit their producer's range "
                                   + which, inputs=(Buffer.RANGES,), outputs=(Buffer.RANGES,), peak_bytes=ctx.costs.runtime(ctx.workload),
                                   inherited=w.inherited, needed=len(w.needed), observed=len(w.observed),
                                   calibration=cal))
    return ops


def lower_quantize(ctx: Context) -> list[PlanOp]:
    """`quantize_weights`: every quantized layer, streamed from the data file."""
    w = ctx.workload
    names = list(w.quantized_layers)
    if not names:
        return []
    # the observers' ranges, or (GPTQ alone) the Hessians calibration gathered; the layers offload rounded already
    observed = (Buffer.RANGES,) if w.observed else (ctx.range_buffer,) if w.calibrate and ctx.needs_data else ()
    early = (Buffer.QPARAMS,) if ctx.mode is MemoryMode.OFFLOAD and w.hessian_inputs and observed else ()
    inputs = (Buffer.MODEL,) + observed + early
    return [quantize_op(ctx, names, inputs, QuantizeStrategy.STREAMED, "streamed: load → quantize → write → free")]


def lower_verify(ctx: Context) -> list[PlanOp]:
    """`verify`: the float and the emitted model, both in onnxruntime."""
    v = ctx.ir.verify
    if v is None:
        return []
    return verify_op(ctx, f"run float and emitted model on {v.samples} held-out samples; {gate(ctx)}",
                     (Buffer.MODEL, Buffer.MEMORY_MODE, Buffer.EMITTED_MODEL, Buffer.VERIFY_DATA))


def _kernels(ctx: Context, fmt: EmitFormat) -> str:
    """The kernels onnxruntime will run the output with; not said where the graph comes later (an exported
    folder) or a search picks the schemes."""
    if ctx.assignment.model.format is ModelFormat.HF or ctx.ir.mixed_precision is not None:
        return ""
    return kernel_words(ctx.assignment, fmt)


LOWERING: tuple[Pass, ...] = (
    lower_export, lower_load, lower_mode, mixed_precision_pass(_kld_words), lower_calibration, lower_ranges,
    lower_quantize, emit_pass(reads_ranges=True, streams_weights=streams_output, kernels=_kernels,
                              reads=(Buffer.MODEL, Buffer.MEMORY_MODE, Buffer.QPARAMS)), lower_verify,
)
