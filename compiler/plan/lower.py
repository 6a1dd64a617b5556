"""Lowering: recipe + resolved model → Plan. Each pass is a small function; PASSES orders them."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from compiler.ir.types import Backend, CalibrationMethod, MemoryMode, RecipeIR
from compiler.ir.values import human_bytes
from compiler.plan import memory
from compiler.plan.ops import ModeDecision, ModeEstimate, OpKind, PlanOp
from compiler.plan.workload import Workload
from compiler.resolve.assignment import Assignment

INITIAL_BUFFERS = ("recipe", "calibration_data", "verify_data")


@dataclass(frozen=True)
class Context:
    ir: RecipeIR
    assignment: Assignment
    workload: Workload
    decision: ModeDecision
    estimate: ModeEstimate
    passes: int  # low_memory passes over the data

    @property
    def mode(self) -> MemoryMode:
        return self.decision.mode

    @property
    def chunks(self) -> int:
        return math.ceil(self.workload.samples / self.workload.chunk)

    def phase(self, name: str) -> int:
        w, mode, chunk = self.workload, self.mode, self.workload.chunk
        if w.backend is Backend.TORCH:
            return memory.torch_phase(w, mode, chunk).bytes
        return {"calibrate": lambda: memory.onnx_calibration(w, mode, chunk, self.passes).bytes,
                "quantize": lambda: memory.onnx_quantize(w, mode).bytes,
                "verify": lambda: memory.onnx_verify(w, mode, min(chunk, w.verify_samples)).bytes}[name]()


def _p(**params) -> tuple[tuple[str, str], ...]:
    return tuple((k, str(v)) for k, v in params.items())


def lower_load(ctx: Context) -> list[PlanOp]:
    w = ctx.workload
    onnx_lazy = w.backend is Backend.ONNX  # ONNX reads the graph only; weights stay in the data file
    resident = 0 if onnx_lazy or ctx.mode in (MemoryMode.OFFLOAD, MemoryMode.MULTI_GPU) else w.weights_bytes
    peak = memory.RUNTIME[w.backend] + resident
    if onnx_lazy:
        how = "graph only: weights stay in the data file until a session or the quantizer reads them"
    else:
        how = "lazily, one block at a time" if not resident else "whole"
    form = f"built-in, {w.backend.value} form" if ctx.ir.model.startswith("builtin:") else w.index.format
    return [PlanOp(OpKind.LOAD_MODEL, f"open {ctx.ir.model} ({form}) {how}",
                   _p(model=ctx.ir.model, format=w.index.format, weights=w.weights_bytes), ("recipe",), ("model",), peak)]


def lower_mode(ctx: Context) -> list[PlanOp]:
    d = ctx.decision
    return [PlanOp(OpKind.SELECT_MEMORY_MODE, d.reason,
                   _p(mode=d.mode.value, requested=d.requested.value, estimate=ctx.estimate.peak_ram,
                      ram_budget=d.ram_budget), ("model",), ("memory_mode",), memory.RUNTIME[ctx.workload.backend])]


def _range_buffer(ctx: Context) -> str:
    return "ranges" if ctx.ir.calibration.method is CalibrationMethod.MINMAX else "histograms"


def lower_calibration(ctx: Context) -> list[PlanOp]:
    w = ctx.workload
    if not w.calibrate:
        return []
    if w.backend is Backend.TORCH:
        return _blockwise(ctx)
    if not w.observed:
        return []  # e.g. weight-only mixed precision: its forward passes belong to score_sensitivity
    if ctx.mode is MemoryMode.OFFLOAD:
        return _blockwise(ctx)
    observed = _observed_layers(ctx)
    outputs = (_range_buffer(ctx),)
    summary = (f"forward {w.chunk} samples × {w.seqlen} tokens; update observers of {len(w.observed)} tensors; "
               "keep nothing else (the model's own outputs are dropped from the graph)")
    params = _p(chunk=w.chunk, samples=w.samples, seqlen=w.seqlen, passes=ctx.passes,
                method=ctx.ir.calibration.method.value, observed=len(w.observed))
    return [PlanOp(OpKind.CALIBRATE_CHUNK, summary, params, ("model", "calibration_data", "memory_mode"), outputs,
                   ctx.phase("calibrate"), repeat=ctx.chunks * ctx.passes, layers=observed)]


def _observed_layers(ctx: Context) -> tuple[str, ...]:
    wanted = set(ctx.workload.needed)
    return tuple(a.layer.name for a in ctx.assignment.layers if a.layer.input in wanted)


def _blockwise(ctx: Context) -> list[PlanOp]:
    w = ctx.workload
    where = "on disk" if w.disk and ctx.mode is MemoryMode.OFFLOAD else "in RAM"
    cache = PlanOp(OpKind.CACHE_BLOCK_INPUTS,
                   f"run the model up to the first block; cache its inputs {where} (per sample: hidden states only; "
                   "per-sample-constant inputs once)",
                   _p(samples=w.samples, seqlen=w.seqlen, per_sample=w.seqlen * w.hidden * 4, where=where),
                   ("model", "calibration_data", "memory_mode"), ("block_inputs",),
                   ctx.phase("calibrate"))
    quantizes = w.backend is Backend.TORCH
    outputs = ("block_inputs",) + (("qparams",) if quantizes else (_range_buffer(ctx),))
    block_layers = tuple(name for name in w.quantized_layers if ctx.assignment.of(name).layer.block)
    ranges = f"input ranges ({ctx.ir.calibration.method.value}), " if quantizes and w.observed else ""
    what = "compute float outputs, " + ranges + ("quantize the block (GPTQ with its Hessians)" if w.gptq else
                                                  "quantize the block") if quantizes else "observe its tensors"
    run = PlanOp(OpKind.RUN_BLOCK, f"per block: load weights, {what}, outputs become the next block's inputs",
                 _p(blocks=len(w.blocks), chunk=w.chunk, gptq=w.gptq), ("model", "block_inputs"), outputs,
                 ctx.phase("calibrate"), repeat=max(1, len(w.blocks)),
                 layers=block_layers if quantizes else _observed_layers(ctx))
    return [cache, run]


def lower_ranges(ctx: Context) -> list[PlanOp]:
    w, cal = ctx.workload, ctx.ir.calibration
    if not w.observed or w.backend is Backend.TORCH:  # torch: each block's ranges are taken inside run_block
        return []
    ops = []
    if cal.method is not CalibrationMethod.MINMAX:
        detail = {CalibrationMethod.PERCENTILE: f"percentile {cal.percentile:g}",
                  CalibrationMethod.LAYERWISE_PERCENTILE: "candidates " + ", ".join(f"{c:g}" for c in cal.candidates)
                  + f" scored by {cal.score_metric.value}"}.get(cal.method, cal.method.value)
        ops.append(PlanOp(OpKind.SEARCH_PERCENTILE, f"ranges from {cal.bins}-bin histograms ({detail})",
                          _p(method=cal.method.value, bins=cal.bins, tensors=len(w.observed)), ("histograms",),
                          ("ranges",), memory.RUNTIME[w.backend] + memory.observer_bytes(w)))
    if cal.passthrough:
        ops.append(PlanOp(OpKind.PROPAGATE_RANGES,
                          f"outputs of {', '.join(cal.passthrough)} inherit their producer's range "
                          f"({w.inherited} of {len(w.needed)} needed tensors not observed)",
                          _p(inherited=w.inherited, needed=len(w.needed), observed=len(w.observed)),
                          ("ranges",), ("ranges",), memory.RUNTIME[w.backend]))
    return ops


def lower_mixed_precision(ctx: Context) -> list[PlanOp]:
    mp, search = ctx.ir.mixed_precision, ctx.workload.search
    if mp is None or search is None:
        return []
    w = ctx.workload
    chunk = min(w.chunk, search.samples)
    chunks = math.ceil(search.samples / chunk)
    cost = {"snr": f"weights only: each searched weight rounded {search.choices} ways",
            "mse": f"{chunks} forward pass(es) of {chunk} samples for XᵀX",
            "kld": (f"{chunks} × (2 forward + 1 backward) passes of {chunk} samples (first-order estimate)"
                    if w.backend is Backend.TORCH else
                    f"{chunks} × {1 + search.units * search.choices} forward passes of {chunk} samples "
                    "(each unit under each choice, measured)")}[search.metric]
    where = ctx.ir.memory.disk or "$QRC_CACHE"
    score = PlanOp(OpKind.SCORE_SENSITIVITY, f"score {search.units} units ({search.params:,} params) by {search.metric} "
                   f"for {', '.join(mp.choices)}: {cost}; cached by content hash under {where}/sensitivity",
                   _p(metric=search.metric, units=search.units, samples=search.samples, params=search.params),
                   ("model",) if search.metric == "snr" else ("model", "calibration_data"), ("sensitivity",),
                   memory.score_phase(w, chunk).bytes)
    assign = PlanOp(OpKind.ASSIGN_PRECISION, f"greedy: the most loss saved per extra bit first, never above "
                    f"{mp.budget_bits:g} bits per weight (scales included); a group is one unit, so it never ends "
                    "mixed", _p(budget_bits=mp.budget_bits, choices=",".join(mp.choices)),
                    ("sensitivity",), ("precision",), memory.RUNTIME[w.backend])
    return [score, assign]


def lower_quantize(ctx: Context) -> list[PlanOp]:
    w = ctx.workload
    done_in_blocks = w.backend is Backend.TORCH and w.calibrate
    names = [n for n in w.quantized_layers if not (done_in_blocks and ctx.assignment.of(n).layer.block)]
    if not names:
        return []
    onnx_ranges = w.observed and w.backend is Backend.ONNX  # torch: layers after the blocks observe their own inputs
    inputs = (["model"] + (["ranges"] if onnx_ranges else []) + (["block_inputs"] if done_in_blocks else [])
              + (["precision"] if ctx.ir.mixed_precision else []))
    roundings = sorted({ctx.assignment.of(n).scheme.rounding.value for n in names})
    summary = f"round {len(names)} weights ({', '.join(roundings)}), streamed: load → quantize → write → free"
    peak = ctx.phase("quantize") if w.backend is Backend.ONNX else ctx.phase("calibrate")
    return [PlanOp(OpKind.QUANTIZE_WEIGHTS, summary, _p(layers=len(names), rounding=",".join(roundings)),
                   tuple(inputs), ("qparams",), peak, repeat=len(names), layers=tuple(names))]


def lower_emit(ctx: Context) -> list[PlanOp]:
    w, emit = ctx.workload, ctx.ir.emit
    fmt = emit.format.value if emit else ("qdq" if w.backend is Backend.ONNX else "safetensors")
    path = emit.path if emit else "(-o PATH)"
    if w.backend is Backend.TORCH:  # streamed: rounded tensors went out with their block; the rest is copied as bytes
        peak = memory.RUNTIME[w.backend] + memory.COPY_SLICE
    else:
        peak = memory.RUNTIME[w.backend] + 2 * w.quantized_bytes  # the model and its serialized copy
    inputs = ("model", "qparams") + (("ranges",) if w.observed and w.backend is Backend.ONNX else ())
    return [PlanOp(OpKind.EMIT, f"write {fmt} to {path} atomically (temp file + rename), "
                   f"{human_bytes(w.quantized_bytes)} of weights", _p(format=fmt, path=path, bytes=w.quantized_bytes),
                   inputs, ("emitted_model",), peak)]


def lower_verify(ctx: Context) -> list[PlanOp]:
    v = ctx.ir.verify
    if v is None:
        return []
    w = ctx.workload
    peak = ctx.phase("verify") if w.backend is Backend.ONNX else ctx.phase("calibrate")
    return [PlanOp(OpKind.VERIFY, f"run float and emitted model on {v.samples} held-out samples; "
                   f"fail (Q501) unless {v.metric.value} {v.bound.value} {v.threshold:g}",
                   _p(samples=v.samples, metric=v.metric.value, bound=f"{v.bound.value} {v.threshold:g}"),
                   ("model", "emitted_model", "verify_data"), ("verify_report",), peak)]


PASSES: tuple[Callable[[Context], list[PlanOp]], ...] = (
    lower_load, lower_mode, lower_calibration, lower_ranges, lower_mixed_precision, lower_quantize, lower_emit,
    lower_verify,
)


def lower(ctx: Context) -> tuple[PlanOp, ...]:
    ops: list[PlanOp] = []
    for lowering in PASSES:
        ops.extend(lowering(ctx))
    return tuple(ops)


