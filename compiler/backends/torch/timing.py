"""The torch backend's time per op (compiler.plan.timing counts the work; this says what torch spends on it):
torch, transformers and compressed-tensors imported before the first op, the model's skeleton, the first
forward (kernels and the compiled loops loaded), verification's streams carried through the blocks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from compiler.backends.cpu_flags import bfloat16_products
from compiler.backends.torch.compiled_steps import steps_compiled
from compiler.backends.torch.formats import torch_format
from compiler.backends.torch.learning_schedule import HELD_OUT, VALIDATIONS
from compiler.ir.types import EmitFormat, MemoryMode
from compiler.models.index import Layer, ModelFormat
from compiler.plan import ops
from compiler.plan.timing import (
    BFloat16Products,
    Estimate,
    Rates,
    by_kind,
    forward,
    fp4_input_seconds,
    gptq_seconds,
    hessian_seconds,
    importance_seconds,
    learned_seconds,
    learned_stream_fraction,
    learned_weights,
    quantize_seconds,
    reading,
    rotation_seconds,
    rounded_bytes,
    score_seconds,
    smooth_seconds,
)
from compiler.plan.workload import Workload
from compiler.quant.rotations import factor_orders

# seconds on the reference machine (plan/timing.py REFERENCE): measured from the process start to the first op
# (2.2-2.9 s through the CLI), `load_model` (a built-in 1.0-1.4 s; an HF folder 3.4 s: transformers' config and
# classes, the config check's process) and the first block's forward over the example recipes (1.7-2.1 s; on a
# machine 1.83x the reference 1.30-1.39 s, 2026-12-03: about 2.4 here)
START, MODEL, HF_MODEL, FIRST_FORWARD = 2.6, 1.2, 3.2, 2.4
# A run file to file opens the checkpoint's files only (0.0-0.1 s measured) and builds no model. Where transformers
# opens the output (a folder), its config and load check run in a child process (check_process.py) started before
# torch is imported here: the rounding waits for the child's imports (its names need the model class's prefix) and
# the emit for its load check. On a machine 1.12x the reference (2026-12-05): a 2-block gpt-oss waited 1.9 s in
# `quantize_weights` (its rounding instant) and 0.4 s in `emit`; SmolLM2-135M rounded in 1.3 s, then its `emit`
# took 1.3-1.5 s (0.2 of it writing). Seconds on the reference machine:
FILES_OPEN, CHECK_READY, CHECK_LOAD = 0.05, 2.1, 0.45
# GGUF's Q4_0 and Q8_0 rounded rtn take llama.cpp's own reference rounding (the gguf package's numpy port): this
# many times qrc's rtn rounding of the same bytes (SmolLM2-135M's 210 layers file to file: Q4_0 2.9 s, Q8_0 2.5 s
# where qrc's rtn rate planned 1.5, 2026-12-05)
GGUF_REFERENCE_ROUNDING = 1.8
# an MXFP4 source's decoder (transformers' MXFP4 integration) imports transformers, which a run file to file into a
# GGUF imports for nothing else: 1.3 s of a tiny gpt-oss's `emit` on a machine 1.12x the reference
MXFP4_DECODER_IMPORT = 1.45
# a compressed-tensors source's weights are decompressed by compressed-tensors, which imports transformers: the real
# SmolLM2-135M's W4A16 and NVFP4 folders took 2.4-2.5 s to open file to file (into a folder or a GGUF), where a
# float folder takes 0.0, on a machine 1.12x the reference (2026-12-05)
DECOMPRESSOR_IMPORT = 2.7
# file to file, a weight a compressed-tensors source stores in an FP4 format is decompressed by compressed-tensors
# (its e2m1 codes unpacked, times its scales): this many bytes of rtn rounding a weight; an MXFP4 one rounded to
# NVFP4 then takes the exact cast's path (its power-of-two grid checked, then compressed-tensors' own rounding, not
# the compiled loop): this many more. The real SmolLM2-135M's NVFP4 and MXFP4 folders (106M such weights), on a
# machine 1.12x the reference (2026-12-05): into Q4_0 2.6-2.7 s rounding where 1.3 were planned; the MXFP4 one into
# NVFP4 5.2-5.3 s, the NVFP4 one 2.6-2.7 (its grid is no power of two: rounded again by the loop)
FP4_DECOMPRESSING, FP4_CAST = 3.7, 6.9
# A GGUF source's tensors stored in GGML blocks are decoded each time they are read (the gguf package's numpy
# dequantizers, a slice of rows at a time: models/gguf_source.py): this many bytes of rtn rounding an element, at the
# model's load (or each block's, in offload) and for a layer rounded file to file; a tensor the output copies (not
# rounded) is decoded again and written as float rows rather than copied as bytes: GGUF_DECODED_COPY. Fitted on the
# real SmolLM2-135M (Q4_1 and Q8_0) against its float32 folder, the same recipes, on a machine 1.03x the reference
# (2026-12-07): attention GPTQ loaded in 5.4 s against 3.8 (134.5M elements decoded) and emitted in 3.1 s against
# 0.9 (107.9M copied); file to file its W4A16 rounded in 2.3-2.4 s against 1.0-1.1 (106.2M). Held out, a random
# Llama's Q4_K/Q6_K file decoded about 1.5x slower an element (its W4A16 file to file 1.31x the plan, was 1.51x;
# offload GPTQ 1.04x, was 1.12x), and SmolLM2's rotated W8A8 example ran 1.07x and 0.91x (was 1.27x and 1.09x)
GGUF_DECODE, GGUF_DECODED_COPY = 3.0, 5.0


# `online r4` (rotation.py attach_online): each down projection's input turned as qrc's model runs, this many bytes at
# the rounding rate per element and per Kronecker factor of the rotation (reshapes and copies around a small
# product). The real SmolLM2-135M's example (blocks of 2, one factor): 120 hooks over 755M elements took 3.07 s on a
# machine 1.16x the reference, 1.18 bytes an element; the whole width of 1536 (factors of 8 and 192) ran 2.0-2.4x a
# block of 2 a tensor alone (2026-12-06). The emitted folder opened by transformers (verify, the load check) has
# compressed-tensors apply its transform_config: ONLINE_FOLDER_OPEN seconds more on the reference machine per
# opening (a Mistral of 2 blocks: emit 1.0 s against 0.1 unrotated, verify 4.9 against 3.1; SmolLM2-135M's emit 2.4-2.8
# s against 1.1), and each rotated input a dense product by its block's matrix (compressed-tensors applies it as
# one) beside the per-element work
ONLINE_ROTATION_BYTES, ONLINE_FOLDER_OPEN = 1.2, 1.0


def online_seconds(w: Workload, rates: Rates, samples: float, folder: bool = False) -> float:
    """`samples` through the model with `online r4`: every down projection's input rotated, by qrc's hook (the
    Kronecker factors) or, `folder`, by compressed-tensors in the emitted folder (one product by the block's
    matrix)."""
    if not w.online_width:
        return 0.0
    block = w.rotation_block or w.online_width
    turns = 1 if folder else len(factor_orders(block) or (block,))
    downs = sum(1 for x in w.index.layers if x.name.endswith("mlp.down_proj"))
    elements = samples * w.seqlen * w.online_width * downs
    dense = 2.0 * elements * block / rates.flops if folder else 0.0
    return elements * ONLINE_ROTATION_BYTES * turns / rates.rounding + dense


def online_folder_open(w: Workload, rates: Rates) -> float:
    """transformers opening the emitted folder with an online rotation (compressed-tensors' transforms)."""
    return rates.fixed(ONLINE_FOLDER_OPEN) if w.online_width else 0.0


def start_seconds(rates: Rates) -> float:
    """Before the first op: the interpreter, the CLI, the check and the plan, and torch's imports."""
    return rates.fixed(START)


def files_only(w: Workload) -> bool:
    """Nothing runs the model: its weights are rounded file to file."""
    return not (w.calibrate or w.verify_samples or w.search is not None)


def checked_beside(w: Workload) -> bool:
    """A run file to file whose output transformers opens: its check runs in a child process meanwhile."""
    return files_only(w) and torch_format(w.emit_format).opened_by_transformers


def _imports(w: Workload) -> float:
    """Seconds a run file to file spends importing transformers and compressed-tensors (cost._transformers_imports
    says when): a tiny gpt-oss's MXFP4 experts cast to NVFP4 into a GGUF took 5.3 s where 3.6 were planned with
    the MXFP4 decoder's import alone, from a float one 4.5 s where 2.3 were planned with none (2026-12-06)."""
    if w.index.compressed_source or w.cast_nvfp4_layers:
        return DECOMPRESSOR_IMPORT
    return MXFP4_DECODER_IMPORT if w.index.packed_experts and not checked_beside(w) else 0.0


def _load(op, w: Workload, rates: Rates, mode: MemoryMode) -> float:
    if op.access is ops.ModelAccess.FILES:
        return rates.fixed(FILES_OPEN + _imports(w)) + rotation_seconds(w, rates)
    resident = mode in (MemoryMode.FULL, MemoryMode.LOW_MEMORY)
    opened = HF_MODEL if w.index.format is ModelFormat.HF else MODEL
    # a resident model's GGUF blocks are all decoded here; in offload each block's are, as it runs
    decoded = _decoding(w, rates, lambda x: resident or x.block is None)
    return (rates.fixed(opened) + (w.weights_bytes / rates.disk if resident else 0.0) + decoded
            + rotation_seconds(w, rates))


def _decoding(w: Workload, rates: Rates, counted: Callable[[Layer], bool], cost: float = GGUF_DECODE) -> float:
    """Seconds decoding the GGUF source's block-stored weights among the layers `counted` takes, each weight once
    (a tied head reads the embedding's), `cost` bytes of rtn rounding an element."""
    if not w.index.gguf_decoded:
        return 0.0
    stored = set(w.index.gguf_decoded)
    elements = sum({x.weight: x.params for x in w.index.layers if x.weight in stored and counted(x)}.values())
    return elements * cost / rates.rounding


def _learn_rotation(op, w: Workload, rates: Rates, mode: MemoryMode) -> float:
    """The model opened whole, then each step: every block Linear rotated (W·Q or Qᵀ·W, and the product's gradient
    for Q), rounded (to float32 and back), and `batch` samples forward and backward with their inputs rounded as the
    scheme rounds them; the held-out samples (spinquant.py HELD_OUT) run at the start and VALIDATIONS times, forward
    only, one at a time. The steps' products run in bfloat16 where the CPU multiplies it (learned.step_precision):
    LEARNING_STEPS by kind."""
    blocks = sum(x.params for x in w.index.layers if x.block is not None)
    hidden = w.index.norms[0].width if w.index.norms else 0
    weights = 2.0 * blocks * hidden / rates.flops + LEARNING_ROUNDINGS * 4.0 * blocks / rates.rounding
    steps = LEARNING_STEPS[bfloat16_products()]

    def run(samples: int, passes: float) -> float:
        apart = fp4_input_seconds(w, rates, samples) if steps.inputs_apart else 0.0
        return passes * forward(w, rates, samples) + apart

    checks = min(op.iters, VALIDATIONS) + 1
    validation = weights + run(max(1, w.samples // HELD_OUT), steps.forwards / 3)
    return (rates.fixed(HF_MODEL) + w.weights_bytes / rates.disk + op.iters * (weights + run(op.batch, steps.forwards))
            + checks * validation)


# fitted (_learn_rotation): a step's weight rounding against an rtn rounding of the same bytes
LEARNING_ROUNDINGS = 1.3
# Per kind of bfloat16 products (RotationStep): a step's forward and backward in forwards, its FP4 input rounding
# included in them or counted apart, per element as calibration's (fp4_input_seconds). Where the steps
# multiply bfloat16 (fitted on the real SmolLM2-135M, NVFP4, one 512-token sample a step, AVX-512 BF16: 2.75 s
# forming and rounding the weights, 4.1 s the rest) the forwards took the input rounding in. Where they stay float32
# that carried to neither shape: on a 2-core AVX2 EPYC the same SmolLM2 recipe (10 steps) learned in 259 s against
# 145 planned (1.79x; 1.9 s of FP4 input rounding a sample, against 1.5 s of forward) and the Mistral of hidden 1024
# (bench/plan_vs_measured.py's spinquant row) compiled in 1.30x its plan: SmolLM2's narrow layers round about twice
# the input elements per FLOP. Counted apart, the forwards fitted on SmolLM2 there: 4.7; held out, the Mistral
# 1.09-1.11x (2026-12-07)
@dataclass(frozen=True)
class RotationStep:
    """A learned rotation's step on one kind of CPU: its forward and backward in forwards, and whether its FP4 input
    rounding is counted apart from them."""

    forwards: float
    inputs_apart: bool


LEARNING_STEPS = {BFloat16Products.CONVERTED: RotationStep(4.7, inputs_apart=True),
                  BFloat16Products.AVX512_BF16: RotationStep(3.6, inputs_apart=False),
                  BFloat16Products.AMX: RotationStep(3.6, inputs_apart=False)}


def _calibrate(op, w: Workload, rates: Rates, mode: MemoryMode) -> float:
    first = 0.0 if mode is MemoryMode.FULL and w.verify_samples else rates.fixed(FIRST_FORWARD)  # capture_reference's
    # the LM head runs on the last position only unless its inputs are read (model.forward's last_logits_only)
    passes = op.passes * forward(w, rates, w.samples, blocks_only=not w.head_calibrates(), statistics=True)
    return (first + reading(w, rates, True) + passes + op.passes * online_seconds(w, rates, w.samples)
            + hessian_seconds(w, rates) + importance_seconds(w, rates))


def _capture(op, w: Workload, rates: Rates, mode: MemoryMode) -> float:
    return rates.fixed(FIRST_FORWARD) + reading(w, rates, True) + forward(w, rates, op.samples) + online_seconds(
        w, rates, op.samples)


def _cache_inputs(op, w: Workload, rates: Rates, mode: MemoryMode) -> float:
    # the calibration and held-out samples are read here (their first reading)
    return rates.fixed(FIRST_FORWARD) + reading(w, rates, True) + (reading(w, rates, False) if w.verify_samples else 0.0)


def _run_block(op, w: Workload, rates: Rates, mode: MemoryMode) -> float:
    """Every block (the op's repeats): the calibration stream twice (its statistics pass, then through the
    rounded block to the next: blockwise._block) and verification's float and rounded streams, GPTQ's
    Hessians and rounding, every layer's rounding, learned rounding's steps, and a transform's statistics pass
    before them."""
    # learned rounding carries the calibration samples' float stream through the blocks too, and where nothing else
    # gathers statistics there is no statistics pass (blockwise._block)
    observes = w.gptq or bool(w.imatrix_layers) or bool(w.observed) or w.kv_cache or w.learned is None
    bfloat16 = bfloat16_products()
    onward: float = w.samples if w.calibrate else 0  # the calibration stream through the rounded block, to the next
    if w.learned:  # with the float stream beside it, both in the steps' precision (learned.py)
        onward = 2 * w.samples * learned_stream_fraction(bfloat16)
    statistics = observes * w.samples if w.calibrate else 0  # with `experts all`, every token through every expert
    streams = onward + 2 * w.verify_samples
    rounded_streams = (w.samples if w.calibrate else 0) + w.verify_samples  # through the rounded blocks
    smoothing = smooth_seconds(w, rates, blocks_only=True) if w.transform is not None and w.calibrate else 0.0
    # in offload each block's GGUF weights are decoded as it runs (otherwise at the load)
    decoded = _decoding(w, rates, lambda x: x.block is not None) if mode is MemoryMode.OFFLOAD else 0.0
    return (rates.block * op.repeat + decoded
            + forward(w, rates, statistics, blocks_only=True, statistics=True)
            + forward(w, rates, streams, blocks_only=True) + hessian_seconds(w, rates)
            + importance_seconds(w, rates) + gptq_seconds(w, rates) + rounded_bytes(w) / rates.rounding + smoothing
            + fp4_input_seconds(w, rates, rounded_streams) + online_seconds(w, rates, statistics + streams)
            + learned_seconds(w, rates, bfloat16, op.compiled_steps))  # as lowering chose (learning_compiled)


def float32_steps() -> bool:
    """Whether learned rounding's steps stay float32 here (no bfloat16 products in hardware): the one reading of
    the CPU that the plan's time and memory of the steps both take."""
    return bfloat16_products() is BFloat16Products.CONVERTED


def learning_compiled(w: Workload) -> bool:
    """Whether the run's learned rounding steps compile (the run decides the same: torch/learned.py)."""
    if w.learned is None:
        return False
    return steps_compiled(w.learned.iters, w.learned_step_samples, w.seqlen, learned_weights(w))


def _quantize(op, w: Workload, rates: Rates) -> float:
    """The rounding; file to file into a folder, no sooner than the check process's imports are done. Into a
    GGUF, the layers rounded rtn to Q4_0/Q8_0 take llama.cpp's reference rounding (GGUF_REFERENCE_ROUNDING): not
    GPTQ's, nor the K-quants' or the FP4 types' (the real SmolLM2-135M's Q4_0 GPTQ planned its 210 layers at 46 s
    with the factor on GPTQ's seconds, against 18 s measured)."""
    layers, gptq = op.layers or tuple(w.quantized_layers), set(w.gptq_layers)
    rtn = tuple(name for name in layers if name not in gptq)
    rounding = quantize_seconds(op, w, rates) + _decompressing(w, set(layers)) / rates.rounding
    if files_only(w):  # a model that was built decoded its GGUF blocks at its load
        rounding += _decoding(w, rates, lambda x: x.name in layers)
    if w.emit_format is EmitFormat.GGUF and not w.kquant_rounded and not w.float_rounded:
        rounding += (GGUF_REFERENCE_ROUNDING - 1) * rounded_bytes(w, rtn) / rates.rounding if rtn else 0.0
    return max(rounding, rates.fixed(CHECK_READY)) if checked_beside(w) else rounding


def _decompressing(w: Workload, layers: set[str]) -> float:
    """Bytes of rtn rounding that decompressing `layers` from an FP4-compressed source costs file to file, and the
    exact cast's path of MXFP4 ones rounded to NVFP4 (a run that builds the model decompresses at its load)."""
    if not w.index.fp4_compressed or not files_only(w):
        return 0.0
    fp4, mxfp4, nvfp4 = set(w.index.fp4_compressed), set(w.index.mxfp4_compressed), set(w.nvfp4_layers)
    stored = [x for x in w.index.layers if x.name in layers and x.weight in fp4]
    return sum(x.params * (FP4_DECOMPRESSING + (FP4_CAST if x.name in nvfp4 and x.weight in mxfp4 else 0.0))
               for x in stored)


def _emit(op, w: Workload, rates: Rates) -> float:
    """Writing the output (a GGUF source's unrounded tensors decoded as they are copied), then the load check: file
    to file the check process's, waited for; otherwise here, where an online rotation's transforms are opened too
    (the check process opens them while the weights round: the real SmolLM2-135M's rotated W8A8 file to file
    waited 0.0 s at emit)."""
    opened = torch_format(w.emit_format).opened_by_transformers
    rounded = set(w.quantized_layers)  # every writer reads the others through the source (a GGUF's decoded)
    copied = _decoding(w, rates, lambda x: x.name not in rounded, GGUF_DECODED_COPY)
    if checked_beside(w):
        return op.bytes / rates.disk + copied + rates.fixed(CHECK_LOAD)
    return op.bytes / rates.disk + copied + (online_folder_open(w, rates) if opened else 0.0)


def _verify(op, w: Workload, rates: Rates, mode: MemoryMode) -> float:
    # the emitted folder opened by transformers, its online rotation (if any) applied by compressed-tensors
    folder = online_folder_open(w, rates) + online_seconds(w, rates, op.samples, folder=True)
    if mode is MemoryMode.FULL:
        return (reading(w, rates, False) + 2 * forward(w, rates, op.samples) + fp4_input_seconds(w, rates, op.samples)
                + folder)
    # the streams came through the blocks: what is outside them runs, and the emitted folder is opened
    return forward(w, rates, op.samples) - forward(w, rates, op.samples, blocks_only=True) + 2 * rates.block + folder


ESTIMATES: dict[ops.OpKind, Estimate] = {
    ops.OpKind.LOAD_MODEL: _load, ops.OpKind.LEARN_ROTATION: _learn_rotation, ops.OpKind.CALIBRATE_CHUNK: _calibrate, ops.OpKind.CAPTURE_REFERENCE: _capture,
    ops.OpKind.CACHE_BLOCK_INPUTS: _cache_inputs, ops.OpKind.RUN_BLOCK: _run_block, ops.OpKind.VERIFY: _verify,
    ops.OpKind.SMOOTH: lambda op, w, rates, mode: smooth_seconds(w, rates, whole=True),
    ops.OpKind.QUANTIZE_WEIGHTS: lambda op, w, rates, mode: _quantize(op, w, rates),
    ops.OpKind.EMIT: lambda op, w, rates, mode: _emit(op, w, rates),
    ops.OpKind.SCORE_SENSITIVITY: lambda op, w, rates, mode: score_seconds(op, w, rates, rates.fixed(FIRST_FORWARD)),
}  # the others (mode selection, the precision assignment) take no measurable time


def seconds(op: ops.PlanOp, w: Workload, rates: Rates, mode: MemoryMode) -> float:
    """One op's estimated seconds, all its repeats together."""
    return by_kind(ESTIMATES, op, w, rates, mode)
