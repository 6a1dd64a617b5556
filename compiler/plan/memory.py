"""The memory model: the estimated peak resident bytes of each memory mode, from the model index alone.

Every constant is here and documented in the README ("Reading a plan"). Estimates are per phase
(calibration, quantization, verification); a mode's peak is the largest phase. The backends check the
estimates against measured peaks (the compile summary shows both).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from compiler.ir.types import Backend, CalibrationMethod, MemoryMode
from compiler.plan.activations import calibration_peak, needed_nodes, peak, segment_outputs, segment_runs
from compiler.plan.ops import ModeEstimate
from compiler.plan.workload import Workload

MiB = 1 << 20
RUNTIME = {Backend.ONNX: 128 * MiB, Backend.TORCH: 400 * MiB}  # interpreter, libraries, session setup (ONNX: measured)
SESSION_COPIES = 1  # ONNX: weights live once, in the session (read from external data, prepacking off)
ACT_BYTES = 4  # activations are computed in float32 on CPU
HIST_STATE = 2 * 8  # per bin: int64 counts, plus the scratch histogram of the chunk being merged
MINMAX_STATE = 64  # per tensor: running min/max, counts of non-finite values
CACHE_COPIES = {MemoryMode.FULL: 0, MemoryMode.LOW_MEMORY: 2, MemoryMode.OFFLOAD: 2, MemoryMode.MULTI_GPU: 2}
VRAM_SLACK = 1.2  # Olive's factor over the computed GPU footprint
CUDA_HOST = 800 * MiB  # host memory of the CUDA context and kernel libraries (measured on an H100: +0.75 GiB RSS)
SLICE_BYTES = 16 << 20  # the ONNX backend rounds large weights in slices of output channels of this size
COPY_SLICE = 16 << 20  # the torch backend copies unquantized tensors to its output in slices of this size


@dataclass(frozen=True, slots=True)
class Phase:
    name: str
    bytes: int
    parts: tuple[tuple[str, int], ...]


def observer_bytes(w: Workload) -> int:
    per = MINMAX_STATE if w.method is CalibrationMethod.MINMAX else w.bins * HIST_STATE + MINMAX_STATE
    return per * len(w.observed)


# ---- ONNX ----------------------------------------------------------------------------------------

def onnx_calibration(w: Workload, mode: MemoryMode, chunk: int, passes: int = 1) -> Phase:
    graph = w.index.graph
    runtime = RUNTIME[Backend.ONNX]
    if mode is MemoryMode.OFFLOAD:
        seg_weights, seg_act = _largest_segment(w, chunk)
        cache = _boundary_cache(w, chunk)
        parts = (("runtime", runtime), ("weights of one segment", SESSION_COPIES * seg_weights),
                 ("segment activations", seg_act), ("block-boundary cache", cache), ("observers", observer_bytes(w)))
    else:
        group = _observed_group(w, passes)
        act = calibration_peak(graph, group, chunk, w.seqlen).bytes if graph and group else 0
        parts = (("runtime", runtime), ("session weights", SESSION_COPIES * w.weights_bytes),
                 (f"activations of one chunk ({chunk} samples)", act), ("observers", observer_bytes(w)))
    return Phase("calibrate", sum(b for _, b in parts), parts)


def _observed_group(w: Workload, passes: int) -> tuple[str, ...]:
    """The largest group when the observed tensors are split in order into `passes` passes."""
    if not w.observed:
        return ()
    size = math.ceil(len(w.observed) / max(passes, 1))
    groups = [w.observed[i:i + size] for i in range(0, len(w.observed), size)] or [()]
    graph = w.index.graph
    if not graph:
        return groups[0]
    return max(groups, key=lambda g: calibration_peak(graph, g, 1, w.seqlen).bytes)


def _segment_weights(w: Workload) -> int:
    """Layers outside blocks join a neighbouring block's segment: the embeddings the first, the rest the
    last (the backend's cut); the largest segment's weights."""
    sizes = dict(w.block_bytes())
    outside = sizes.pop("(outside blocks)", 0)
    if not sizes:
        return outside
    blocks = list(sizes)
    layers = w.index.layers
    first = next((i for i, x in enumerate(layers) if x.block), len(layers))
    before = sum(x.bytes for x in layers[:first])
    sizes[blocks[0]] += before
    sizes[blocks[-1]] += outside - before
    return max(sizes.values())


def _largest_segment(w: Workload, chunk: int, outputs: bool = False) -> tuple[int, int]:
    """(weights, activations) of the largest offload segment, cut as the backend cuts: a segment runs
    only the nodes for what later segments read, the observed tensors and, with `outputs`, the model's
    own outputs (verification)."""
    graph = w.index.graph
    if not graph:
        return _segment_weights(w), 0
    runs = segment_runs([n.name for n in graph.nodes])
    wanted = set(w.observed) | (set(graph.outputs) if outputs else set())
    worst = 0
    for index, (_, idx) in enumerate(runs):
        kept = set(segment_outputs(graph, runs, index, wanted))
        members = {graph.nodes[i].name for i in idx}
        needed = [n for n in needed_nodes(graph, kept) if n.name in members] if kept else []
        worst = max(worst, peak(graph, needed, kept, chunk, w.seqlen).bytes)
    return _segment_weights(w), worst


def _boundary_cache(w: Workload, chunk: int) -> int:
    """Block inputs and outputs of every sample in RAM, or of one chunk when they are cached on `disk`."""
    per_sample = w.seqlen * w.hidden * ACT_BYTES
    held = chunk if w.disk else w.samples
    return 2 * held * per_sample


def onnx_quantize(w: Workload, mode: MemoryMode) -> Phase:
    """Weights are read one at a time from external data and rounded in slices; the quantized model grows
    in memory (emit then holds it and its serialized copy: the plan's emit op)."""
    runtime = RUNTIME[Backend.ONNX]
    temps = 3 * min(w.largest_layer_bytes, SLICE_BYTES) + w.largest_layer_bytes  # one float weight + scratch of a slice
    parts = (("runtime", runtime), ("quantized weights so far", w.quantized_bytes),
             ("weight being rounded, and scratch", temps))
    return Phase("quantize", sum(b for _, b in parts), parts)


def onnx_verify(w: Workload, mode: MemoryMode, chunk: int) -> Phase:
    """Float and emitted model side by side on one chunk; every model output of both is held."""
    graph = w.index.graph
    runtime = RUNTIME[Backend.ONNX]
    if mode is MemoryMode.OFFLOAD:  # one segment session at a time, one sample at a time
        block_weights, block_act = _largest_segment(w, 1, outputs=True)
        outputs = sum(graph.value(o).bytes(1, w.seqlen, graph.batch_symbol)
                      for o in graph.outputs if graph.value(o)) if graph else 0
        parts = (("runtime", runtime), ("weights of one segment", block_weights),
                 ("its weights dequantized at run time (DequantizeLinear outputs)", block_weights),
                 ("segment activations", block_act), ("outputs of one sample, both models", 2 * outputs))
    else:
        act = 0
        if graph:
            kept = set(graph.outputs)
            act = peak(graph, needed_nodes(graph, kept), kept, chunk, w.seqlen).bytes
        parts = (("runtime", runtime), ("float session", w.weights_bytes), ("quantized session", w.quantized_bytes),
                 ("activations of one chunk, both models", 2 * act))
    return Phase("verify", sum(b for _, b in parts), parts)


# ---- PyTorch -------------------------------------------------------------------------------------

def block_working_set(w: Workload) -> int:
    """Per-sample float32 working set of one block's forward (hidden states, attention scores, MLP)."""
    cfg = w.index.config_value
    h = cfg("hidden_size") or w.hidden
    heads = cfg("num_attention_heads") or max(1, h // 64)
    inter = cfg("intermediate_size") or 4 * h
    s = w.seqlen
    return ACT_BYTES * (4 * s * h + 2 * heads * s * s + 3 * s * inter)


_SHARED_INPUT = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "query": "qkv", "key": "qkv", "value": "qkv",
                 "wq": "qkv", "wk": "qkv", "wv": "qkv", "gate_proj": "gate_up", "up_proj": "gate_up", "w1": "gate_up",
                 "w3": "gate_up"}


def _input_key(x) -> tuple:
    """Layers reading the same tensor share a key: the graph value on ONNX; on torch (no graph), the
    parent module and the known siblings (q/k/v, gate/up)."""
    if not x.input.endswith(":input"):
        return (x.input,)
    parent, _, leaf = x.name.rpartition(".")
    return (parent, x.in_features, _SHARED_INPUT.get(leaf.lower(), leaf))


def hessian_bytes(w: Workload, all_blocks: bool = False) -> int:
    """GPTQ: one K_in × K_in float32 Hessian per distinct layer input (q/k/v share one, gate/up one) of
    the block being quantized, or of every block at once (`full` runs the whole model with hooks)."""
    if not w.gptq:
        return 0
    quantized = set(w.quantized_layers)
    per_block: dict[str | None, dict] = {}
    for x in w.index.layers:
        if x.kind == "Linear" and x.name in quantized:
            per_block.setdefault(x.block, {})[_input_key(x)] = x.in_features
    sizes = [sum(k * k * 4 for k in inputs.values()) for inputs in per_block.values()]
    return sum(sizes) if all_blocks else max(sizes, default=0)


def torch_phase(w: Workload, mode: MemoryMode, chunk: int) -> Phase:
    cache_ps = w.seqlen * w.hidden * _dtype_bytes(w)
    copies = CACHE_COPIES[mode]
    held = chunk if (mode is MemoryMode.OFFLOAD and w.disk) else w.samples
    cache = copies * held * cache_ps if w.calibrate else 0
    work = chunk * block_working_set(w) if w.calibrate else 0
    if mode is MemoryMode.FULL and w.calibrate:  # the whole model runs: its outputs (logits) and a copy
        last = w.index.layers[-1].out_features if w.index.layers else w.hidden
        work += 2 * chunk * w.seqlen * last * ACT_BYTES
    if mode is MemoryMode.OFFLOAD:
        weights, label = _offload_weights(w), "weights of one block (or of what is outside the blocks)"
    elif mode is MemoryMode.MULTI_GPU:
        weights, label = 0, "weights (on the GPUs)"
    else:
        weights, label = w.weights_bytes + max(w.block_bytes().values(), default=0), "weights"
    runtime = RUNTIME[Backend.TORCH] + (CUDA_HOST if mode is MemoryMode.MULTI_GPU else 0)
    parts = (("runtime" + (" with CUDA" if mode is MemoryMode.MULTI_GPU else ""), runtime), (label, weights),
             (f"block caches ({copies} copies)", cache),
             (f"block working set ({chunk} samples)", work if mode is not MemoryMode.MULTI_GPU else 0),
             ("GPTQ Hessians (+ scratch of one)", hessian_bytes(w, all_blocks=mode is MemoryMode.FULL)
              + _gptq_scratch(w) if mode is not MemoryMode.MULTI_GPU else 0))
    return Phase("block-wise compile", sum(b for _, b in parts), parts)


def _gptq_scratch(w: Workload) -> int:
    """Rounding one layer with GPTQ holds its Hessian about six more times in float32 (its mean, the
    copy on the device, the Cholesky factor, its inverse, the factor of the inverse, a permutation) and
    its weight about eight times (float copies, permuted copy, per-column scales and zero points, the
    rounded and dequantized results). Measured: bench/torch_modes.py."""
    if not w.gptq:
        return 0
    quantized = [x for x in w.index.layers if x.name in set(w.gptq_layers) and x.kind == "Linear"]
    k = max((x.in_features for x in quantized), default=0)
    weight = max((x.params * 4 for x in quantized), default=0)
    return 6 * k * k * 4 + 8 * weight


def _offload_weights(w: Workload) -> int:
    """Offload holds one block's float weights, or what runs outside the blocks: the embeddings while the
    first block's inputs are cached, and everything outside when the model's tail must run (verification,
    or a layer there that needs data); plus rounding scratch for one layer (its float copy, the rounded
    values, the dequantized weight the block then computes with)."""
    sizes = w.block_bytes()
    outside = sizes.pop("(outside blocks)", 0)
    layers = w.index.layers
    first = next((i for i, x in enumerate(layers) if x.block), len(layers))
    head = sum(x.bytes for x in layers[:first])
    quantized = set(w.quantized_layers)
    tail_needs_data = (w.gptq or bool(w.observed)) and any(x.block is None and x.name in quantized for x in layers[first:])
    resident = outside if (w.verify_samples or tail_needs_data) else head if (w.calibrate or w.verify_samples) else 0
    scratch = 3 * max((x.bytes for x in layers if x.name in quantized), default=0)
    return max(max(sizes.values(), default=0), resident) + scratch


def torch_vram(w: Workload, chunk: int) -> int:
    """Olive's formula for a resident model on GPUs, plus one chunk's working set."""
    linear = sum(x.params for x in w.index.layers if x.kind == "Linear")
    param = w.weights_bytes
    full = (2 * param + 4 * linear + 0.2 * param) * VRAM_SLACK if w.kld_gradient else param * VRAM_SLACK
    return int(full + chunk * block_working_set(w) + hessian_bytes(w))


def score_phase(w: Workload, chunk: int) -> Phase:
    """The mixed-precision search's scoring (compiler/backends/sensitivity.py). snr reads one weight at a
    time; mse runs the float model once with every searched layer's XᵀX (float64) held; kld holds every
    searched weight in float32 under each choice, and on torch their gradients and the backward pass's
    saved activations (one block's working set per block)."""
    search = w.search
    runtime = RUNTIME[w.backend]
    rounding = 3 * 4 * search.largest_params  # one float32 weight, its rounded copy, the error
    if search.metric == "snr":
        parts = (("runtime", runtime), ("one weight rounded under each choice", rounding))
        return Phase("score", sum(b for _, b in parts), parts)
    resident = w.weights_bytes if w.backend is Backend.ONNX else w.weights_bytes * 4 // _dtype_bytes(w)
    graph = w.index.graph
    if w.backend is Backend.ONNX and graph:
        kept = set(graph.outputs)
        act = peak(graph, needed_nodes(graph, kept), kept, chunk, w.seqlen).bytes
    else:
        act = chunk * block_working_set(w) * (1 + (len(w.blocks) if search.metric == "kld" else 0))
    last = w.index.layers[-1].out_features if w.index.layers else w.hidden
    logits = 3 * chunk * w.seqlen * last * ACT_BYTES  # float and candidate outputs, and a log-softmax
    parts = [("runtime", runtime), ("float model" + (" (float32)" if w.backend is Backend.TORCH else ""), resident),
             ("activations of one chunk" + (" saved for the backward pass" if search.metric == "kld" and
                                             w.backend is Backend.TORCH else ""), act)]
    if search.metric == "mse":
        layers = [w.index.layer(n) for n in search.layers]
        grams = sum(8 * k * k for k in {_input_key(x): x.in_features for x in layers}.values())
        parts += [("XᵀX of each distinct searched input (float64)", grams), ("rounding scratch", rounding)]
    else:
        copies = search.choices + (1 if w.backend is Backend.TORCH else 0)  # each choice's weights (+ gradients)
        parts += [(f"searched weights × {copies} (float32)", copies * 4 * search.params), ("model outputs", logits)]
    return Phase("score", sum(b for _, b in parts), tuple(parts))


def _dtype_bytes(w: Workload) -> int:
    dtypes = {x.dtype for x in w.index.layers}
    return 2 if dtypes and dtypes <= {"float16", "bfloat16"} else 4


# ---- per mode ------------------------------------------------------------------------------------

def estimate(w: Workload, mode: MemoryMode, chunk: int, passes: int = 1, gpus: tuple[int, ...] = ()) -> ModeEstimate:
    """The peak of a mode: the largest of its phases."""
    if w.backend is Backend.ONNX:
        if mode is MemoryMode.MULTI_GPU:
            return ModeEstimate(mode, 0, (), feasible=False, note="the ONNX backend runs on one device")
        phases = [onnx_quantize(w, mode)]
        if w.calibrate:
            phases.append(onnx_calibration(w, mode, chunk, passes))
        if w.verify_samples:
            phases.append(onnx_verify(w, mode, min(chunk, w.verify_samples)))
        vram = 0
    else:
        if mode is MemoryMode.MULTI_GPU and not gpus:
            return ModeEstimate(mode, 0, (), feasible=False, note="no GPUs (`vram`) given")
        phases = [torch_phase(w, mode, chunk)]
        vram = torch_vram(w, chunk) if mode is MemoryMode.MULTI_GPU else 0
    if w.search is not None:
        phases.append(score_phase(w, min(chunk, w.search.samples)))
    worst = max(phases, key=lambda p: p.bytes)
    note = f"peak in {worst.name}" + (f", {passes} passes over the data" if passes > 1 else "")
    return ModeEstimate(mode, worst.bytes, worst.parts, peak_vram=vram, note=note)

