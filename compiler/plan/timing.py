"""Time in the plan: each op's estimated seconds from a cost model of its work (the FLOPs of the forward passes it
runs, GPTQ's Hessians and rounding, the bytes it rounds and writes) at this machine's rates, and the seconds a
compile spends before its first op. The work is counted here; what each backend spends on it (its sessions, its
first forward, its imports) is its cost model's (CostModel.seconds, in compiler/backends/*/timing.py).

The rates (REFERENCE) were measured on the machine docs/memory.md names; another machine's are those scaled by
its speed against that one, measured once by a short matrix product (`machine_speed`, cached under qrc's cache
folder). Pure numbers: no torch or onnxruntime import, no weight read (`qrc plan` stays light).
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path

from compiler.ir.types import MemoryMode, SensitivityMetric
from compiler.models.index import LayerKind
from compiler.plan import ops
from compiler.plan.memory import EXPERT_PROJECTION, expert_batches, input_key, input_widths
from compiler.plan.workload import Workload
from compiler.safe_files import read_json


@dataclass(frozen=True)
class Rates:
    """A machine's speed as the cost model uses it (seconds are work / rate, plus fixed costs)."""

    speed: float  # against the reference machine's: the backends' fixed costs are divided by it (`fixed`)
    flops: float  # FLOP/s of a model's forward pass and of GPTQ's Hessian sums, in float32 (all cores)
    gptq_elements: float  # weights/s through GPTQ's column loop (its blocks of columns, the scale search)
    rounding: float  # weight bytes/s rounded to a grid (rtn and observers' scales)
    disk: float  # bytes/s written (or read from the page cache)
    block: float  # s of each block-wise step beyond its compute: hooks, caches, the block's weights moved
    dataset: float  # s: the datasets library imported and a dataset's rows read
    templates: float  # s: the chat-template child process started and its rows rendered, per reading

    def fixed(self, seconds: float) -> float:
        """A fixed cost measured on the reference machine, on this one."""
        return seconds / self.speed


# Fitted on the 2-core AVX-512 machine of docs/memory.md (2026-12-02) from compiles of a hidden-512 Llama of 4 blocks
# on both backends in every mode (GPTQ and rtn, W8A8 and W4A16) and of every example recipe, each in its own process
REFERENCE = Rates(speed=1.0, flops=110e9, gptq_elements=4.0e6, rounding=250e6, disk=800e6, block=0.25, dataset=0.9,
                  templates=0.9)
# the probe's square matrices: about 12 ms of float32 products here. A 512² product (2 ms, best of five)
# measured this machine 1.0-1.96x the reference from one process to the next, and the plan kept whichever it got
_SPEED_PROBE = 1024
_PROBE_RUNS = 7


def machine_speed(cache: Path | None) -> float:
    """This machine's speed against REFERENCE's (>1: faster): a float32 matrix product timed and the fastest
    figure kept in `cache` (qrc's cache folder) per host; 1.0 where it cannot be measured.

    Each call probes again, briefly, and keeps the larger figure: another process on the cores only slows the
    probe, so a figure taken while the machine was busy is raised by the next quiet one instead of standing
    for good (a 2-core host kept 0.53 from one busy moment, and planned every compile at twice its time, where
    the probe measures 1.04-1.10 when the cores are free)."""
    key = f"v2:{platform.node()}:{os.cpu_count()}"  # v2: the steadier probe (a v1 figure is measured again)
    path = cache / "machine-speed.json" if cache is not None else None
    try:  # qrc's own file: never read through a link, whole or nested past the parser (a planted one is remade)
        known = read_json(path, 1 << 20, own=True) if path is not None else {}  # none yet: an OSError
    except (OSError, ValueError):
        known = {}
    cached = known.get(key) if isinstance(known, dict) else None
    if isinstance(cached, int | float) and 0.01 < cached < 100:
        speed = _probe(_RECHECK_RUNS)
        if speed <= cached:
            return float(cached)
    else:
        speed = _probe()
    if path is not None:
        try:
            from compiler.safe_files import own_folder, replace_file

            own_folder(path.parent)
            replace_file(path, json.dumps({**(known if isinstance(known, dict) else {}), key: speed}))
        except OSError:  # a read-only cache: measured again next time
            pass
    return speed


# the probe's best on the reference machine (numpy 2, OpenBLAS): 11.5-12.7 ms over six processes; the best
# of seven, not the median, because a moment's interference (qrc's own threads, another process) only slows
REFERENCE_PROBE_S = 0.0118


_RECHECK_RUNS = 3  # a cached figure's check: about 50 ms with the first product


def _probe(runs: int = _PROBE_RUNS) -> float:
    """REFERENCE_PROBE_S over this machine's best time of `runs` float32 matrix products, after one product
    that starts BLAS's threads (the first call pays for them)."""
    try:
        import numpy as np
    except ImportError:
        return 1.0
    a = np.random.default_rng(0).standard_normal((_SPEED_PROBE, _SPEED_PROBE), dtype=np.float32)
    a @ a
    took = []
    for _ in range(runs):
        began = time.perf_counter()
        a @ a
        took.append(time.perf_counter() - began)
    return min(100.0, max(0.01, REFERENCE_PROBE_S / max(min(took), 1e-6)))


def scaled(rates: Rates, speed: float) -> Rates:
    """`rates` on a machine `speed` times as fast (its fixed costs shrink with it; its disk is not faster, nor
    are the datasets library's import and the chat templates' child process: on a machine whose products ran
    1.86x the reference's they took the reference's 1.8 s, and the chat example measured 1.40x its plan with
    them scaled)."""
    return Rates(speed=rates.speed * speed, flops=rates.flops * speed, gptq_elements=rates.gptq_elements * speed,
                 rounding=rates.rounding * speed, disk=rates.disk, block=rates.block / speed,
                 dataset=rates.dataset, templates=rates.templates)


# ---- the work ---------------------------------------------------------------------------------------------
def token_flops(w: Workload, blocks_only: bool = False, every_expert: bool = False) -> float:
    """FLOPs of one token through the model: 2 per weight of every Linear (the LM head too unless
    `blocks_only`), an MoE expert's only for the tokens it multiplies (expert_shares), and attention's two
    products over the sequence. `every_expert`: a statistics pass with `experts all`."""
    shares = expert_shares(w, every_expert)
    linear = sum(x.params * shares.get(x.name, 1.0) for x in w.index.layers
                 if x.kind is LayerKind.LINEAR and (x.block is not None or not blocks_only))
    blocks = len({x.block for x in w.index.layers if x.block is not None})
    return 2.0 * linear + 4.0 * blocks * w.seqlen * _hidden(w)


def _hidden(w: Workload) -> int:
    """The model's hidden width: its config's, else the one the index inferred."""
    return w.index.config_value("hidden_size") or w.hidden


def expert_shares(w: Workload, every_expert: bool) -> dict[str, float]:
    """The share of a pass's tokens each MoE expert projection multiplies (a layer not listed: all of them):
    the tokens routed to it (top-k of its block's experts: `num_experts_per_tok`), except the projections
    reading the block's hidden states (gate, up) in a pass with `experts all`, which take every token (the
    down projection still multiplies its routed rows: torch/experts.py). Unknown routing counts every token."""
    top = w.index.config_value("num_experts_per_tok")
    hidden = w.index.config_value("hidden_size")
    experts = {}
    ids: dict[str | None, set[str]] = {}
    for x in w.index.layers:
        found = EXPERT_PROJECTION.search(x.name + ".")
        if found:
            experts[x.name] = x
            ids.setdefault(x.block, set()).add(found.group(0))
    if not isinstance(top, int) or top <= 0:
        return {}
    shares = {}
    for name, x in experts.items():
        count = len(ids[x.block])
        shares[name] = 1.0 if count <= top or (every_expert and x.in_features == hidden) else top / count
    return shares


def _hessian_inputs(w: Workload, chosen: set[str]) -> dict[str, tuple[tuple, int, float]]:
    """Each chosen layer's Hessian: the key of the input it is summed over (layers of one key share it), its
    width, and the share of the tokens it sees. q/k/v share one, an expert's gate and up one; with `experts all`
    every expert's gate and up of a block read the same hidden states (one Hessian: torch/layers.py Statistics)
    and every down projection sees every token."""
    shares = {} if w.every_expert else expert_shares(w, False)
    hidden = w.index.config_value("hidden_size")
    found: dict[str, tuple[tuple, int, float]] = {}
    for x in w.index.layers:
        if x.name not in chosen:
            continue
        shared = w.every_expert and x.in_features == hidden and EXPERT_PROJECTION.search(x.name + ".") is not None
        key = (x.block, "experts", x.in_features) if shared else input_key(x)
        found[x.name] = (key, x.in_features, shares.get(x.name, 1.0))
    return found


def hessian_seconds(w: Workload, rates: Rates, layers: tuple[str, ...] | None = None) -> float:
    """GPTQ's Hessian sums over the calibration tokens each input sees: 2·T·K² FLOPs per distinct input,
    one large product per chunk, which runs at about twice a forward's rate."""
    chosen = set(w.gptq_layers) if layers is None else set(layers) & set(w.gptq_layers)
    tokens = w.samples * w.seqlen
    distinct = {key: (k, share) for key, k, share in _hessian_inputs(w, chosen).values()}
    return sum(2 * tokens * share * k ** 2 for k, share in distinct.values()) / (2 * rates.flops)


# GPTQ's column loop over a batch of an MoE block's same-shape experts (quant/gptq_batch.py) against one expert
# at a time: bench/moe_gptq.py measured 11.9-17.1 s one at a time against 4.5-6.0 s in batches (2.4-2.85x) for
# 384 experts of 131,072 weights (2026-12-04)
EXPERT_BATCH_SPEEDUP = 2.4


def gptq_seconds(w: Workload, rates: Rates, layers: tuple[str, ...] | None = None) -> float:
    """GPTQ's rounding of its layers (of `layers` when given), once the Hessians are summed: the factorisation
    (≈ K³ FLOPs per layer; a batch of experts factorises each distinct Hessian once) and the column loop (N·K
    weights through blocks of columns and the scale search; FP4_GPTQ_LOOP times onto an FP4 grid), EXPERT_BATCH_SPEEDUP
    times faster in a batch."""
    chosen = set(w.gptq_layers) if layers is None else set(layers) & set(w.gptq_layers)
    found = [x for x in w.index.layers if x.name in chosen]
    batchable = set(w.batchable_gptq_layers)
    batches = expert_batches([x for x in found if x.name in batchable])
    batched = {x.name for batch in batches for x in batch}
    inputs = _hessian_inputs(w, batched)
    factored = sum(x.in_features ** 3 for x in found if x.name not in batched)
    factored += sum(k ** 3 for batch in batches for k in {inputs[x.name][0]: inputs[x.name][1] for x in batch}.values())
    fp4 = set(w.fp4_weight_layers)
    loop = sum(x.out_features * x.in_features * (FP4_GPTQ_LOOP if x.name in fp4 else 1.0)
               / (EXPERT_BATCH_SPEEDUP if x.name in batched else 1.0) for x in found)
    return factored / rates.flops + loop / rates.gptq_elements


# GPTQ's column loop onto an FP4 grid (quant/gptq.py `_fp4_rounded`: each block of 16 or 32 columns rounded to
# the e2m1 values under its block's scale) against the integer grids `gptq_elements` was fitted on: NVFP4 with
# searched scales measured 1.08-1.23x that rate on the real SmolLM2-135M's 210 layers (28-33 s against 26 planned,
# four compiles) and 1.09x on a Mistral of hidden 1024 (6.8-6.9 s against 6.3, 2026-12-06)
FP4_GPTQ_LOOP = 1.12


# A weight rounded with its inputs' importance (imatrix: llama.cpp's search of candidate scales) takes this many
# times an rtn rounding's time: the real SmolLM2-135M's 210 layers to Q4_0/Q8_0, 405 MiB of float32, rounded in
# 5.2 s where rtn takes 0.9 (2026-12-03)
SEARCHED_ROUNDING = 5.5
# An NVFP4/MXFP4 weight whose block scales are searched (`rounding mse`/`imatrix`, GPTQ's `mse_scales`: each block
# rounded again under 4 or 2 other scales in the compiled loop) takes this many times an rtn rounding's time: the real SmolLM2-135M's 210 layers to
# NVFP4A16 file to file rounded in 2.0 s where rtn took 0.9-1.2 (from its float folder) and 3.1-3.7 s where rtn
# took 2.0-2.5 (from its GGUF), against 1.8 s planned for rtn (2026-12-05)
FP4_SEARCHED_ROUNDING = 1.6
# A weight rounded to a K-quant searches its sub-blocks' scales (and Q4_K/Q5_K's mins) over candidates as llama.cpp's
# quantizer does (quant/kquants.py: numpy, every candidate over the whole tensor), with or without an importance
# matrix, before GPTQ where it rounds: this many times an rtn rounding's time, by type. Fitted on a random Llama of
# 8 blocks, hidden 1024 (403 MB of float32 weights), file to file into GGUF, on a machine 1.03x the reference
# (2026-12-07): the rounding op took Q4_K 33 s, Q5_K 23 s, Q6_K 21 s, where rtn's rate planned 1.6 s; a second
# sitting's whole compiles took Q4_K 30 s and Q6_K 21 s against the first's 35 and 23 (the constants lie between
# the two). Held out, a Llama of 12 blocks, hidden 512, as llama.cpp's Q4_K_M assigns types: 9.1-14 s over six
# runs against 12.7 planned (3.2 before), and with `rounding imatrix` on 16 calibration samples 22 s against 22.4 (16
# before): bench/plan_vs_measured.py --only sources
KQUANT_SEARCH = {"q4_k": 19.1, "q5_k": 14.4, "q6_k": 12.5}
KQUANT_SEARCH_OTHER = max(KQUANT_SEARCH.values())  # a K-quant a plug-in registers: the costliest known
# Statistics gathered by hooks on a layer's inputs (imatrix's column squares, SmoothQuant's and AWQ's channel
# maxima) cost this many bytes at the rounding rate per input element: SmolLM2-135M's imatrix hooks read 1.6G
# elements in 6.2 s on a machine 1.74x the reference
STATISTICS_BYTES = 2.0


# A layer that rounds its input to FP4 as the model runs (NVFP4/MXFP4 activations: compressed-tensors' dynamic
# group scales and rounding) costs this many bytes at the rounding rate per input element: 18-20 ns an element on
# a machine 1.8x the reference (SmolLM2-135M's NVFP4 compile measured 40-47 s against 23 planned without it)
FP4_INPUT_BYTES = 8.5


def fp4_input_seconds(w: Workload, rates: Rates, samples: int) -> float:
    """`samples` through layers that round their inputs to FP4 (the rounded model's forwards)."""
    return samples * w.seqlen * w.fp4_input_elements * FP4_INPUT_BYTES / rates.rounding


# A learned-rounding step of `batch` samples (torch/learned.py: the forward with every learned weight rounded as it
# runs, the backward, the sign steps) costs this many times the plain forward's FLOPs at the forward's rate: in
# float32, and where the steps' products run in bfloat16 (a CPU that multiplies it in hardware). Measured on
# SmolLM2-135M's blocks, 8 samples of 512 tokens, two cores, the heap reused across steps: 0.33 s and 0.18 s a
# step against 0.168 s of FLOPs (the example recipe's 1,500 steps: 315 s in all, 2026-12-03). Compiled
# (torch/compiled_steps.py), the element-wise work around the products is fused: 0.117 s a step with bfloat16
# products, 0.29 s in float32 (0.34 eager, the same block alone), and LEARNED_COMPILE seconds once a run for compiling
# with torch's compile cache cold (17.4 s measured; 1.9 s once the cache holds the block's kernels, 2026-12-04).
# Those bfloat16 figures come from a CPU with AMX tiles. One with AVX-512 BF16 dot products and no AMX (an AMD
# EPYC) ran the example's 1,500 compiled steps in 575 s (2026-12-04: 1.43 forwards at that day's probe) and in
# 538 s (2026-12-05: 1.34), so 1.38, the middle; its streams at 0.55-0.56 of float32's (0.51 s against 0.91 a
# pass of 32 samples). One block's steps alone there (2026-12-05): 0.36 s compiled, 0.41 s uncompiled (1.56
# forwards) and 0.62 s uncompiled in float32 (2.35), against 0.265 s of planned forward.
# Those float32 figures were a CPU with AMX running float32; a CPU without bfloat16 products runs float32 steps
# always (BFloat16Products.CONVERTED), and a 2-core AVX2 EPYC (2026-12-07) ran SmolLM2's example recipe's steps
# slower per planned FLOP: uncompiled 120 steps in 98.4 s (2.7 forwards), compiled 300 in 214 s with a warm compile
# cache (2.1 with the planned compile); held out, the Mistral of hidden 1024 (bench/plan_vs_measured.py) uncompiled
# 1.00-1.07x its plan with 2.7. Compiled, that Mistral's steps there ran about as fast as uncompiled (1.59-1.95 s a
# step against 1.65-1.77), where SmolLM2's gained 13% (0.71 s against 0.82): up to 1.30x its plan, which no constant
# fitted on SmolLM2 carried (bench/results/plan_vs_measured.md). What compiling buys there is the element-wise work
# it fuses, a smaller part of a wider block's step: measured again (2026-12-07, random Llamas of 2 blocks, 8 samples
# of 512 tokens a step, the compile cache warm), hidden 1024 0.966x the uncompiled step, fitted with SmolLM2's
# 0.866x as that ratio times (hidden / 576) ** 0.19, never above 1; held out, hidden 768 measured 0.91x (0.915x
# predicted). Compiling with the cache cold took 21-33 s more than with it warm (3 s), where the CPUs with bfloat16
# products took 17 s
LEARNED_STEP_FORWARDS = 2.7
COMPILED_STEP_RATIO, COMPILED_WIDTH_POWER = 0.866, 0.19
LEARNED_COMPILE, LEARNED_COMPILE_FLOAT32 = 17.0, 29.0
# The steps' bfloat16 products run faster per FLOP on wider matrices: uncompiled 8-sample steps measured 0.99x
# their plan on SmolLM2-135M (hidden 576) and 0.91x on a Qwen2 of hidden 768 (256 and 512 tokens), fitted as the
# hidden width's power -0.29 from SmolLM2's (2026-12-05); held out, a StableLM of hidden 512 measured 1.03x and a
# Mistral of hidden 1024 0.86x the plan without it, 1.03x and 0.84x predicted
LEARNED_WIDTH, LEARNED_WIDTH_POWER = 576, 0.29
# A block's last step runs its forward only (torch/learned.py: its move would give parameters no step measures): the
# backward is about two thirds of a step (one of SmolLM2-135M's blocks, float32, 8 samples of 512 tokens: 0.29 s
# forward against 0.83-0.94 s a step, 2026-12-07)
LAST_STEP_SKIPPED = 2.0 / 3.0


class BFloat16Products(Enum):
    """How the CPU multiplies bfloat16 (torch/learned.py runs the steps' products in it where it is in hardware)."""

    CONVERTED = "converted"  # no hardware support: converted to float32 and back (the steps stay float32)
    AVX512_BF16 = "avx512_bf16"  # AVX-512 BF16's dot products
    AMX = "amx_bf16"  # AMX's tiles


@dataclass(frozen=True)
class LearnedSteps:
    """Learned rounding's steps on one kind of CPU: an uncompiled step and a compiled one in forwards (the compiled
    one at LEARNED_WIDTH, its ratio to the uncompiled one growing with the width as `compiled_width_power` says,
    never past 1), the learning streams' fraction of float32's pass (the float targets and the rounded stream to the
    next block take the steps' precision: on AMX 0.25 s against about 0.75 s a block, 32 samples), and the seconds
    compiling takes with torch's compile cache cold."""

    eager: float
    compiled: float
    streams: float
    compiled_width_power: float = 0.0
    compile_seconds: float = LEARNED_COMPILE

    def compiled_at(self, hidden: int) -> float:
        """A compiled step in forwards, for blocks of this hidden width."""
        return min(self.eager, self.compiled * (max(hidden, 1) / LEARNED_WIDTH) ** self.compiled_width_power)


LEARNED_FACTORS = {
    BFloat16Products.CONVERTED: LearnedSteps(LEARNED_STEP_FORWARDS, LEARNED_STEP_FORWARDS * COMPILED_STEP_RATIO, 1.0,
                                             COMPILED_WIDTH_POWER, LEARNED_COMPILE_FLOAT32),
    BFloat16Products.AVX512_BF16: LearnedSteps(1.56, 1.38, 0.55),
    BFloat16Products.AMX: LearnedSteps(1.1, 0.7, 0.35)}


def learned_seconds(w: Workload, rates: Rates, bfloat16: BFloat16Products, compiled: bool = False) -> float:
    """Learned rounding's steps in every block: `iters` steps of `batch` samples forward and backward, the last
    forward only (LAST_STEP_SKIPPED; the float stream they learn against is counted with the block's other
    streams); `bfloat16`: how the CPU multiplies the steps' products; `compiled`: the steps run through
    torch.compile."""
    if w.learned is None:
        return 0.0
    blocks = len(w.blocks) or 1
    hidden = _hidden(w)
    step = w.learned_step_samples * w.seqlen * token_flops(w, blocks_only=True) / blocks / rates.flops
    step *= (LEARNED_WIDTH / max(hidden, 1)) ** LEARNED_WIDTH_POWER
    kind = LEARNED_FACTORS[bfloat16]
    steps = blocks * (w.learned.iters - LAST_STEP_SKIPPED)
    if compiled:
        return rates.fixed(kind.compile_seconds) + steps * step * kind.compiled_at(hidden)
    return steps * step * kind.eager


def learned_stream_fraction(bfloat16: BFloat16Products) -> float:
    """What a learning block's stream pass costs against float32's, its products multiplied as `bfloat16` says."""
    return LEARNED_FACTORS[bfloat16].streams


def learned_weights(w: Workload) -> int:
    """The weights whose rounding is learned, every block's."""
    learned = set(w.learned_layers)
    return sum(x.params for x in w.index.layers if x.name in learned)


def rounded_bytes(w: Workload, layers: tuple[str, ...] | None = None) -> float:
    """The float bytes of the layers rounded (of `layers` when given, else every quantized one), the ones whose
    rounding searches with their inputs' importance counted SEARCHED_ROUNDING times, FP4 ones whose block
    scales `rounding mse`/`imatrix` search FP4_SEARCHED_ROUNDING times."""
    names = set(w.quantized_layers) if not layers else set(layers)
    # a learned layer's start is searched on its block's tensors (torch/learned.py: 0.04 s for a SmolLM2-135M
    # block's seven layers, 2026-12-05), its rounding learned: counted as the learning
    searched = set(w.imatrix_layers) - set(w.learned_layers)
    fp4_searched = set(w.fp4_searched_layers)
    kquants = {name: KQUANT_SEARCH.get(qtype, KQUANT_SEARCH_OTHER) for name, qtype in w.kquant_layers}

    def times_rtn(name: str) -> float:
        if name in kquants:  # the K-quant's own search, whatever its rounding
            return kquants[name]
        if name in fp4_searched:
            return FP4_SEARCHED_ROUNDING
        return SEARCHED_ROUNDING if name in searched else 1.0

    return float(sum(x.bytes * times_rtn(x.name) for x in w.index.layers if x.name in names))


def statistics_seconds(w: Workload, rates: Rates, widths: list[int], samples: int) -> float:
    """Hooks reading `samples` of each input of these `widths` (one per distinct input) to gather statistics."""
    return samples * w.seqlen * sum(widths) * STATISTICS_BYTES / rates.rounding


def importance_seconds(w: Workload, rates: Rates) -> float:
    """imatrix's column squares over every calibration token, once per distinct input (q/k/v share one)."""
    return statistics_seconds(w, rates, input_widths(w, set(w.imatrix_layers)), w.samples)


def forward(w: Workload, rates: Rates, samples: float, blocks_only: bool = False, statistics: bool = False) -> float:
    """`samples` through the model (or its blocks only); `statistics`: a pass gathering statistics, which sends
    every token through every MoE expert under `experts all`."""
    return samples * w.seqlen * token_flops(w, blocks_only, statistics and w.every_expert) / rates.flops


def reading(w: Workload, rates: Rates, first: bool) -> float:
    """Reading the samples of a dataset: its library (the `first` reading only) and its chat template."""
    if not w.reads_dataset:
        return 0.0
    return (rates.dataset if first else 0.0) + (rates.templates if w.templated else 0.0)


# AWQ's search, per mapping and grid point beyond rounding its targets: scaling, the error's products, torch's
# dispatch (about 5 ms a point at 1.8x the reference: the tiny example's 6 mappings × 20 points took 1.0 s
# where the plan had 0.4 without it)
AWQ_POINT = 0.010


def smooth_seconds(w: Workload, rates: Rates, blocks_only: bool = False, whole: bool = False) -> float:
    """The transform's statistics pass over the calibration data and its search (AWQ: a grid of roundings
    of each mapping's targets). Block by block (`blocks_only`) the pass runs through each block before its
    rounding, and the fold's check runs the block on one chunk before and after it. Through the `whole` model
    (torch) the LM head runs on the last position only, as nothing reads its output."""
    t = w.transform
    grid = t.search_points if t is not None else 0  # a fixed SmoothQuant strength searches nothing
    searched = grid * sum(b for _, _, b in w.smoothing)
    points = rates.fixed(AWQ_POINT) * grid * len(w.smoothing)
    probes = 2 * min(w.chunk, w.samples) if blocks_only else 0
    gathered = statistics_seconds(w, rates, [width for _, width, _ in w.smoothing], w.samples)
    return (forward(w, rates, w.samples + probes, blocks_only or whole, statistics=True) + gathered
            + searched / rates.rounding + points)


def quantize_seconds(op: ops.PlanOp, w: Workload, rates: Rates) -> float:
    """Rounding the op's layers (their GPTQ Hessians were summed while calibrating)."""
    layers = op.layers or tuple(w.quantized_layers)
    return rounded_bytes(w, layers) / rates.rounding + gptq_seconds(w, rates, layers)


def score_seconds(op: ops.ScoreSensitivity, w: Workload, rates: Rates, first_run: float) -> float:
    """The search's scores: snr rounds each searched weight under each choice; mse and kld run the model over
    the samples (kld once per unit and choice, against the float outputs), after `first_run`."""
    choices = max(1, w.search.choices) if w.search is not None else 1
    rounding = 4 * op.params_searched * choices / rates.rounding
    if op.metric is SensitivityMetric.SNR:
        return rounding
    runs = 1 + (op.units * choices if op.metric is SensitivityMetric.KLD else 0)
    return first_run + rounding + reading(w, rates, False) + runs * forward(w, rates, op.samples)


Estimate = Callable[..., float]  # (op of the kind it is filed under, workload, rates, mode) -> seconds


def by_kind(estimates: dict[ops.OpKind, Estimate], op: ops.PlanOp, w: Workload, rates: Rates,
            mode: MemoryMode) -> float:
    """A backend's estimate of one op from its table by op kind; the kinds it leaves out take no measurable time."""
    estimate = estimates.get(op.kind)
    return estimate(op, w, rates, mode) if estimate is not None else 0.0


def timed(lowered: tuple[ops.PlanOp, ...], w: Workload, rates: Rates, mode: MemoryMode,
          seconds: Callable[[ops.PlanOp, Workload, Rates, MemoryMode], float]) -> tuple[ops.PlanOp, ...]:
    """The ops with their estimated seconds (all of an op's repeats together), by the backend's cost model's
    `seconds` (CostModel.seconds)."""
    return tuple(replace(op, seconds=max(0.0, seconds(op, w, rates, mode))) for op in lowered)


# A rotated tensor costs about what rounding it costs (float32 bytes at the rounding rate): `right` reshapes, copies
# and multiplies by small Kronecker factors, passes over memory rather than FLOPs (5-8 ns an element for factors of
# 8 to 192, alike; the norm folding and Qᵀ's transposes beside it). The real SmolLM2's 163M rotated elements took
# 2.33 s at load beyond the unrotated compile's, 1.04 times this (2026-12-05, a 2-core AMD EPYC)
ROTATION_ROUNDINGS = 1.0


def rotation_seconds(w: Workload, rates: Rates) -> float:
    """`transform quarot`: every rotated tensor at ROTATION_ROUNDINGS times its float32 rounding's time, counted at
    load (the torch backend rotates block by block and file to file as each tensor is read; the ONNX backend
    writes a rotated copy first)."""
    if not w.rotated or not w.index.norms:
        return 0.0
    return ROTATION_ROUNDINGS * 4.0 * sum(x.params for x in w.index.layers) / rates.rounding
