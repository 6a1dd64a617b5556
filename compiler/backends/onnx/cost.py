"""The ONNX backend's memory model: what each phase of its execution holds (the planner asks it through
the backend's spec; constants documented in docs/memory.md, "Reading a plan")."""

from __future__ import annotations

import math
from dataclasses import dataclass

from compiler.backends.onnx import timing
from compiler.backends.onnx.export_builder import planned_exporter
from compiler.backends.onnx.export_decoder import DECODER_FAMILIES
from compiler.backends.onnx.output_streams import streams_output
from compiler.ir.types import Backend, EmitFormat, MemoryMode
from compiler.models import model_dir
from compiler.models.onnx_write import COPY_PIECE
from compiler.plan.activations import (
    SCRATCH_OUTPUTS,
    ActivationPeak,
    calibration_peak,
    folded_bytes,
    needed_nodes,
    peak,
    segment_outputs,
    segment_runs,
)
from compiler.plan.decision import ModeEstimate
from compiler.plan.memory import (
    ACT_BYTES,
    EAGER_SCORES,
    MiB,
    Phase,
    agreement_scratch,
    block_working_set,
    dtype_bytes,
    gptq_scratch,
    hessian_bytes,
    input_widths,
    mode_estimate,
    observer_bytes,
    score_phase,
    transform_bytes,
)
from compiler.plan.ops import Exporter, PlanOp
from compiler.plan.target import PhaseName
from compiler.plan.timing import Rates
from compiler.plan.workload import Workload
from compiler.quant.rotations import SLICE as ROTATION_SLICE

# interpreter, libraries, session set-up: the RSS of a compile entering verification, 113-115 MiB measured on
# calibrated W8A8 compiles of the built-in Llamas and an exported decoder (82 MiB without calibration). It was 128
# while the rewritten model, its weights loaded, outlived emission (until 2026-11-27)
RUNTIME = 112 * MiB
SESSION_COPIES = 1  # weights live once, in the session (read from external data, prepacking off)
# torch, transformers and the TorchScript exporter's tracing state for an export: measured with VmHWM on
# all-MiniLM-L6-v2 (87 MB of weights): a 1.13 GiB peak, of which the model and its exported proto are ~0.17 GiB
EXPORT_RUNTIME = 900 * MiB
# a decoder's dynamo export (export_decoder.py): the libraries, then the model's parameters, the program's
# proto and the renaming's copies of one tensor. Fitted on random Llamas of 69, 77, 150 and 642 MiB of
# float32 weights, whose exports peaked (VmHWM) at 694, 701, 924 and 2,091 MiB (0.98-1.03x of this)
DYNAMO_EXPORT_RUNTIME = 520 * MiB
DYNAMO_EXPORT_WEIGHT_COPIES = 2.5
# onnxruntime-genai's builder (export_builder.py): its libraries, then about 1.2 copies of the float32 weights
# (transformers' model; the builder writes each tensor as it goes). Untied random Llamas of 26, 146 and 279 MB
# peaked at 578, 700 and 852 MiB with the compile beside them (574, 718 and 878 planned); held out, a SmolLM2-135M
# shape untied (623 MB) at 1,311 MiB, planned 1,289 (measured 1.02x; 2026-12-07)
BUILDER_EXPORT_RUNTIME = 480 * MiB
BUILDER_EXPORT_WEIGHT_COPIES = 1.2
# the export runs in a child process (export_process.py); the compile waits beside it holding the
# interpreter, qrc and onnx: 65-67 MiB measured (the compile's peak minus the child's VmHWM)
EXPORT_PARENT = 64 * MiB
SLICE_BYTES = 16 << 20  # large weights are rounded in slices of output channels of this size
# GPTQ's column loop runs in torch (compiler/quant/gptq.py): importing it raised max RSS from 47 to 241 MiB
TORCH_LIBRARIES = 200 * MiB
DEQUANTIZED_TOGETHER = 3  # q/k/v: the most layers that read one input in a transformer block
HESSIAN_SUM = 8  # bytes per Hessian element: sums are float64 (compiler/quant/gptq.py HessianObserver)


# ---- ONNX ----------------------------------------------------------------------------------------

def onnx_calibration(w: Workload, mode: MemoryMode, chunk: int, passes: int = 1) -> Phase:
    """The calibration phase: one session with the observed tensors as outputs, or one segment at a time (offload)."""
    graph = w.index.graph
    runtime = _runtime(w, after_rounding=mode is MemoryMode.OFFLOAD)  # offload rounds GPTQ layers block by block
    parts: tuple[tuple[str, int], ...]
    if mode is MemoryMode.OFFLOAD:
        seg_weights, seg_act = _largest_segment(w, chunk)
        cache = _boundary_cache(w, chunk)
        parts = (("runtime", runtime), ("weights of one segment", SESSION_COPIES * seg_weights),
                 ("segment activations", seg_act), ("block-boundary cache", cache), ("observers", observer_bytes(w)))
        if w.hessian_inputs:  # a segment's GPTQ layers are rounded as soon as it has seen every chunk
            parts += (("GPTQ Hessians of one segment (float64 sums), update scratch",
                       _segment_hessians(w) + _hessian_update(w, chunk)),
                      ("rounding one GPTQ layer (written to the output's data file at once)", gptq_scratch(w)))
    else:
        group = _observed_group(w, passes)
        runs = _chunks(w.samples, chunk)
        act = _at(calibration_peak(graph, group, chunk, w.seqlen, w.past), runs) if graph and group else \
            _no_graph(w, chunk, group, runs)
        parts = (("runtime", runtime), ("session weights", SESSION_COPIES * w.weights_bytes),
                 (f"activations of one chunk ({chunk} samples)", act), ("observers", observer_bytes(w)))
        if w.hessian_inputs:
            parts += (("GPTQ Hessians (float64 sums), update scratch", _hessians(w, group) + _hessian_update(w, chunk)),)
        if w.transform is not None and not w.rotated and graph:
            # the transform's pass (one session observing what it maps), its fold (one tensor at a time) and check
            # (the model run on one sample, twice: one output held beside the other run), then calibration: one
            # after the other, each with one session of the model (onnx/smoothing.py), so the phase holds the
            # largest of their activations
            kept = set(graph.outputs)
            check = 2 * peak(graph, needed_nodes(graph, kept), kept, 1, w.seqlen, w.past).bytes
            passed = _at(calibration_peak(graph, w.smoothing_observed, chunk, w.seqlen, w.past), runs)
            parts += (("the transform's pass or its check, beyond calibration's activations",
                       max(0, passed - act, check - act)),)
    if w.transform is not None and not w.rotated:  # the transform's pass observes every mapping's input at once
        parts += ((f"{w.transform.kind.name} statistics (+ scratch of one mapping)", transform_bytes(w, all_blocks=True)),)
    return Phase("calibrate", sum(b for _, b in parts), parts)


def _runtime(w: Workload, after_rounding: bool = True) -> int:
    """The runtime, and torch where it is imported by then: under torchrun for torch.distributed
    (backends/ranks.py; a 2-rank W8A8 compile of the tiny Llama measured 303 MiB per rank against 137 planned
    without it), and for GPTQ's column loop once a layer is rounded (`after_rounding`; full and low_memory
    calibrate before: the 4-block GPTQ promise model peaked at 329 MiB there, against 554 planned with it)."""
    torch = w.ranks > 1 or (bool(w.hessian_inputs) and after_rounding)
    return RUNTIME + (TORCH_LIBRARIES if torch else 0) + w.data_libraries


def _hessians(w: Workload, tensors: tuple[str, ...] | None = None) -> int:
    """The float64 Hessian sums of GPTQ inputs (of `tensors`, or all)."""
    return sum(HESSIAN_SUM * k * k for t, k in w.hessian_inputs if tensors is None or t in tensors)


def _hessian_update(w: Workload, chunk: int) -> int:
    """Updating the widest Hessian with a chunk: its rows in float64, the finite ones, and XᵀX."""
    k = max((k for _, k in w.hessian_inputs), default=0)
    return 2 * chunk * w.seqlen * k * HESSIAN_SUM + HESSIAN_SUM * k * k


def _segment_hessians(w: Workload) -> int:
    """The Hessians of the GPTQ inputs one offload segment produces (the largest segment's)."""
    graph = w.index.graph
    if not graph:
        return hessian_bytes(w) * HESSIAN_SUM // 4
    runs = segment_runs([n.name for n in graph.nodes])
    wanted = {t for t, _ in w.hessian_inputs}
    per_run = [tuple(o for i in idx for o in graph.nodes[i].outputs if o in wanted) for _, idx in runs]
    return max((_hessians(w, produced) for produced in per_run), default=0)


# torch.onnx's dynamo attention (a decoder's export, export_decoder.py) at its peak, in [heads, seq, seq]
# tensors: the softmax, its NaN mask (bool: a quarter), and the Where that zeroes the NaNs: its output and the
# selections onnxruntime's kernel makes first (the walk's own SCRATCH_OUTPUTS). Walked on the real SmolLM2's
# exported graph, 2026-12-06
EXPORTED_SCORES = 1 + 0.25 + 1 + SCRATCH_OUTPUTS["Where"]


def _chunks(samples: int, chunk: int) -> int:
    """The runs a session makes over `samples` in chunks of `chunk`."""
    return -(-max(samples, 1) // max(chunk, 1))


def _at(walked: ActivationPeak, runs: int) -> int:
    """A walk's peak for a session that runs `runs` times (onnxruntime's memory pattern from the second on)."""
    return walked.repeated if runs > 1 else walked.bytes


def _no_graph(w: Workload, chunk: int, observed: tuple[str, ...] = (), runs: int = 1) -> int:
    """Without graph shapes (an HF folder before its export): one block's working set per sample, from the
    config, as the exported graph's attention holds it, and the `observed` tensors of the chunk, which the run
    returns together (each layer input as wide as its layer's in_features). Without the returned tensors the
    real SmolLM2's first W8A8 compile (8 samples of 512 tokens, 120 tensors: 1.5 GiB) measured 1.42x its plan."""
    if w.index.graph is not None:
        return 0
    wanted = set(observed)
    readers = {x.name for x in w.index.layers if x.input in wanted}
    returned = chunk * w.seqlen * ACT_BYTES * sum(input_widths(w, readers))  # q/k/v read one tensor, gate/up one
    # an encoder's TorchScript export holds the scores and their softmax, as eager attention does
    held = EXPORTED_SCORES if w.index.family in DECODER_FAMILIES else EAGER_SCORES
    slack = chunk * _largest_value(w) if runs > 1 else 0  # ActivationPeak.repeated's memory pattern
    return chunk * block_working_set(w, scores=True, held_scores=held) + returned + slack


def _largest_value(w: Workload) -> int:
    """A block's largest value per sample from its config: the attention's scores or the MLP's inner width."""
    heads = w.index.config_value("num_attention_heads") or max(1, w.hidden // 64)
    inner = w.index.config_value("intermediate_size") or 4 * w.hidden
    return ACT_BYTES * w.seqlen * max(heads * (w.seqlen + w.past), inner)


def _first_output(w: Workload, samples: int) -> int:
    """The model's first output (a decoder's logits) for `samples` samples: from the graph, or, before an
    export, from the last layer's width (the LM head's vocabulary, an encoder's hidden size)."""
    graph = w.index.graph
    if graph:
        first = graph.value(graph.outputs[0]) if graph.outputs else None
        return first.bytes(graph.sizes(samples, w.seqlen, w.past), w.seqlen) if first else 0
    width = w.index.layers[-1].out_features if w.index.layers else w.hidden
    return samples * w.seqlen * width * ACT_BYTES


def _observed_group(w: Workload, passes: int) -> tuple[str, ...]:
    """The largest group when the observed tensors are split in order into `passes` passes."""
    if not w.fetched:
        return ()
    fetched = w.fetched
    size = math.ceil(len(fetched) / max(passes, 1))
    groups = [fetched[i:i + size] for i in range(0, len(fetched), size)] or [()]
    graph = w.index.graph
    if not graph:
        return groups[0]
    return max(groups, key=lambda g: calibration_peak(graph, g, 1, w.seqlen, w.past).bytes)


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


def _block_observed(w: Workload) -> tuple[str, ...]:
    """The observed tensors of the block that returns the most of them (what one offload segment returns),
    from the layers' inputs: without a graph, a segment is a block."""
    by_block: dict[str, list] = {}
    fetched = set(w.fetched)
    for x in w.index.layers:
        if x.input in fetched and x.block:
            by_block.setdefault(x.block, []).append(x)
    widest = max(by_block.values(), key=lambda xs: sum(input_widths(w, {x.name for x in xs})), default=[])
    return tuple(x.input for x in widest)


def _largest_segment(w: Workload, chunk: int, outputs: bool = False) -> tuple[int, int]:
    """(weights, activations) of the largest offload segment, cut as the backend cuts: a segment runs
    only the nodes for what later segments read, the observed tensors and, with `outputs`, the model's
    own outputs (verification)."""
    graph = w.index.graph
    if not graph:
        return _segment_weights(w), _no_graph(w, chunk, _block_observed(w))
    runs = segment_runs([n.name for n in graph.nodes])
    wanted = set(w.fetched) | (set(graph.outputs) if outputs else set())
    worst = 0
    for index, (_, idx) in enumerate(runs):
        kept = set(segment_outputs(graph, runs, index, wanted))
        members = {graph.nodes[i].name for i in idx}
        needed = [n for n in needed_nodes(graph, kept) if n.name in members] if kept else []
        # no memory pattern's slack here: the real SmolLM2's offload measured 0.95x and an unseen Qwen2's 0.89x its
        # plan with it (1.04x and 0.97x without): a segment's peak is not where the whole graph's is
        worst = max(worst, peak(graph, needed, kept, chunk, w.seqlen, w.past).bytes)
    return _segment_weights(w), worst


def _boundary_cache(w: Workload, chunk: int) -> int:
    """Block inputs and outputs of every sample in RAM, or of one chunk when they are cached on `disk`."""
    per_sample = w.seqlen * w.hidden * ACT_BYTES
    held = chunk if w.disk else w.samples
    return 2 * held * per_sample


def onnx_quantize(w: Workload, mode: MemoryMode) -> Phase:
    """Weights are read one at a time from external data and rounded in slices; their quantized form grows
    in memory (emit then holds the model and its serialized copy: the plan's emit op), or goes straight to
    the output's data file when the output streams."""
    temps = 3 * min(w.largest_layer_bytes, SLICE_BYTES) + w.largest_layer_bytes  # one float weight + scratch of a slice
    held = ("quantized weights so far", w.quantized_bytes) if not streams_output(w, mode) else \
        ("quantized weights: written to the data file as they come", 0)
    parts: tuple[tuple[str, int], ...] = (("runtime", _runtime(w)), held, ("weight being rounded, and scratch", temps))
    if w.hessian_inputs and mode is not MemoryMode.OFFLOAD:  # offload rounded them during calibration
        parts += (("GPTQ Hessians not yet used (float32 copy of one), rounding scratch",
                   _hessians(w) + gptq_scratch(w)),)
    return Phase("quantize", sum(b for _, b in parts), parts)


def onnx_verify(w: Workload, mode: MemoryMode, chunk: int) -> Phase:
    """Float and emitted model side by side on one chunk; every model output of both is held."""
    graph = w.index.graph
    runtime = _runtime(w)
    parts: tuple[tuple[str, int], ...]
    if mode is MemoryMode.OFFLOAD:  # one segment session at a time, one sample at a time
        block_weights, block_act = _largest_segment(w, 1, outputs=True)
        values = [v for v in (graph.value(o) for o in graph.outputs) if v is not None] if graph else []
        outputs = sum(v.bytes(graph.sizes(1, w.seqlen, w.past), w.seqlen) for v in values) if graph \
            else _first_output(w, 1)
        # the segment's QDQ weights run dequantized; MatMulNBits computes from its packed ones
        dequantized = block_weights * w.dequantized_bytes // max(w.weights_bytes, 1)
        # the float model runs first over every sample; its first output is kept for each (in RAM unless `disk`)
        cached = _first_output(w, 1 if w.disk else max(w.verify_samples, 1))
        # sessions run without onnxruntime's arena (calibrate.session_from_path): what a run allocates is
        # freed when it returns, before its outputs are compared
        running = dequantized + block_act
        # the quantized model's outputs of one sample beside the float one (`cached` counts it) and the comparison
        comparing = outputs + agreement_scratch(_first_output(w, 1), w.seqlen)
        parts = (("runtime", runtime), ("weights of one segment", block_weights),
                 ("the float model's first output, kept for every held-out sample", cached),
                 ("its QDQ weights dequantized at run time and the segment's activations, or (the larger) the "
                  "quantized model's outputs of one sample and comparing them", max(running, comparing)))
    else:
        act = _no_graph(w, chunk) + _first_output(w, chunk)
        if graph:
            kept = set(graph.outputs)
            act = _at(peak(graph, needed_nodes(graph, kept), kept, chunk, w.seqlen, w.past),
                      _chunks(w.verify_samples, chunk))
        # the whole model's session is fully optimized: uint8-input layers run as integer kernels
        # the two models run one after the other (verification.py): the float one's first output waits
        # without onnxruntime's arena a run's activations are freed when it returns, before the comparison
        comparing = _first_output(w, chunk) + agreement_scratch(_first_output(w, 1), w.seqlen)
        # each session folds its constants as it starts (a quantized head's session folds none of its own: then
        # this over-counts one copy)
        folded = 2 * folded_bytes(graph) if graph else 0
        parts = (("runtime", runtime), ("float session", w.weights_bytes), ("quantized session", w.quantized_bytes),
                 ("constants onnxruntime folds as each session starts (a tied head's transposed embedding)", folded),
                 ("its QDQ weights dequantized as the layers run (DequantizeLinear outputs)", _dequantized_live(w)),
                 ("the float model's first output, kept while the quantized one runs", _first_output(w, chunk)),
                 ("activations of one chunk, or (the larger) the quantized model's first output and comparing it",
                  max(act, comparing)))
    return Phase("verify", sum(b for _, b in parts), parts)


def _dequantized_live(w: Workload) -> int:
    """The dequantized weights alive at once while a whole-model session without an arena runs: each
    DequantizeLinear output lives from its node to its reader, so the layers reading one input (q/k/v) hold
    theirs together (the W8A8 promise model with int8 inputs, 20 layers dequantizing 45 MiB: 10 MiB above
    the same model with integer kernels)."""
    return min(w.dequantized_bytes - w.integer_kernel_bytes, DEQUANTIZED_TOGETHER * w.dequantized_largest)


def export_peak(w: Workload, exporter: Exporter) -> int:
    """Exporting an HF folder in a child process: the exporter's libraries, the model in float32, the exported
    proto (onnxruntime-genai's builder; else torch.onnx, a decoder with the dynamo exporter, an encoder with the
    TorchScript one), and the compile waiting beside it."""
    float32 = w.weights_bytes * 4 // dtype_bytes(w)
    if exporter is Exporter.GENAI_BUILDER:
        return EXPORT_PARENT + BUILDER_EXPORT_RUNTIME + int(BUILDER_EXPORT_WEIGHT_COPIES * float32)
    if w.index.family in DECODER_FAMILIES:
        return EXPORT_PARENT + DYNAMO_EXPORT_RUNTIME + int(DYNAMO_EXPORT_WEIGHT_COPIES * float32)
    return EXPORT_PARENT + EXPORT_RUNTIME + 2 * float32


def onnx_rotation(w: Workload) -> Phase:
    """`transform quarot` (onnx/rotation.py): the rotated copy is written one initializer at a time; what it holds
    is the largest rotated tensor as read (onnx's external-data read holds its bytes beside the array), its float32
    result, and one slice of SLICE rows and its product (a tied head is computed from the embedding alike). The real
    SmolLM2's 108 MiB head: 433-435 MiB measured at load, against 346 planned with the tensor counted once as read."""
    largest = max((x.params for x in w.index.layers), default=0)
    scratch = 3 * 4 * largest + 2 * 4 * min(largest, ROTATION_SLICE * w.hidden)
    check = SESSION_COPIES * w.weights_bytes  # then one session at a time on a few tokens (rotation.refuse_changed)
    return Phase("rotation", RUNTIME + max(scratch, check), (
        ("runtime", RUNTIME), ("the largest tensor rotated (read, its float32 result, one slice), or the check's "
                               "session of the model, the larger", max(scratch, check))))


def onnx_emit(w: Workload, mode: MemoryMode) -> Phase:
    """The quantized model and its serialized copy; or, when the output streams, the kept float
    initializers copied into its data file a piece at a time."""
    parts: tuple[tuple[str, int], ...]
    if streams_output(w, mode):
        parts = (("runtime", _runtime(w)), ("float initializers copied a piece at a time", COPY_PIECE))
    else:
        parts = (("runtime", _runtime(w)), ("quantized model and its serialized copy", 2 * w.quantized_bytes))
        if not w.verify_samples:  # nothing else opens the staged file: emitted_check.py loads its bytes in
            # onnxruntime while they are written; the proto goes first, so the check's own copy is the third
            parts += (("onnxruntime's load check of the serialized model", w.quantized_bytes),)
    return Phase("emit", sum(b for _, b in parts), parts)


@dataclass(frozen=True)
class OnnxCosts:
    """The ONNX backend as the planner sees it (compiler.plan.target.CostModel)."""

    backend: Backend = Backend.ONNX
    default_format: EmitFormat = EmitFormat.QDQ

    def seconds(self, op: PlanOp, w: Workload, rates: Rates, mode: MemoryMode) -> float:
        """One op's estimated wall time (onnx/timing.py)."""
        return timing.seconds(op, w, rates, mode)

    def start_seconds(self, rates: Rates) -> float:
        """Before the first op (onnx/timing.py)."""
        return timing.start_seconds(rates)

    def runtime(self, w: Workload) -> int:
        """onnxruntime's runtime, whatever the run."""
        return RUNTIME

    def observer_groups(self, w: Workload) -> int:
        """low_memory may observe each tensor in a pass of its own."""
        return len(w.observed)

    def mode_effect(self, w: Workload, mode: MemoryMode) -> str | None:
        """None: the ONNX backend's modes differ in what they hold, not in what they write (the promise tests
        compare their outputs)."""
        return None

    def notes(self, w: Workload, mode: MemoryMode) -> tuple[str, ...]:
        """A folder not exported yet is estimated from its config; whether a killed run resumes (with `disk`, its
        observers saved after every chunk, or every block in offload; not offload's GPTQ: onnx/resume.py)."""
        notes = []
        if w.index.graph is None:
            notes.append("no graph shapes for this model: activation estimates are from its config (one block's "
                         "working set per sample)")
        if w.disk and w.calibrate and not (mode is MemoryMode.OFFLOAD and w.gptq):
            unit = "block" if mode is MemoryMode.OFFLOAD else "chunk"
            notes.append(f"resumable: the observers are saved under `disk` after every {unit}, and the same compile "
                         "run again after a kill goes on from there")
        return tuple(notes)

    def estimate(self, w: Workload, mode: MemoryMode, chunk: int, passes: int = 1,
                 gpus: tuple[int, ...] = ()) -> ModeEstimate:
        """Quantization always; calibration and verification when the recipe has them; the search's scoring."""
        if mode is MemoryMode.MULTI_GPU:
            return ModeEstimate(mode, 0, (), feasible=False, note="the ONNX backend runs on one device")
        phases = [onnx_quantize(w, mode)]
        if w.rotated:
            phases.append(onnx_rotation(w))
        if w.calibrate:
            phases.append(onnx_calibration(w, mode, chunk, passes))
        if w.verify_samples:
            phases.append(onnx_verify(w, mode, min(chunk, w.verify_samples)))
        if w.search is not None:
            phases.append(score_phase(w, min(chunk, w.search.samples), RUNTIME + w.data_libraries, False, False))
        return mode_estimate(mode, phases, passes)

    def phase(self, w: Workload, mode: MemoryMode, chunk: int, passes: int, phase: PhaseName) -> int:
        """One phase's peak."""
        match phase:
            case PhaseName.EXPORT:  # the lowering asks export_peak itself, with the exporter its op names
                return export_peak(w, planned_exporter(model_dir(w.index.ref)))
            case PhaseName.SCORE:
                return score_phase(w, min(chunk, w.searched.samples), RUNTIME + w.data_libraries, False, False).bytes
            case PhaseName.CALIBRATE:
                return onnx_calibration(w, mode, chunk, passes).bytes
            case PhaseName.QUANTIZE:
                return onnx_quantize(w, mode).bytes
            case PhaseName.EMIT:
                return onnx_emit(w, mode).bytes
            case PhaseName.VERIFY:
                return onnx_verify(w, mode, min(chunk, w.verify_samples)).bytes
        raise AssertionError(phase)


COSTS = OnnxCosts()
