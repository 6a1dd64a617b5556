"""The torch backend's memory model: what its block-wise execution holds (the planner asks it through the
backend's spec; constants documented in docs/memory.md, "Reading a plan"). No torch import: planning stays light."""

from __future__ import annotations

from dataclasses import dataclass

from compiler.backends.torch import timing
from compiler.backends.torch.formats import torch_format
from compiler.backends.torch.gguf_source_memory import source_tensor_bytes, whole_copy_bytes
from compiler.ir.types import Backend, EmitFormat, MemoryMode, SensitivityMetric
from compiler.models.index import LayerKind, ModelFormat
from compiler.plan.decision import ModeEstimate
from compiler.plan.memory import (
    ACT_BYTES,
    MiB,
    Phase,
    agreement_scratch,
    block_working_set,
    dtype_bytes,
    gptq_scratch,
    hessian_bytes,
    input_widths,
    learned_bytes,
    mode_estimate,
    score_phase,
    transform_bytes,
)
from compiler.plan.ops import PlanOp
from compiler.plan.target import PhaseName
from compiler.plan.timing import Rates
from compiler.plan.workload import Workload, untied_heads
from compiler.quant.loop_cache import LoopModule, uncached
from compiler.quant.rotations import SLICE as ROTATION_SLICE
from compiler.quant.rotations import factor_orders
from compiler.resolve.rotation_widths import widths

# interpreter, torch, transformers and compressed-tensors (imported to check the output's config before any work);
# measured at the first op: 423-425 MiB for built-ins, 414-442 before an HF folder's weights (2026-11-27)
RUNTIME = 424 * MiB
# a run file to file imports neither transformers nor compressed-tensors: interpreter, torch, numpy, safetensors
# and the GGUF writer's package, measured at 254-264 MiB compiling a 2.4 MiB Llama to GGUF (2026-11-27)
FILES_RUNTIME = 256 * MiB
# a folder written file to file has its config and load check made in a process of its own (torch/check_process.py):
# an interpreter with torch, transformers and compressed-tensors, and the meta-device models of the load check.
# Its peak (VmHWM) measured 402 MiB for the schema check alone, 448 with the load check of a 28-block Llama
CHECK_PROCESS = 440 * MiB
# the same process once its imports are done, waiting for the folder (409 MiB measured, 2026-12-03): what it holds
# while this process rounds. Its load check comes after the last tensor is written, when this process holds its
# runtime and what its heap kept of a GGUF source's dequantized copy (SmolLM2-135M FP8 file to file: 399 + 439 MiB
# at the summed peak, 551 + 258 at this process's own, the child still importing)
CHECK_IMPORTED = 410 * MiB
# a compressed-tensors source folder is decompressed by compressed-tensors, which imports transformers: 168 MiB
# measured after torch, numpy and safetensors (2026-12-04), in a file-to-file run's own process too
DECOMPRESSING_IMPORTS = 168 * MiB
# an MXFP4 source's experts are decoded by transformers' MXFP4 integration, which imports transformers and its
# kernels' hub: 86 MiB measured after torch, numpy and gguf (2026-12-05)
MXFP4_DECODING_IMPORTS = 86 * MiB
CACHE_COPIES = {MemoryMode.FULL: 0, MemoryMode.LOW_MEMORY: 2, MemoryMode.OFFLOAD: 2, MemoryMode.MULTI_GPU: 2}
VRAM_SLACK = 1.2  # Olive's factor over the computed GPU footprint
CUDA_HOST = 800 * MiB  # host memory of the CUDA context and kernel libraries (measured on an H100: +0.75 GiB RSS)
COPY_SLICE = 16 << 20  # unquantized tensors are copied to the output in slices of this size
# numba and the compiled loops (quant/round_kernels.py, quant/histogram_kernel.py), loaded at the first weight
# rounded or the first input binned. Measured in a
# process that had imported torch and transformers: numba 53 MiB, the module 11, loading the cached code 61.
# Counted at 100, the memory-promise compiles that load it measure 0.95-1.02x their plans (at 125: 0.92-0.99x;
# some of its pages are shared with what torch loaded)
ROUNDING_KERNELS = 100 * MiB
# compressed-tensors' temporaries while the cores round slices of rows to a floating format (measured file to
# file on a 5.9 GiB bfloat16 Llama: NVFP4A16 840 MiB, MXFP4A16 791, FP8_BLOCK 758, W4A16 730, plan without it 713)
FLOAT_SCRATCH = 128 * MiB
# rtn/mse outside the compiled loop (weights.round_weight): each core's float32 slice, its rounded values and
# the mse search's squared errors, about 4 slices of layers.ROW_SLICE_BYTES (4 MiB; that module imports torch)
SLICE_SCRATCH = 16 * MiB


def _transformers_imports(w: Workload) -> int:
    """What a run file to file imports of transformers and compressed-tensors: both where compressed-tensors
    decompresses a source or rounds NVFP4 with given block scales (Workload.cast_nvfp4_layers: 525 MiB measured
    against 458 planned with the MXFP4 decoder's alone, a tiny gpt-oss's experts into a GGUF; 524 against 372 from a
    float one, 2026-12-06); transformers' MXFP4 decoder alone where an MXFP4 source's experts are only decoded."""
    if w.index.compressed_source or w.cast_nvfp4_layers:
        return DECOMPRESSING_IMPORTS
    return MXFP4_DECODING_IMPORTS if w.index.packed_experts else 0


def _forward_working_set(w: Workload, runs: int, positions: int = 0, last: int = 0) -> int:
    """A forward of `runs` samples: the block working set, the copy a layer that quantizes its input as it runs
    makes (layers.apply_quantized), and, where the whole model runs, its outputs at `positions` (of width `last`)
    and a copy."""
    return runs * (block_working_set(w) + 2 * positions * last * ACT_BYTES
                   + w.seqlen * w.quantized_input_width * ACT_BYTES)


def torch_phase(w: Workload, mode: MemoryMode, chunk: int, tail: bool = False) -> Phase:
    """The block-wise phase: weights held, block caches, one block's working set, GPTQ Hessians and scratch;
    `tail`: once the blocks are done, when a transform's statistics are left only for mappings outside them."""
    cache_ps = w.seqlen * w.hidden * dtype_bytes(w)
    # learned rounding runs block by block in `full` too (torch/lowering.py blockwise), with the calibration
    # samples' float stream beside the rounded one (its block's inputs and outputs: two copies more)
    copies = CACHE_COPIES[MemoryMode.LOW_MEMORY if mode is MemoryMode.FULL and w.learned_layers else mode] + \
        (2 if w.learned_layers else 0)
    held = chunk if (mode is MemoryMode.OFFLOAD and w.disk) else w.samples
    cache = copies * held * cache_ps if w.calibrate else 0
    last = w.index.layers[-1].out_features if w.index.layers else w.hidden
    runs = chunk if w.calibrate else min(chunk, w.verify_samples)  # without calibration only held-out samples
    held_runs = min(chunk, w.verify_samples)  # a held-out pass's samples
    work = _forward_working_set(w, runs) if w.calibrate or (w.verify_samples and mode is not MemoryMode.FULL) else 0
    fold_checked = False
    if mode is MemoryMode.FULL and (w.calibrate or w.verify_samples):  # the whole model runs on a chunk (of
        # calibration, or of the held-out samples before and after rounding): its outputs (logits) and a copy,
        # where a pass reads them (verification, an LM head that calibrates); else the head runs on the last
        # position only (model.forward's `last_logits_only`). The held-out passes run min(chunk, held-out
        # samples) at a time: the larger pass sets the working set (a Qwen2 with a 8,192-word head, 8 samples a
        # chunk and 4 held out: planned 1.08 GiB with 8 samples' logits, measured 0.89 GiB, 2026-12-05)
        calibration = _forward_working_set(w, chunk, w.seqlen if w.head_calibrates() else 1, last) if w.calibrate else 0
        held_out = _forward_working_set(w, held_runs, w.seqlen, last) if w.verify_samples else 0
        work = max(calibration, held_out)
        if w.transform is not None and w.calibrate:  # the fold check (smoother.run): one sample through the whole
            # model before and after the fold, its logits held twice and their difference, in the memory the
            # statistics pass's working set freed (static W8A8 after SmoothQuant on the real SmolLM2, a 49,152-word
            # head: 1.30-1.31 GiB measured against 1.16 planned without it, 2026-12-06)
            checked = _forward_working_set(w, 1) + 3 * w.seqlen * last * ACT_BYTES
            fold_checked, work = checked > work, max(work, checked)
    if timing.files_only(w):
        fmt = torch_format(w.emit_format)
        weights, label = _file_to_file(w) + source_tensor_bytes(w, fmt.encodes_whole_tensors), \
            "one tensor at a time, file to file (read, the next read ahead, rounded)"
        if fmt.opened_by_transformers:  # the runtime counts the check process at its load check, when this
            # process has given back what the rounding held (rounding.from_files); while tensors are rounded it
            # holds its imports: the larger of the two moments
            weights = max(weights + CHECK_IMPORTED - CHECK_PROCESS, 0)
            label += ", beside the check process's imports"
    elif mode is MemoryMode.OFFLOAD:
        weights, label = _offload_weights(w, work), "weights of one block (or of what is outside the blocks)"
    elif mode is MemoryMode.MULTI_GPU:
        weights, label = 0, "weights (on the GPUs)"
    else:
        weights, label = w.weights_bytes + _largest_rounded_block(w) + untied_head_bytes(w), "weights"
    runtime = _runtime(w) + (CUDA_HOST if mode is MemoryMode.MULTI_GPU else 0)
    on_cpu = mode is not MemoryMode.MULTI_GPU
    work = work if on_cpu else 0
    # GPTQ rounds a block's layers once its forward is done, so its scratch reuses the memory the forward's working
    # set freed: only what it needs beyond that is added (measured: bench/gptq_memory.py --working-set). File to
    # file, the weights' term counts the rounding. An output format's own rounding (GGUF's blocks) is held beside
    # the forwards: added whole (formats.py rounding_scratch)
    rounding = 0 if not on_cpu or timing.files_only(w) else \
        max(0, gptq_scratch(w) - work) if w.gptq else torch_format(w.emit_format).rounding_scratch(w)
    parts: tuple[tuple[str, int], ...] = (("runtime" + ("" if on_cpu else " with CUDA"), runtime), (label, weights),
             (f"block caches ({copies} copies)", cache),
             (f"block working set ({runs} samples)" + (", or the fold check's sample and its logits, before and "
                                                        "after" if fold_checked else ""), work),
             ("GPTQ Hessians", hessian_bytes(w, all_blocks=mode is MemoryMode.FULL) if on_cpu else 0),
             ("rounding scratch (GPTQ's beyond the working set, GGUF's blocks)", rounding),
             ("the block as rounded, verified beside the float one (GGUF)", _rounded_twin(w, mode)),
             (f"{w.transform.kind.name if w.transform else 'transform'} statistics (+ scratch of one mapping)",
              transform_bytes(w, all_blocks=mode is MemoryMode.FULL, tail=tail)),
             ("rotation (Q, H, a tensor rotated as it is read)", rotation_bytes(w)),
             # learned after the block's statistics pass, in the memory its forward freed
             ("learned rounding beyond the working set (a step's backward, offsets, float targets)",
              max(0, learned_bytes(w, timing.learning_compiled(w), float32_steps=timing.float32_steps()) - work)
              if on_cpu else 0))
    if w.ranks > 1 and w.gptq and mode is not MemoryMode.MULTI_GPU:
        parts += ((f"the {w.ranks} ranks' Hessians while they merge", _merging(w, mode is MemoryMode.FULL)),)
    if mode is MemoryMode.FULL and w.verify_samples:  # CaptureReference keeps them through calibration and
        # `verify`, whose quantized forward holds its own chunk's logits in the working set beside them (a built-in
        # Llama verified in full with FP8_DYNAMIC: 603-621 MiB measured at `verify` against 559 planned when the
        # last chunk's float outputs were taken for the working set's); the comparison runs after the forwards
        # whose working set is counted above, in memory they freed (StableLM verified in full: 693 MiB measured at
        # `verify` against 804 planned with the comparison's scratch added whole)
        per_sample = w.seqlen * last * 4
        parts += ((f"float outputs kept for verification ({w.verify_samples} samples)", w.verify_samples * per_sample),
                  ("comparing one sample (beyond the working set)",
                   max(0, agreement_scratch(per_sample, w.seqlen) - work)),
                  ("each layer's error against its float weight (one layer)",
                   attribution_bytes(w, held_runs)))  # in a held-out pass
    return Phase("block-wise compile", sum(b for _, b in parts), parts)


def verify_tail_phase(w: Workload, mode: MemoryMode, chunk: int) -> Phase:
    """Block-wise verification at the model's output: the block-wise phase, plus the float logits of every
    held-out sample when the tail has layers to round between the float and quantized passes (else one
    chunk's), one chunk of quantized logits, and the agreement's scratch (about seven float32 arrays of up to
    256 positions of one sample: the two logits, their difference, two log-softmaxes, a mask, a product)."""
    base = torch_phase(w, mode, chunk, tail=True)
    layers = w.index.layers
    vocab = layers[-1].out_features if layers else w.hidden
    per_sample = w.seqlen * vocab * 4  # logits are compared in float32
    verify_chunk = min(chunk, w.verify_samples)
    held = w.verify_samples if _tail_rounds(w) else verify_chunk
    sizes = w.block_bytes()
    # an HF folder's output is verified as transformers loads it, a block at a time; a built-in's has no loader
    # outside qrc, so its verification runs qrc's own model (lowering.lower_verify)
    loaded = w.index.format is ModelFormat.HF
    emitted = max(max(sizes.values(), default=0), sizes.get("(outside blocks)", 0)) if loaded else 0
    parts = base.parts + ((f"verification logits ({held} float + {verify_chunk} quantized samples, scratch)",
                           (held + verify_chunk) * per_sample + agreement_scratch(per_sample, w.seqlen)),
                          ("the emitted model as loaded (one block, or what is outside the blocks)", emitted),
                          ("each layer's error against its float weight (one layer)",
                           attribution_bytes(w, verify_chunk)))
    return Phase("verification at the output", sum(b for _, b in parts), parts)


def attribution_bytes(w: Workload, runs: int) -> int:
    """What naming the worst layers holds while the quantized verification stream runs (torch/attribution.py),
    inside one layer's forward, beside its working set: the float weight read again from the checkpoint, and the
    float32 reference output of `runs` samples with its difference and square. A built-in Llama verified in full
    with FP8_DYNAMIC measured 600-632 MiB against 575 planned without it (10-20 MiB of that was the hooks)."""
    names = set(w.quantized_layers)
    layers = [x for x in w.index.layers if x.name in names]
    if not layers:
        return 0
    weight = max(4 * x.params for x in layers)
    output = max(4 * runs * w.seqlen * x.out_features for x in layers)
    return weight + 3 * output


def rotation_bytes(w: Workload) -> int:
    """`transform quarot` (rotation.py): Q's (and an online D's) Kronecker factors and H in float32; the largest
    tensor it rotates read whole (float32)
    beside its rotated copy, since a rotated tensor is not copied a slice at a time; and one float32 slice of
    SLICE rows (or columns) of the hidden width, twice: the slice and its product."""
    if not w.rotated:  # R4 alone (after SmoothQuant): the stored matrix, formed once in float32
        return 2 * 4 * w.online_width ** 2
    hidden, head = widths(w.index)
    largest = max((x.params for x in w.index.layers), default=0)
    factors = sum(f * f for f in factor_orders(hidden) or ()) + sum(f * f for f in factor_orders(w.online_width) or ())
    rotated = 4 * (factors + (head or 0) ** 2) + 2 * 4 * largest + 2 * 4 * min(largest, ROTATION_SLICE * hidden)
    # the online rotation's matrix as the folder stores it, formed once in float32 (its last Kronecker product
    # beside the one before): 1536-wide 9 MiB, 14336-wide 784 MiB
    return max(rotated, 2 * 4 * (w.rotation_block or w.online_width) ** 2)


def learning_bytes(w: Workload, batch: int) -> int:
    """`learn_rotation` (spinquant.py) beside the runtime: the model resident with its blocks' Linears as float32
    folded copies and its head untied; each step's rotated and rounded weights (float32, every block Linear: the
    product, its rounding, the sum passed straight through, their gradients in the backward); and the activations
    autograd keeps for `batch` samples with the logits, their log-softmax and gradient. Fitted on the real
    SmolLM2-135M (512 tokens a sample): 3.37 GiB measured at batch 1, 4.29 at batch 2."""
    blocks = [x for x in w.index.layers if x.block is not None]
    linear = sum(x.params for x in blocks)
    resident = w.weights_bytes - sum(x.bytes for x in blocks) + 4 * linear + sum(x.bytes for x in untied_heads(w.index))
    hidden, _ = widths(w.index)
    inner = w.online_width or max((x.in_features for x in blocks if x.name.endswith("down_proj")), default=hidden)
    tokens = batch * w.seqlen
    vocab = max((x.out_features for x in w.index.layers if x.block is None), default=0)
    activations = LEARNING_ACTIVATION * tokens * len(w.blocks) * (12 * hidden + 8 * inner) + 3 * 4 * tokens * vocab
    return int(resident + LEARNING_WEIGHT_COPIES * 4 * linear + activations)


# fitted (learning_bytes): float32 copies of the block Linears a step holds, and bytes kept per activation value
LEARNING_WEIGHT_COPIES, LEARNING_ACTIVATION = 3.3, 2.4


def untied_head_bytes(w: Workload) -> int:
    """The LM head a rotation unties from the embeddings (rotation.py: the final norm folds into the head alone), a
    tensor of its own beside them where the whole model is resident; the checkpoint's bytes count the tied tensor
    once. The rotated SmolLM2 (tied, 108 MiB) in mode full measured 1.41-1.53 GiB against 1.28 planned without it."""
    return sum(x.bytes for x in untied_heads(w.index)) if w.rotated else 0


def _largest_rounded_block(w: Workload) -> int:
    """The quantized copy of one block beside the whole model (full, low_memory): the weights of the block whose
    quantized layers are largest. What is outside the blocks counts only for what is rounded there (a named LM
    head): SmolLM2-135M's float embedding and tied head had been counted, 216 MiB of a plan 0.85x measured."""
    names = set(w.quantized_layers)
    sizes: dict[str, int] = {}
    for layer in w.index.layers:
        if layer.name in names:
            sizes[layer.block or "(outside blocks)"] = sizes.get(layer.block or "(outside blocks)", 0) + layer.bytes
    return max(sizes.values(), default=0)


def _rounded_twin(w: Workload, mode: MemoryMode) -> int:
    """Where the output format's rounded blocks are what verification runs (GGUF's), block by block: each block's
    rounded copy (its float values) runs beside the float block on the held-out stream."""
    if not (torch_format(w.emit_format).rounded_copy_verified and w.verify_samples) \
            or mode in (MemoryMode.FULL, MemoryMode.MULTI_GPU) or timing.files_only(w):
        return 0
    return max((b for name, b in w.block_bytes().items() if name != "(outside blocks)"), default=0)


def _runtime(w: Workload) -> int:
    """The interpreter and what the run imports (TorchCosts.runtime), and the libraries."""
    return COSTS.runtime(w) + _libraries(w)


def _libraries(w: Workload) -> int:
    """What the run imports beyond the backend's runtime: the dataset readers, numba's compiled loops where the
    run calls any (`compiled_loops`), which stay loaded to the end of the run (the real SmolLM2-135M to an NVFP4
    GGUF measured 547 MiB against 434 planned without the floating formats' loop)."""
    return w.data_libraries + (ROUNDING_KERNELS if compiled_loops(w) else 0)


def compiled_loops(w: Workload) -> set[LoopModule]:
    """The modules of numba's compiled loops the run calls: rtn rounding, the input histograms, the floating
    formats' loop where a run file to file rounds them with it or an FP4 scale search runs in it (`rounding
    mse`/`imatrix`)."""
    float_loop = (timing.files_only(w) and w.float_rounded and w.float_kernel_rounded) or bool(w.fp4_searched_layers)
    uses = {LoopModule.ROUNDING: w.kernel_rounded, LoopModule.SEARCH: w.kernel_searched,
            LoopModule.HISTOGRAM: w.histograms, LoopModule.FLOAT: float_loop}
    called = {module for module, used in uses.items() if used}
    if called:  # each of the others calls the rounding module's helpers
        called.add(LoopModule.ROUNDING)
    return called


def _merging(w: Workload, all_blocks: bool) -> int:
    """Merging the ranks' GPTQ Hessians (torch/sharing.py) one input at a time, beyond this rank's float32 sums
    (counted as "GPTQ Hessians"): that input's sums as received from every rank and their float64 sum (2 more),
    beside the inputs merged before it, now float64 (twice their float32 sums). Counted as every rank's and the
    float64 sum of each input at once, StableLM's two ranks measured 0.94-0.95x their plans."""
    largest = max((k * k * 4 for k in input_widths(w, set(w.gptq_layers))), default=0)
    return hessian_bytes(w, all_blocks=all_blocks) + (w.ranks + 1) * largest


def _file_to_file(w: Workload) -> int:
    """Data-free rounding without a model: the largest quantized tensor as read (mapped), the next one read
    ahead while it is rounded, its integers (a byte a weight) and the packing's unsigned copy and packed
    bytes (under 2 more); rounded outside the compiled loop (mse, a float16 model's scales), also each core's
    float32 slice and the search's scratch (SLICE_SCRATCH). To a floating format by the compiled loop
    (quant/fused_float.py): the codes (at most a byte a weight; the loop's own code is a library: _libraries);
    by compressed-tensors' functions (a float16 model): up to 4 bytes a weight each for the float copy, the
    values and the packed bytes, and their temporaries. The weight
    before is still being written while one is rounded (rounding.from_files): its stored form, a byte a weight
    more. The config and load check run in a process of their own (the runtime: CHECK_PROCESS). Unquantized
    tensors are copied in slices."""
    names = set(w.quantized_layers)
    largest = max((x for x in w.index.layers if x.name in names), key=lambda x: x.params, default=None)
    if largest is None:
        return COPY_SLICE
    own = torch_format(w.emit_format).file_scratch(w)
    if own is not None:
        return own
    if w.float_rounded and w.float_kernel_rounded:  # the loop's code: _libraries
        return 2 * largest.bytes + 2 * largest.params + COPY_SLICE
    if w.float_rounded:
        return 3 * 4 * largest.params + largest.params + COPY_SLICE + FLOAT_SCRATCH
    return 2 * largest.bytes + 4 * largest.params + COPY_SLICE + (SLICE_SCRATCH if w.sliced_rounded else 0)


def _offload_weights(w: Workload, work: int) -> int:
    """Offload holds one block's float weights, or what runs outside the blocks: the embeddings while the
    first block's inputs are cached, and everything outside when the model's tail must run (verification,
    or a layer there that needs data); plus rounding scratch for one layer (its float copy, the rounded
    values, the dequantized weight the block then computes with). The embeddings alone are read for the
    caching and dropped before the first block runs (blockwise.cache_block_inputs), so they stand beside a
    block's weights and its working set (`work`), not on top of them: on the real SmolLM2-135M a 108 MiB
    embedding against 16 MiB blocks had put 92 MiB into an offload plan that no moment holds."""
    sizes = w.block_bytes()
    outside = sizes.pop("(outside blocks)", 0)
    layers = w.index.layers
    first = next((i for i, x in enumerate(layers) if x.block), len(layers))
    head = sum(x.bytes for x in layers[:first])
    quantized = set(w.quantized_layers)
    scratch = 3 * max((x.bytes for x in layers if x.name in quantized), default=0)
    block = max(sizes.values(), default=0)
    if w.verify_samples or _tail_needs_data(w):
        return max(block, outside) + scratch
    if w.calibrate:
        return max(block + scratch, head - work)
    return block + scratch


def _tail_needs_data(w: Workload) -> bool:
    """Whether a layer after the blocks rounds with data (GPTQ, or a static input range): only then does the
    tail run on the calibration stream (an rtn LM head is rounded from its weight alone)."""
    layers, gptq, needed = w.index.layers, set(w.gptq_layers) | set(w.imatrix_layers), set(w.needed)
    first = next((i for i, x in enumerate(layers) if x.block), len(layers))
    return any(x.block is None and (x.name in gptq or x.input in needed) for x in layers[first:])


def _tail_rounds(w: Workload) -> bool:
    """Whether layers after the blocks (a final projection, the LM head) are quantized."""
    layers, quantized = w.index.layers, set(w.quantized_layers)
    first = next((i for i, x in enumerate(layers) if x.block), len(layers))
    return any(x.block is None and x.name in quantized for x in layers[first:])


def torch_vram(w: Workload, chunk: int) -> int:
    """Olive's formula for a resident model on GPUs, plus one chunk's working set."""
    linear = sum(x.params for x in w.index.layers if x.kind is LayerKind.LINEAR)
    param = w.weights_bytes
    full = (2 * param + 4 * linear + 0.2 * param) * VRAM_SLACK if w.search is not None and w.search.metric is SensitivityMetric.KLD else param * VRAM_SLACK
    return int(full + chunk * block_working_set(w) + hessian_bytes(w))


@dataclass(frozen=True)
class TorchCosts:
    """The torch backend as the planner sees it (compiler.plan.target.CostModel)."""

    backend: Backend = Backend.TORCH
    default_format: EmitFormat = EmitFormat.SAFETENSORS

    def seconds(self, op: PlanOp, w: Workload, rates: Rates, mode: MemoryMode) -> float:
        """One op's estimated wall time (torch/timing.py)."""
        return timing.seconds(op, w, rates, mode)

    def start_seconds(self, rates: Rates) -> float:
        """Before the first op (torch/timing.py)."""
        return timing.start_seconds(rates)

    def runtime(self, w: Workload) -> int:
        """The interpreter and what the run imports: file to file less, but a folder's check process beside it."""
        if not timing.files_only(w):
            return RUNTIME
        return FILES_RUNTIME + _transformers_imports(w) + (CHECK_PROCESS if timing.checked_beside(w) else 0)

    def observer_groups(self, w: Workload) -> int:
        """Block-wise runs observe one block at a time, in one pass."""
        return 1

    def mode_effect(self, w: Workload, mode: MemoryMode) -> str | None:
        """A calibrated compile's statistics: in `full` every layer's come from the float model's inputs; block by
        block each block's come from the outputs of the blocks already quantized (docs/torch.md), so GPTQ's
        Hessians, input ranges and transform scales, and with them the written weights, depend on the mode."""
        if not (w.calibrate or w.gptq) or mode is MemoryMode.MULTI_GPU or w.learned is not None:
            return None  # learned rounding runs every mode block by block (torch/lowering.py blockwise)
        if mode is MemoryMode.FULL:
            return ("the model written depends on the mode: in `full` every block calibrates on the float model's "
                    "inputs; `low_memory` and `offload` calibrate each block on the quantized blocks before it "
                    "(write `mode` in `memory` to pin it)")
        return (f"the model written depends on the mode: in `{mode.value}` each block calibrates on the outputs of "
                "the quantized blocks before it; `full` calibrates every block on the float model's inputs (write "
                "`mode` in `memory` to pin it)")

    def notes(self, w: Workload, mode: MemoryMode) -> tuple[str, ...]:
        """Whether a killed run resumes: block by block in offload with `disk` (torch/resume.py); whether this run
        is the first on this machine to call some of numba's compiled loops, which the time does not count."""
        notes = []
        if mode is MemoryMode.OFFLOAD and w.disk and not timing.files_only(w):
            notes.append("resumable: each finished block is recorded under `disk`, and the same compile run again "
                         "after a kill starts after the last one")
        first = uncached(compiled_loops(w))
        if first:
            notes.append(f"first run here: numba compiles the loops of {', '.join(f'quant/{m.value}.py' for m in first)}"
                         " at their first call and caches them (1-6 s a loop), which the time above does not count")
        return tuple(notes)

    def estimate(self, w: Workload, mode: MemoryMode, chunk: int, passes: int = 1,
                 gpus: tuple[int, ...] = ()) -> ModeEstimate:
        """One block-wise phase (or the whole model in full); the search's scoring."""
        if mode is MemoryMode.MULTI_GPU and not gpus:
            return ModeEstimate(mode, 0, (), feasible=False, note="no GPUs (`vram`) given")
        phases = [torch_phase(w, mode, chunk)]
        if w.verify_samples and mode is not MemoryMode.FULL:
            phases.append(verify_tail_phase(w, mode, chunk))
        if w.search is not None:
            phases.append(score_phase(w, min(chunk, w.search.samples), RUNTIME + _libraries(w), True, True))
        return mode_estimate(mode, phases, passes, torch_vram(w, chunk) if mode is MemoryMode.MULTI_GPU else 0)

    def phase(self, w: Workload, mode: MemoryMode, chunk: int, passes: int, phase: PhaseName) -> int:
        """Calibration, rounding and verification share the block-wise phase; emission streams."""
        if phase is PhaseName.SCORE:
            return score_phase(w, min(chunk, w.searched.samples), RUNTIME + _libraries(w), True, True).bytes
        if phase is PhaseName.EXPORT:  # the torch backend reads folders as they are
            return _runtime(w)
        if phase is PhaseName.EMIT:  # rounded tensors went out with their block; the rest is copied, a slice at a
            # time, or whole into a format whose types encode whole tensors
            whole = torch_format(w.emit_format).encodes_whole_tensors
            return _runtime(w) + max(COPY_SLICE, whole_copy_bytes(w) if whole else 0)
        if phase in (PhaseName.VERIFY, PhaseName.QUANTIZE) and w.verify_samples and mode is not MemoryMode.FULL:
            return verify_tail_phase(w, mode, chunk).bytes  # the tail runs the held-out samples to the logits
        return torch_phase(w, mode, chunk).bytes


COSTS = TorchCosts()
