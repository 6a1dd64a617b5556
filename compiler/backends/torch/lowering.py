"""The PyTorch backend's lowering. The samples run through the model as streams (calibration, and the float
side of verification): whole with hooks in `full`, else block by block, each block's layers rounded inside
run_block with their statistics and input ranges. What no earlier op rounded is rounded by quantize_weights
in one of four ways, which the op names: in the resident model, after the model's tail ran on the last
block's outputs, streamed from the checkpoint, or file to file when nothing runs the model."""

from __future__ import annotations

from compiler.backends.torch.cost import learning_bytes
from compiler.backends.torch.formats import torch_format
from compiler.backends.torch.timing import learning_compiled
from compiler.ir.types import MemoryMode, RotationLearning, RotationStart
from compiler.models.builtin import PREFIX as BUILTIN_PREFIX
from compiler.models.index import ModelFormat
from compiler.plan.lower import (
    Context,
    Pass,
    block_layers,
    calibrate_op,
    emit_pass,
    gate,
    head_layers,
    held_out,
    load_op,
    lower_mode,
    mixed_precision_pass,
    needs_data,
    quantize_op,
    smooth_op,
    statistics,
    transform_words,
    verify_op,
)
from compiler.plan.ops import (
    Buffer,
    CacheBlockInputs,
    CacheLocation,
    CaptureReference,
    HeldOut,
    LearnRotation,
    ModelAccess,
    PlanOp,
    PrepareRun,
    QuantizeStrategy,
    RunBlock,
)
from compiler.plan.target import PhaseName
from compiler.plan.workload import Search
from compiler.resolve.rotation_widths import rotation_widths

CHECKED = "float output checked unchanged"  # how the transform's fold is checked
RUNS_STREAMS = (Buffer.MODEL, Buffer.OUTPUT, Buffer.STREAMS)  # what an op over the whole model reads


def blockwise(ctx: Context) -> bool:
    """The run goes block by block (cached block inputs), not through the whole model at once: in every mode but
    `full`, and in `full` too where a rounding is learned per block (its targets are each block's float outputs)."""
    return (ctx.mode is not MemoryMode.FULL or bool(ctx.workload.learned_layers)) and bool(ctx.workload.blocks)


def lower_load(ctx: Context) -> list[PlanOp]:
    """`load_model`: the checkpoint's files alone (nothing runs the model), the skeleton with weights read per
    block (offload, multi_gpu), or the whole model."""
    w = ctx.workload
    rotation = rotation_widths(w.index, w.rotated, w.online_width, w.rotation_block)
    learning = ctx.ir.transform.learning if ctx.ir.transform is not None else None
    learned = [_learn_rotation(ctx, rotation, learning)] if learning is not None and rotation is not None else []
    reads = (Buffer.RECIPE, Buffer.ROTATION) if learned else (Buffer.RECIPE,)
    if not ctx.runs_model:
        access, how, resident = ModelAccess.FILES, ("its safetensors files only: no model definition is built, since "
                                                   "nothing runs the model (data-free rounding, nothing to verify); "
                                                   "tensor by tensor, file to file"), 0
    elif ctx.mode in (MemoryMode.OFFLOAD, MemoryMode.MULTI_GPU):
        access, how, resident = ModelAccess.BLOCKS, "lazily, one block at a time", 0
    else:
        access, how, resident = ModelAccess.RESIDENT, "whole", w.weights_bytes
    return learned + [load_op(ctx, access, how, resident, reads, ModelFormat.TORCH, rotation)]


def _learn_rotation(ctx: Context, rotation: tuple[int, int | None, int | None, int | None],
                    learning: RotationLearning) -> LearnRotation:
    """`learn_rotation` (SpinQuant, torch/spinquant.py): the float model whole, its rotations learned, dropped."""
    w = ctx.workload
    hidden, head = rotation[0], rotation[1]
    turned = f"R1 ({hidden}-wide)" + (f" and each layer's R2 ({head}-wide)" if head else "")
    start = "QuaRot's random Hadamards" if learning.start is RotationStart.HADAMARD else "the identity (no rotation)"
    return LearnRotation(
        summary=f"open {ctx.ir.model} whole in float32 and learn {turned} from {start}: "
        f"{learning.iters} Cayley SGD steps of {learning.batch} calibration sample(s) through the model as the "
        "recipe quantizes it (next-token loss); then the model is dropped",
        inputs=(Buffer.RECIPE, Buffer.CALIBRATION_DATA), outputs=(Buffer.ROTATION,),
        peak_bytes=ctx.costs.runtime(w) + learning_bytes(w, learning.batch), model=ctx.ir.model,
        iters=learning.iters, batch=learning.batch, lr=learning.lr, start=learning.start, rotation=rotation,
        calibration=ctx.ir.calibration)


def lower_prepare(ctx: Context) -> list[PlanOp]:
    """`prepare_run`, once the assignment is final (after the search): each layer's job, the output opened with
    every tensor's place, and the streams the later ops run. It carries what those ops' handlers used to look
    up in the plan: the calibration the first statistics op gathers with, the held-out samples, the blocks."""
    w, v = ctx.workload, ctx.ir.verify
    gathers = ctx.streams if blockwise(ctx) else ctx.needs_data  # some op reads the calibration samples
    named = (["calibration"] if gathers and ctx.needs_data else []) + (["verification"] if v is not None else [])
    emit = ctx.ir.emit
    fmt = emit.format if emit else ctx.costs.default_format
    resident = w.weights_bytes if ctx.runs_model and ctx.mode not in (MemoryMode.OFFLOAD, MemoryMode.MULTI_GPU) else 0
    data = ((Buffer.CALIBRATION_DATA,) if gathers else ()) + ((Buffer.VERIFY_DATA,) if v is not None else ())
    return [PrepareRun(
        summary=f"make the {len(w.quantized_layers)} layers' jobs; open the {fmt.name} output with every tensor's "
        "place before any work; " + (f"open the {' and '.join(named)} streams" if named else "no sample streams"),
        inputs=(Buffer.MODEL, Buffer.MEMORY_MODE) + ctx.after_search + data, outputs=(Buffer.OUTPUT, Buffer.STREAMS),
        peak_bytes=ctx.costs.runtime(w) + resident, jobs=len(w.quantized_layers), format=fmt,
        streams=tuple(named) or ("none",), calibration=ctx.ir.calibration if gathers else None,
        transform=w.transform if gathers else None, kv_cache=ctx.ir.kv_cache,
        held_out=HeldOut(v.samples, **held_out(ctx)) if v is not None else None,
        blocks=len(w.blocks) if ctx.streams and blockwise(ctx) else 0)]


def _kld_words(search: Search, chunks: int, chunk: int) -> str:
    return f"{chunks} × (2 forward + 1 backward) passes of {chunk} samples (first-order estimate)"


def _statistics(ctx: Context) -> list[str]:
    """What calibration gathers, in words."""
    w = ctx.workload
    others = ctx.ir.kv_cache is not None or w.transform is not None or bool(w.imatrix_layers)
    parts = ["input ranges"] if w.observed or not others else []
    parts += (["GPTQ Hessians"] if w.gptq else []) + (["KV cache ranges"] if ctx.ir.kv_cache else [])
    parts += ["input mean squares per column (imatrix)"] if w.imatrix_layers else []
    return parts or ["none beyond the transform's, gathered by the smooth op"]


def lower_streams(ctx: Context) -> list[PlanOp]:
    """The calibration stream (when a layer needs data) and the verification streams run through the model;
    block by block, or whole in full mode (hooks on every layer)."""
    if not ctx.streams:
        return []
    if blockwise(ctx):
        return _blocks(ctx)
    ops: list[PlanOp] = []
    v, w = ctx.ir.verify, ctx.workload
    if v is not None:
        ops.append(CaptureReference(
            summary=f"run the float model on {v.samples} held-out samples and keep its outputs "
            "(the model is then rounded in place)", inputs=(Buffer.MODEL, Buffer.STREAMS), outputs=(Buffer.REFERENCE,),
            peak_bytes=ctx.phase(PhaseName.VERIFY), samples=v.samples, **held_out(ctx)))
    ops += smooth_op(ctx, CHECKED, RUNS_STREAMS)
    if ctx.layers_need_data:  # a transform alone (AWQ or SmoothQuant before rtn, dynamic inputs) needs no more passes
        summary = (f"forward {w.chunk} samples × {w.seqlen} tokens through the whole model, hooks gathering the "
                   "statistics its layers round with (" + ", ".join(_statistics(ctx)) + ")")
        ops.append(calibrate_op(ctx, summary, w.quantized_layers, (Buffer.STATISTICS,), RUNS_STREAMS))
    return ops


def _blocks(ctx: Context) -> list[PlanOp]:
    w = ctx.workload
    where = CacheLocation.DISK if w.disk and ctx.mode is MemoryMode.OFFLOAD else CacheLocation.RAM
    streams = ["calibration"] if ctx.needs_data else []
    if ctx.ir.verify is not None:  # an HF folder's quantized side is its emitted folder (lower_verify)
        streams.append("verification (float and quantized)" if ctx.ir.model.startswith(BUILTIN_PREFIX)
                       else "verification (float)")
    head = head_layers(ctx)
    rounding_head = f"; round {len(head)} layers before the blocks first" if head else ""
    cache = CacheBlockInputs(
        summary=f"run the model up to the first block; cache its inputs {where.value} (per sample: hidden states only; "
        f"per-sample-constant inputs once); streams: {', '.join(streams)}" + rounding_head,
        inputs=(Buffer.MODEL, Buffer.MEMORY_MODE, Buffer.OUTPUT, Buffer.STREAMS),
        outputs=(Buffer.BLOCK_INPUTS,) + ((Buffer.QPARAMS,) if head else ()), peak_bytes=ctx.phase(PhaseName.CALIBRATE),
        layers=head, samples=w.samples, seqlen=w.seqlen, per_sample=w.seqlen * w.hidden * 4, where=where,
        **statistics(ctx))
    ranges = f"input ranges ({ctx.ir.calibration.method.name}), " if w.observed else ""
    ranges += "KV cache ranges, " if ctx.ir.kv_cache is not None else ""
    ranges += "input mean squares per column, " if w.imatrix_layers else ""
    what = (transform_words(w, CHECKED) + "; " if w.transform else "") + "compute float outputs, " + ranges + \
        ("quantize the block (GPTQ with its Hessians)" if w.gptq else "quantize the block")
    compiled = learning_compiled(w)
    if w.learned is not None:
        searched = set(w.learned_layers) & set(w.imatrix_layers)
        start = "" if not searched else " from scales searched with those squares" if len(searched) == len(
            w.learned_layers) else f" ({len(searched)} from scales searched with those squares)"
        what += (f"; learn the rounding of {len(w.learned_layers)} layers{start}: {w.learned.iters} sign-SGD steps "
                 f"of {w.learned_step_samples} samples against the float block's outputs" + (", compiled" if compiled else ""))
    run = RunBlock(summary=f"per block: load weights, {what}, outputs become the next block's inputs",
                   inputs=(Buffer.MODEL, Buffer.OUTPUT, Buffer.BLOCK_INPUTS), outputs=(Buffer.BLOCK_INPUTS, Buffer.QPARAMS),
                   peak_bytes=ctx.phase(PhaseName.CALIBRATE), repeat=max(1, len(w.blocks)), layers=block_layers(ctx),
                   blocks=len(w.blocks), chunk=w.chunk, gptq=w.gptq, compiled_steps=compiled, **statistics(ctx))
    return [cache, run]


def lower_quantize(ctx: Context) -> list[PlanOp]:
    """`quantize_weights`: the layers no block rounded, and how."""
    w = ctx.workload
    in_blocks = ctx.streams and blockwise(ctx)
    done = set(block_layers(ctx)) | set(head_layers(ctx)) if in_blocks else set()
    names = [n for n in w.quantized_layers if n not in done]
    if not names:
        return []
    if not ctx.runs_model:
        return [_quantize(ctx, names, (), QuantizeStrategy.FILE_TO_FILE,
                          "file to file: read → quantize → write → free, one tensor at a time")]
    if ctx.streams and not blockwise(ctx):
        return [_quantize(ctx, names, (Buffer.STATISTICS,) if ctx.layers_need_data else (), QuantizeStrategy.IN_PLACE,
                          "in the resident model, each computing like the emitted one from then on")]
    if in_blocks and (ctx.ir.verify is not None or any(needs_data(ctx.assignment.of(n).scheme) for n in names)):
        return [_quantize(ctx, names, (Buffer.BLOCK_INPUTS,), QuantizeStrategy.TAIL,
                          "the model's tail runs on the last block's outputs (its layers' statistics), then "
                          "streamed: load → quantize → write → free")]
    return [_quantize(ctx, names, (), QuantizeStrategy.STREAMED, "streamed: load → quantize → write → free")]


def _quantize(ctx: Context, names: list[str], reads: tuple[Buffer, ...], strategy: QuantizeStrategy, how: str):
    """A quantize op reading the model, the staged output (its jobs, the rounder) and `reads`."""
    return quantize_op(ctx, names, (Buffer.MODEL, Buffer.OUTPUT) + reads, strategy, how, waits_for_search=False)


def lower_verify(ctx: Context) -> list[PlanOp]:
    """`verify`: an HF folder's output is run as transformers loads it (one block at a time); a built-in's
    output has no loader outside qrc, so qrc's own rounded model is what runs, as for an output format that says
    so (GGUF: its weights rounded to the file's blocks; formats.py)."""
    v = ctx.ir.verify
    if v is None:
        return []
    stands_in = torch_format(ctx.ir.emit.format if ctx.ir.emit is not None else None).planned_verified_on
    emitted = "qrc's quantized model" if ctx.ir.model.startswith(BUILTIN_PREFIX) else stands_in if stands_in else \
        "the emitted folder as transformers loads it (compressed-tensors), one block at a time,"
    if blockwise(ctx):
        return verify_op(ctx, f"run {v.samples} held-out samples through {emitted} against the float stream carried "
                         f"through every block beside the calibration stream, at the model's output; {gate(ctx)}",
                         (Buffer.MODEL, Buffer.OUTPUT, Buffer.BLOCK_INPUTS, Buffer.EMITTED_MODEL))
    return verify_op(ctx, f"run {v.samples} held-out samples through {emitted} against the float outputs kept "
                     f"before rounding; {gate(ctx)}", (Buffer.MODEL, Buffer.OUTPUT, Buffer.STREAMS, Buffer.REFERENCE,
                                                        Buffer.EMITTED_MODEL))


LOWERING: tuple[Pass, ...] = (
    lower_load, lower_mode, mixed_precision_pass(_kld_words), lower_prepare, lower_streams, lower_quantize,
    emit_pass(reads_ranges=False, reads=(Buffer.OUTPUT, Buffer.QPARAMS)), lower_verify,
)
