"""The memory model's shared parts: observers, a block's working set, GPTQ Hessians, the mixed-precision
search's scoring, and how phases make a mode's peak. Each backend's own phases are in its cost module
(compiler/backends/onnx/cost.py, compiler/backends/torch/cost.py), next to the code they describe.

Every constant is documented in docs/memory.md ("Reading a plan"). Estimates are per phase (calibration,
quantization, verification); a mode's peak is the largest phase. The backends check the estimates
against measured peaks (the compile summary shows both).
"""

from __future__ import annotations

from dataclasses import dataclass

from compiler.ir.kinds import TransformData
from compiler.ir.types import AttentionKernel, MemoryMode, SensitivityMetric
from compiler.models.index import LayerKind
from compiler.plan.activations import needed_nodes, peak
from compiler.plan.decision import ModeEstimate
from compiler.plan.workload import EXPERT_PROJECTION, Workload
from compiler.quant.smoothing import SAMPLE_ROWS

MiB = 1 << 20
ACT_BYTES = 4  # activations are computed in float32 on CPU
HIST_STATE = 2 * 8  # per bin: int64 counts, plus the scratch histogram of the chunk being merged
MINMAX_STATE = 64  # per tensor: running min/max, counts of non-finite values


@dataclass(frozen=True, slots=True)
class Phase:
    """One phase's estimated peak and its parts."""
    name: str
    bytes: int
    parts: tuple[tuple[str, int], ...]


def observer_bytes(w: Workload) -> int:
    """Bytes of every observer's state."""
    per = w.bins * HIST_STATE + MINMAX_STATE if w.histogram else MINMAX_STATE
    return per * len(w.observed)


# ---- shared by the backends' cost models -------------------------------------------------------------------------------------

# A block's forward peaks in one of its two halves (measured with glibc's mmap threshold fixed, as every torch run
# that forwards the model sets it: compiler/backends/release.py; bench/block_working_set.py), in float32 tensors
# of one token's hidden size (H) or MLP width (I) per token:
# - attention under SDPA: the normed input, q, the rotated q, the attention output and its projection (about
#   ATTENTION_HIDDEN H) and k, v and the rotated k, which grouped-query attention makes smaller by kv_heads / heads
#   (ATTENTION_KV H at one KV head per head); eager attention also holds the scores and their softmax;
# - the MLP: the residual, the normed input and the output (MLP_HIDDEN H) beside the gate, up and their product
#   (MLP_INTER I).
# Bare layers measured 4.2-8.0 H in attention and 2.2 H + 2.5-2.6 I in the MLP; inside a compile's block passes
# (hooks, the rounding's heap) SmolLM2-135M's blocks measured 10-13 H where the MLP peaks (I = 2.67 H)
ATTENTION_HIDDEN, ATTENTION_KV = 5.0, 3.5
MLP_HIDDEN, MLP_INTER = 4.0, 2.75
# verification compares one sample at a time, AGREEMENT_ROWS positions at once (compiler/backends/agreement.py):
# the finite mask, their difference, two log-softmaxes and the KL's product of that many rows of the two
# outputs; measured 4.0x one output of 128 positions and 2.5x one of 512 (a vocabulary of 32,000 and 49,152),
# so about five arrays of AGREEMENT_ROWS rows (seven had planned the ONNX decoder's verification at 1.19x what
# it took)
AGREEMENT_ARRAYS = 5
AGREEMENT_ROWS = 256


def agreement_scratch(sample_bytes: int, positions: int) -> int:
    """The scratch of comparing one sample whose output takes `sample_bytes` over `positions` positions."""
    return AGREEMENT_ARRAYS * sample_bytes * min(positions, AGREEMENT_ROWS) // max(positions, 1)


EAGER_SCORES = 2.0  # eager attention holds the scores and their softmax, [heads, seq, seq] each


def block_working_set(w: Workload, scores: bool | None = None, held_scores: float = EAGER_SCORES) -> int:
    """Per-sample float32 working set of one block's forward: the larger of its attention (with the scores
    where they are held: `held_scores` tensors of [heads, seq, seq]) and its MLP. `scores` None: as
    transformers runs the model, with SDPA (its default, and what the torch backend runs) unless the recipe
    (`calibrate { attention }`) or the config asks for eager attention; SDPA never holds the scores. The ONNX
    backend's exported graphs compute them (True)."""
    cfg = w.index.config_value
    h = cfg("hidden_size") or w.hidden
    heads = cfg("num_attention_heads") or max(1, h // 64)
    kv_share = min(1.0, (cfg("num_key_value_heads") or heads) / heads)
    inter = cfg("intermediate_size") or _widest_block_output(w, h)
    s = w.seqlen
    if scores is None:
        asked = w.attention
        scores = asked is AttentionKernel.EAGER or (asked is AttentionKernel.MODEL and bool(cfg("eager_attention")))
    attention = (ATTENTION_HIDDEN + ATTENTION_KV * kv_share) * s * h + (held_scores * heads * s * s if scores else 0)
    mlp = MLP_HIDDEN * s * h + MLP_INTER * s * inter
    return int(ACT_BYTES * max(attention, mlp))


# Learned rounding (torch/learned.py) holds, while one block learns: the activations autograd keeps for a step's
# backward, LEARNED_ACTIVATIONS times the forward's working set per sample of the step; per learned weight,
# LEARNED_STATE float32 values (its offsets, their gradient, the kept best offsets, and the weight-sized tensors
# the rounding computes and autograd keeps for the backward: every layer of the block at once); and the float
# block's outputs on every calibration sample (the targets). Uncompiled, each element-wise step of the rounding
# is a tensor of its own: 8 values, fitted on eager runs of SmolLM2-135M, a StableLM of hidden 512 and a Qwen2 of
# hidden 768 (8 samples of 256 and 512 tokens: 0.97-1.06x), held out on a Mistral of hidden 1024 (bench/
# plan_vs_measured.py `--only learned`), 2026-12-05; with 5 the Qwen2 had measured up to 1.15x. Compiled, the
# fused rounding keeps fewer: 5 (SmolLM2's example recipe; the Qwen2 at 512 tokens, compiled, 0.90x). Those runs
# multiplied in bfloat16 (a CPU with AVX-512 BF16: torch/learned.py step_precision). Where the steps stay float32
# (a CPU without bfloat16 products) the products autograd keeps are twice as wide: uncompiled, 4.7 working sets a
# sample, fitted on SmolLM2's example recipe at 4 steps on a 2-core AVX2 EPYC (1.00x; 1.10x with 3.0), held out on
# bench/plan_vs_measured.py's Mistral of hidden 1024 (0.97-1.02x in three runs; 1.11-1.17x with 3.0), 2026-12-07.
# Compiled, inductor chooses what a step keeps, and the two shapes disagreed: SmolLM2's example at 10 steps 1.11x
# with 3.0, the Mistral at 40 steps 0.94-0.98x with 3.0; 3.6 is between them (1.07x, 0.89-0.92x), not held out
LEARNED_ACTIVATIONS = 3.0
LEARNED_ACTIVATIONS_FLOAT32 = 4.7
LEARNED_ACTIVATIONS_FLOAT32_COMPILED = 3.6
LEARNED_STATE = 8
LEARNED_STATE_COMPILED = 5


def learned_bytes(w: Workload, compiled: bool = False, float32_steps: bool = False) -> int:
    """What a block holds while its rounding is learned, beyond its weights (0 where nothing is learned);
    `compiled`: the steps run through torch.compile; `float32_steps`: their products stay float32 (no bfloat16
    in hardware), so the activations a step keeps for its backward are float32."""
    if w.learned is None:
        return 0
    learned = set(w.learned_layers)
    per_block: dict[str, int] = {}
    for x in w.index.layers:
        if x.name in learned and x.block:
            per_block[x.block] = per_block.get(x.block, 0) + x.params
    targets = w.samples * w.seqlen * w.hidden * ACT_BYTES
    kept = LEARNED_ACTIVATIONS if not float32_steps else \
        LEARNED_ACTIVATIONS_FLOAT32_COMPILED if compiled else LEARNED_ACTIVATIONS_FLOAT32
    step = w.learned_step_samples * block_working_set(w) * kept
    state = LEARNED_STATE_COMPILED if compiled else LEARNED_STATE
    return int(targets + step + state * ACT_BYTES * max(per_block.values(), default=0))


def _widest_block_output(w: Workload, hidden: int) -> int:
    """A model without a config (a built-in, a bare module): the MLP's width is the widest output of a block
    Linear that reads the hidden state (gate/up), 4 × hidden where there is none."""
    widths = [x.out_features for x in w.index.layers
              if x.block and x.kind is LayerKind.LINEAR and x.in_features == hidden]
    return max(widths, default=4 * hidden)


_SHARED_INPUT = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "query": "qkv", "key": "qkv", "value": "qkv",
                 "wq": "qkv", "wk": "qkv", "wv": "qkv", "gate_proj": "gate_up", "up_proj": "gate_up", "w1": "gate_up",
                 "w3": "gate_up"}


def input_key(x) -> tuple:
    """Layers reading the same tensor share a key: the graph value on ONNX; on torch (no graph), the
    parent module and the known siblings (q/k/v, gate/up)."""
    if not x.input.endswith(":input"):
        return (x.input,)
    parent, _, leaf = x.name.rpartition(".")
    return (parent, x.in_features, _SHARED_INPUT.get(leaf.lower(), leaf))


def input_widths(w: Workload, chosen: set[str]) -> list[int]:
    """The width of each distinct input the `chosen` layers read (q/k/v share one)."""
    return list({input_key(x): x.in_features for x in w.index.layers if x.name in chosen}.values())


def hessian_bytes(w: Workload, all_blocks: bool = False) -> int:
    """GPTQ: one K_in × K_in float32 Hessian per distinct layer input (q/k/v share one, gate/up one) of
    the block being quantized, or of every block at once (`full` runs the whole model with hooks)."""
    if not w.gptq:
        return 0
    quantized = set(w.quantized_layers)
    per_block: dict[str | None, dict] = {}
    for x in w.index.layers:
        if x.kind is LayerKind.LINEAR and x.name in quantized:
            per_block.setdefault(x.block, {})[input_key(x)] = x.in_features
    sizes = [sum(k * k * 4 for k in inputs.values()) for inputs in per_block.values()]
    return sum(sizes) if all_blocks else max(sizes, default=0)


def transform_bytes(w: Workload, all_blocks: bool = False, tail: bool = False) -> int:
    """An outlier transform's state for one block's mappings (or every block's, `full`; or, `tail`, only
    those outside the blocks, all that is left once the blocks are done): per mapping the per-channel |x|
    maximum (float32) and sum (float64), and for AWQ the inputs' XᵀX (float32, K×K); plus the scratch of
    scaling one mapping: SmoothQuant its targets' |W| maxima (one float32 copy of their weights), AWQ's
    search five (the weight, its scaled and rounded forms, the error, the error times XᵀX)."""
    if w.transform is None:
        return 0
    awq = w.transform.data is TransformData.GRAM  # AWQ, or a searched SmoothQuant strength
    # a searched strength also keeps the signed extremes and a sample of rows (quant/smoothing.py)
    sampled = 8 + 4 * SAMPLE_ROWS if w.transform.alpha_search else 0
    mappings = [m for m in w.smoothing if m[0] is None] if tail else list(w.smoothing)
    per_block: dict[str | None, int] = {}
    for block, width, _ in mappings:
        per_block[block] = per_block.get(block, 0) + (12 + sampled) * width + (4 * width * width if awq else 0)
    state = sum(per_block.values()) if all_blocks else max(per_block.values(), default=0)
    largest = max((weights for _, _, weights in mappings), default=0)
    return state + (5 if awq else 1) * largest


def gptq_scratch_bytes(k: int, weight: int) -> int:
    """GPTQ's scratch while it rounds one layer of `k` inputs and `weight` float32 bytes, beyond the weight and
    its Hessian: one more K×K matrix (H is factorised in place: each step of H → JHJ → L → U frees the one
    before) and about five copies of the weight (its working copy, the rounded columns, the scales of the
    float weight, the final integers' float scratch). Measured 4.4–4.9 copies: bench/gptq_memory.py."""
    return k * k * 4 + 5 * weight


def gptq_scratch(w: Workload) -> int:
    """The scratch of rounding the plan's widest and largest GPTQ layers (gptq_scratch_bytes), or of its largest
    batch of same-shape experts (expert_batches), whichever is more."""
    if not w.gptq:
        return 0
    quantized = [x for x in w.index.layers if x.name in set(w.gptq_layers) and x.kind is LayerKind.LINEAR]
    k = max((x.in_features for x in quantized), default=0)
    weight = max((x.params * 4 for x in quantized), default=0)
    batchable = set(w.batchable_gptq_layers)  # group scales taken in the loop round one layer at a time
    batches = expert_batches([x for x in quantized if x.name in batchable])
    batched = max((batch_scratch_bytes(batch) for batch in batches), default=0)
    return max(gptq_scratch_bytes(k, weight), batched)


# An MoE block's experts of one shape are rounded by GPTQ as a batch (compiler/quant/gptq_batch.py): each
# expert's loop over its columns is a few small tensor operations per column, which cost more to dispatch than to
# compute; a batch pays that once. A batch's scratch is bounded by this (more experts than fit: several batches)
EXPERT_BATCH_BYTES = 48 * MiB


def batch_scratch_bytes(layers: list) -> int:
    """GPTQ's scratch while it rounds `layers` (one shape) as a batch, beyond their weights and Hessians: the
    Hessians stacked, then two of the K×K matrices H → JHJ → L → U at a time, and five copies of each weight (as
    gptq_scratch_bytes)."""
    return sum(2 * x.in_features * x.in_features * 4 + 5 * x.params * 4 for x in layers)


def expert_batches(layers: list) -> list[list]:
    """`layers` (GPTQ Linears, index order) that round as batches: the experts of each block by shape, in
    batches of at least two whose scratch fits EXPERT_BATCH_BYTES. Duck-typed on models.index.Layer's `name`,
    `block`, `shape`, `in_features` and `params`, which the backends' jobs carry too."""
    groups: dict[tuple, list] = {}
    for layer in layers:
        if layer.block is not None and EXPERT_PROJECTION.search(layer.name + "."):
            groups.setdefault((layer.block, tuple(layer.shape)), []).append(layer)
    batches = []
    for group in groups.values():
        fits = max(1, EXPERT_BATCH_BYTES // batch_scratch_bytes(group[:1]))
        batches += [group[i:i + fits] for i in range(0, len(group), fits) if len(group[i:i + fits]) > 1]
    return batches


def score_phase(w: Workload, chunk: int, runtime: int, float32_model: bool, gradients: bool) -> Phase:
    """The mixed-precision search's scoring (compiler/backends/sensitivity.py). snr reads one weight at a
    time; mse runs the float model once with every searched layer's XᵀX (float64) held; kld holds every
    searched weight in float32 under each choice, and with `gradients` (the first-order estimate) their
    gradients and the backward pass's saved activations (one block's working set per block).
    `float32_model`: the model is held in float32 whatever its stored dtype (torch on CPU)."""
    search = w.searched
    rounding = 3 * 4 * search.largest_params  # one float32 weight, its rounded copy, the error
    if search.metric is SensitivityMetric.SNR:
        weights_only = (("runtime", runtime), ("one weight rounded under each choice", rounding))
        return Phase("score", sum(b for _, b in weights_only), weights_only)
    resident = w.weights_bytes * 4 // dtype_bytes(w) if float32_model else w.weights_bytes
    graph = w.index.graph
    backward = search.metric is SensitivityMetric.KLD and gradients
    if graph and not float32_model:
        kept = set(graph.outputs)
        act = peak(graph, needed_nodes(graph, kept), kept, chunk, w.seqlen, w.past).bytes
    else:
        act = chunk * block_working_set(w) * (1 + (len(w.blocks) if backward else 0))
    last = w.index.layers[-1].out_features if w.index.layers else w.hidden
    logits = 3 * chunk * w.seqlen * last * ACT_BYTES  # float and candidate outputs, and a log-softmax
    parts: list[tuple[str, int]] = [("runtime", runtime), ("float model" + (" (float32)" if float32_model else ""), resident),
             ("activations of one chunk" + (" saved for the backward pass" if backward else ""), act)]
    if search.metric is SensitivityMetric.MSE:
        layers = [w.index.layer(n) for n in search.layers]
        grams = sum(8 * k * k for k in {input_key(x): x.in_features for x in layers}.values())
        parts += [("XᵀX of each distinct searched input (float64)", grams), ("rounding scratch", rounding)]
    else:
        copies = search.choices + (1 if gradients else 0)  # each choice's weights (+ gradients)
        parts += [(f"searched weights × {copies} (float32)", copies * 4 * search.params), ("model outputs", logits)]
    return Phase("score", sum(b for _, b in parts), tuple(parts))


def mode_estimate(mode: MemoryMode, phases: list[Phase], passes: int = 1, vram: int = 0) -> ModeEstimate:
    """A mode's estimate from its phases: the largest is the peak."""
    worst = max(phases, key=lambda p: p.bytes)
    note = f"peak in {worst.name}" + (f", {passes} passes over the data" if passes > 1 else "")
    return ModeEstimate(mode, worst.bytes, worst.parts, peak_vram=vram, note=note)


def dtype_bytes(w: Workload) -> int:
    """Bytes per element of the model's float weights (2 when all are fp16/bf16)."""
    dtypes = {x.dtype for x in w.index.layers}
    return 2 if dtypes and dtypes <= {"float16", "bfloat16"} else 4


