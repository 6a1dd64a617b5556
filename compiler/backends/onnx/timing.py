"""The ONNX backend's time per op (compiler.plan.timing counts the work; this says what onnxruntime spends on
it): a light start, a session made (and its graph optimised) by each op that runs the model, the model
serialised at emit, an HF folder's export traced in a process of its own."""

from __future__ import annotations

from compiler.backends.onnx.export_decoder import DECODER_FAMILIES
from compiler.backends.onnx.output_streams import streams_output
from compiler.ir.types import MemoryMode
from compiler.plan import ops
from compiler.plan.timing import (
    Estimate,
    Rates,
    by_kind,
    forward,
    gptq_seconds,
    hessian_seconds,
    reading,
    rotation_seconds,
    rounded_bytes,
    score_seconds,
    smooth_seconds,
)
from compiler.plan.workload import Workload

# on the reference machine (plan/timing.py REFERENCE): the process start to the first op (1.7-2.3 s through the
# CLI); a session's creation, 30 ms and its weights at 400 MB/s; a model's serialisation and onnxruntime's load
# check at 150 MB/s (80 before the check read the bytes as they were written: on a 1.16x machine, measured 0.9 s
# for the real SmolLM2's 176 MB of int4, 0.7 s for a 187 MB one and 1.5 s for a 229 MB QDQ W8A8, where 80 MB/s
# planned 1.9, 2.0 and 2.5 s); an export: its child process with torch and transformers (3 s), then torch.onnx's tracing
# and writing at about 10 MB/s of float weights (MiniLM's 87 MB 11 s, a 150 MB Llama 19 s)
START, SESSION, SESSION_RATE, EMIT_RATE, EXPORT_START, EXPORT_RATE = 1.9, 0.03, 400e6, 150e6, 3.0, 10e6


def start_seconds(rates: Rates) -> float:
    """Before the first op: the interpreter, the CLI, the check and the plan (onnxruntime imports lightly)."""
    return rates.fixed(START)


def _session(w: Workload, rates: Rates, sessions: int = 1) -> float:
    """`sessions` sessions of the whole model; in offload, of its segments (each loads its own weights)."""
    return sessions * rates.fixed(SESSION) + w.weights_bytes / (SESSION_RATE * rates.speed)


# a decoder's export (torch.onnx's dynamo exporter and onnxscript's passes) grows faster than its blocks: on a
# machine 1.14x the reference (2026-12-06) random Llamas of hidden 64 and 2, 12 and 30 blocks took 10.8, 28.7 and
# 78.2 s, and the real SmolLM2-135M (30 blocks, 540 MB of float32) 100.4 s: a start, a cost per block and per pair
# of blocks, and the weights at about 21 MB/s. The 2- and 6-block fit before (a 1.86x machine, 2026-12-03: 11.5
# and 12.9 s for 150 and 35 MB) had planned SmolLM2's export at 55 s; these constants give those two 0.88-0.91x
DYNAMO_EXPORT_START, DYNAMO_EXPORT_BLOCK, DYNAMO_EXPORT_BLOCK_PAIR, DYNAMO_EXPORT_RATE = 9.2, 1.49, 0.039, 21e6
# onnxruntime-genai's builder (export_builder.py) takes an untied float32 folder with a fast tokenizer in a fraction of
# that: its child process starting torch and transformers, then about 120 MB/s of float32 weights read and written.
# On a machine 1.03x the reference (2026-12-07), untied random Llamas of 2 blocks (26 MB), 12 blocks of hidden 512 (146
# MB) and 6 of hidden 1024 (279 MB) exported in 7.4-10.2, 9.3 and 10.9 s (a compile exporting less the same compile
# from the cache); held out, a SmolLM2-135M shape untied (30 blocks, 623 MB) in 13.5 s, planned 14.0
BUILDER_EXPORT_START, BUILDER_EXPORT_RATE = 8.8, 117e6


def _export(op, w: Workload, rates: Rates, mode: MemoryMode) -> float:
    # nothing when the plan was made against the cached export (its graph is the index's)
    if w.index.graph is not None:
        return 0.0
    if op.exporter is ops.Exporter.GENAI_BUILDER:
        return rates.fixed(BUILDER_EXPORT_START) + w.weights_bytes / (BUILDER_EXPORT_RATE * rates.speed)
    if w.index.family in DECODER_FAMILIES:
        blocks = len(w.blocks)
        return (rates.fixed(DYNAMO_EXPORT_START + DYNAMO_EXPORT_BLOCK * blocks + DYNAMO_EXPORT_BLOCK_PAIR * blocks ** 2)
                + w.weights_bytes / (DYNAMO_EXPORT_RATE * rates.speed))
    return rates.fixed(EXPORT_START) + w.weights_bytes / (EXPORT_RATE * rates.speed)


# GPTQ's Hessian sums here are numpy's float64 products of whole inputs (quant/gptq.py HessianObserver): float64
# runs at half float32's rate, and the whole XᵀX takes 1.6-1.7x the upper triangle torch sums, so about 4x the
# torch backend's cost of the same sums (plan/timing.py hessian_seconds)
HESSIAN_COST = 4.0
# GPTQ's rounding here (numpy's column loop over float64 factors) against the torch backend's, whose rates the plan
# holds: an exported random Llama of 2 blocks, hidden 512, rounded its W4A16 layers in 1.78 s where the torch
# rates planned 0.96 (2026-12-03)
GPTQ_COST = 1.8
# rounding here (the weights read from the data file, rounded and packed for MatMulNBits or QDQ) against the torch
# backend's rate, which counts reading a checkpoint's shards and writing safetensors too: the real SmolLM2-135M
# exported by the builder rounded its 150 weights rtn in 0.5 s (int4) and 0.8 s (int8) where that rate planned 1.5
# (2026-12-05, a machine 1.12x the reference)
ROUNDING_COST = 0.42
# a histogram observer's update (calibrate.py: numpy's histogram of each observed tensor, chunk by chunk), in bytes
# at the rounding rate per value observed: MiniLM's 132M observed values took 1.1 s of its calibration beyond
# the forwards on a machine 1.73x the reference (2026-12-03)
HISTOGRAM_BYTES = 3.5


# onnxruntime's CPU Where selects from each branch, then merges (where_op.cc), in a loop of per-element broadcast
# calls: torch.onnx's attention ends in one over its [heads, seq, total] scores (zeroing the NaNs of fully masked
# rows). On the real SmolLM2's export it took 3.13 s of a chunk's 11.0 (8 samples of 512 tokens, 566M elements:
# onnxruntime's profiler, 2026-12-06, a machine 1.14x the reference), which the products' rate never counted
WHERE_ELEMENT = 6.3e-9  # seconds per element on the reference machine


def _forward(w: Workload, rates: Rates, samples: float, blocks_only: bool = False) -> float:
    """`samples` through the graph: its products (plan/timing.py) and its Where nodes' elements."""
    return forward(w, rates, samples, blocks_only) + samples * _where_elements(w) * rates.fixed(WHERE_ELEMENT)


def _where_elements(w: Workload) -> int:
    """The elements the graph's Where nodes write for one sample: from the graph, or, before a decoder's export,
    one [heads, seq, seq] per block (the attention torch.onnx writes)."""
    graph = w.index.graph
    if graph is not None:
        wheres = [o for n in graph.nodes if n.op == "Where" for o in n.outputs]
        if not wheres:
            return 0
        sizes = graph.value_bytes(graph.sizes(1, w.seqlen, w.past), w.seqlen)
        return sum(sizes.get(o, 0) // _element_bytes(graph.value(o)) for o in wheres)
    if w.index.family not in DECODER_FAMILIES:
        return 0
    heads = w.index.config_value("num_attention_heads") or 0
    return len(w.blocks) * heads * w.seqlen * (w.seqlen + w.past)


def _element_bytes(value) -> int:
    """A graph value's bytes per element (float32's where the graph does not say)."""
    return max(value.elem_bytes, 1) if value is not None else 4


def _calibrate(op, w: Workload, rates: Rates, mode: MemoryMode) -> float:
    # GPTQ's Hessians are summed chunk by chunk from the inputs the session returns; the calibration graph runs
    # what the observed tensors need, so the LM head only where its own input is observed (before an export the
    # index counts a tied head the exported graph's calibration never runs: 53 s planned where 45 were measured)
    fetched = set(w.fetched)
    head = any(x.block is None and x.input in fetched for x in w.index.layers)
    return (op.passes * _session(w, rates) + reading(w, rates, True)
            + op.passes * _forward(w, rates, w.samples, blocks_only=not head)
            + HESSIAN_COST * hessian_seconds(w, rates) + _histograms(w, rates))


def _histograms(w: Workload, rates: Rates) -> float:
    """The histogram observers' updates over every calibration sample (none for minmax)."""
    graph = w.index.graph
    if not w.histograms or graph is None:
        return 0.0
    sizes = graph.value_bytes(graph.sizes(1, w.seqlen, w.past), w.seqlen)
    values = sum(sizes.get(name, 0) // 4 for name in w.observed)  # float32 values of one sample
    return w.samples * values * HISTOGRAM_BYTES / rates.rounding


def _cache_inputs(op, w: Workload, rates: Rates, mode: MemoryMode) -> float:
    # offload's observers made; its sessions are run_block's (measured 0.00 s on the exported decoder, where a
    # whole-model session had been planned)
    return reading(w, rates, True)


def _run_block(op, w: Workload, rates: Rates, mode: MemoryMode) -> float:
    """Every segment (the op's repeats): a session each, the calibration stream, GPTQ (a segment's layers are
    rounded once it has seen every chunk), the rounding."""
    return (_session(w, rates, op.repeat) + _forward(w, rates, w.samples, blocks_only=True)
            + HESSIAN_COST * hessian_seconds(w, rates) + GPTQ_COST * gptq_seconds(w, rates)
            + rounded_bytes(w) / rates.rounding
            + _histograms(w, rates))


def _verify(op, w: Workload, rates: Rates, mode: MemoryMode) -> float:
    # offload: a session per segment (a block each, and what is outside them) for each of the two models
    sessions = len(w.blocks) + 1 if mode is MemoryMode.OFFLOAD else 1
    return 2 * _session(w, rates, sessions) + reading(w, rates, False) + 2 * _forward(w, rates, op.samples)


def _load(op, w: Workload, rates: Rates, mode: MemoryMode) -> float:
    """The graph only; a rotation's copy of the model: every rotated tensor (numpy's Kronecker products at
    ONNX_ROTATION times the torch backend's rate, plan/timing.py), the weights read and written once more, and the
    check's session of each model reading them (rotation.refuse_changed)."""
    if op.rotation is None:
        return 0.0
    return ONNX_ROTATION * rotation_seconds(w, rates) + 3 * w.weights_bytes / rates.disk


# the ONNX backend's rotation (numpy, its copy written, the check's two sessions) against the torch backend's rate,
# with the weights passed three times at the disk's rate: the real SmolLM2 exported by the builder took 3.0-3.3 s at
# load and a random 1024-wide Llama 2.6-2.9 s (2026-12-05, 1.16x the reference, two runs each), where the torch
# rate planned the rotation alone at 1.86 and 1.75 s
ONNX_ROTATION = 0.5


def _quantize(op, w: Workload, rates: Rates) -> float:
    """The op's rounding at ROUNDING_COST, its GPTQ layers at GPTQ_COST times the torch backend's rate."""
    layers = op.layers or tuple(w.quantized_layers)
    return ROUNDING_COST * rounded_bytes(w, layers) / rates.rounding + GPTQ_COST * gptq_seconds(w, rates, layers)


def _emit(op, w: Workload, rates: Rates, mode: MemoryMode) -> float:
    # serialised whole, or (offload, a large output) its weights already streamed and the rest copied at the disk's
    # rate (the exported decoder's offload emit: 0.43 s measured where serialising its bytes planned 0.93)
    return op.bytes / (rates.disk if streams_output(w, mode) else EMIT_RATE * rates.speed)


ESTIMATES: dict[ops.OpKind, Estimate] = {
    ops.OpKind.EXPORT_ONNX: _export, ops.OpKind.LOAD_MODEL: _load, ops.OpKind.CALIBRATE_CHUNK: _calibrate,
    ops.OpKind.CACHE_BLOCK_INPUTS: _cache_inputs, ops.OpKind.RUN_BLOCK: _run_block, ops.OpKind.VERIFY: _verify,
    ops.OpKind.SMOOTH: lambda op, w, rates, mode: _session(w, rates) + smooth_seconds(w, rates),
    ops.OpKind.QUANTIZE_WEIGHTS: lambda op, w, rates, mode: _quantize(op, w, rates),
    ops.OpKind.EMIT: lambda op, w, rates, mode: _emit(op, w, rates, mode),
    ops.OpKind.SCORE_SENSITIVITY: lambda op, w, rates, mode: score_seconds(op, w, rates, _session(w, rates)),
}  # the others (mode selection, range search and propagation) take no measurable time


def seconds(op: ops.PlanOp, w: Workload, rates: Rates, mode: MemoryMode) -> float:
    """One op's estimated seconds, all its repeats together."""
    return by_kind(ESTIMATES, op, w, rates, mode)
