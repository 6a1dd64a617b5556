"""Learned rounding (`rounding autoround`, docs/recipe-language.md): AutoRound's sign-SGD, one block at a time.

Each learned Linear's weight is rounded as `q = clamp(round(w / s + v) + z)` with `v` an offset per weight in
[-0.5, 0.5] and the scale `s` (and zero point `z`) from its group's range scaled by two clipping factors in
[0, 1]. Starting from round to nearest (`v = 0`; symmetric groups on the full grid, their largest magnitude on
the negative end), every step runs `batch` calibration samples through the block with the weights so
rounded (the rounding's gradient passed straight through), takes the mean squared error against the targets, and
moves each parameter by the sign of its gradient times a learning rate decaying linearly to 0. The parameters of
the step with the lowest loss are kept.

The clipping factors start at 1 (AutoRound's start) for asymmetric groups. Symmetric groups start from the scale
search `rounding imatrix` makes (quant/weights.py's signed search: each group's largest magnitude divided over 8
to 16 steps, the least squared error weighted by each input column's mean square over the calibration tokens,
which the block's statistics pass gathers): 50 steps move a factor by at most about 0.13, so where they start
matters. On validation text of the real SmolLM2 (bench/real_validation.py, int4 groups of 64, AutoRound's light
preset) the searched start took KL against float from 0.0784 to 0.0721 and perplexity from +6.8% to +4.9%; the
same search unweighted, 0.0768 (bench/README.md, choices made on validation text).

Long runs compile each step's forward and backward with torch.compile (compiled_steps.py says when; the blocks share
the compiled code), as AutoRound does: 0.117 s a step on SmolLM2-135M's blocks against 0.22 s eager.

The inputs are the calibration stream as it enters the block, which earlier blocks' rounding has already changed;
the targets are the float model's: the float block on the float stream (blockwise.py), so a block also learns to
undo what the blocks before it left (AutoRound's `enable_quanted_input`; learning against the float block on the
rounded inputs, from the absmax / 7.5 grid, measured +17.4% held-out perplexity on the real SmolLM2 where this
measures +6.2%: bench/README.md, Learned rounding). Written here
rather than taken from auto-round: that package's loop owns the model, the data and the output, where qrc's plan
owns the stream, the memory and the writer; the arithmetic is the paper's (Cheng et al., 2023)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from compiler.backends.cpu_flags import native_bfloat16
from compiler.backends.torch import streams
from compiler.backends.torch.layers import Job
from compiler.diagnostics import Diagnostic, warning
from compiler.ir.types import Granularity, LearnedRounding, QType
from compiler.quant import qparams
from compiler.quant.weights import SIGNED_COARSE, SIGNED_FINE, QuantizedWeight
from compiler.source import Span


def _round_through(x: torch.Tensor) -> torch.Tensor:
    """Round to nearest, its gradient passed straight through (the identity)."""
    return x + (torch.round(x) - x).detach()


@dataclass
class _Learned:
    """One Linear's learned rounding: the float weight in groups, the group ranges, and the parameters."""

    job: Job
    module: nn.Linear
    weight: torch.Tensor  # float32 [out, groups, group]
    low: torch.Tensor  # each group's minimum (0 included), [out, groups, 1]
    high: torch.Tensor  # each group's maximum (0 included)
    offsets: torch.Tensor  # v, [out, groups, group]
    low_factor: torch.Tensor  # clipping of the minimum, [out, groups, 1]
    high_factor: torch.Tensor

    @classmethod
    def of(cls, job: Job, module: nn.Linear, importance: np.ndarray | None) -> _Learned:
        """`job`'s parameters at their start; `importance`: its inputs' column mean squares (None: not gathered,
        the factors start at 1)."""
        spec = job.scheme.quantized_weights
        out, columns = module.weight.shape
        group = spec.group if spec.granularity is Granularity.GROUP else columns
        weight = module.weight.detach().float().reshape(out, columns // group, group)
        low = weight.amin(dim=2, keepdim=True).clamp(max=0)
        high = weight.amax(dim=2, keepdim=True).clamp(min=0)
        start = torch.ones_like(low)
        if importance is not None and job.scheme.learned_start_searched:
            columns_weight = torch.from_numpy(np.asarray(importance, np.float32)).to(weight.device)
            start = searched_factors(weight, low, high, spec.qtype, columns_weight.view(1, columns // group, group))
        return cls(job, module, weight, low, high, torch.zeros_like(weight, requires_grad=True),
                   start.clone().requires_grad_(True), start.clone().requires_grad_(True))

    @property
    def parameters(self) -> tuple[torch.Tensor, ...]:
        """What the steps move."""
        return self.offsets, self.low_factor, self.high_factor

    def scale_zero(self, stored: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Each group's scale and zero point. Symmetric: the group's value of largest magnitude (its clipped
        minimum or maximum) on the range's negative end, -2^(b-1), so every level of the grid is used (a negative
        scale where that value is positive), as AutoRound and llama.cpp's Q4_0 scale and qrc's GPTQ search does;
        zero point 0. Asymmetric: compressed-tensors' `(max - min) / range` with the zero point rounded (through,
        while learning). `stored`: the dtype the scale is written in, which it is rounded to."""
        spec = self.job.scheme.quantized_weights
        qmin, qmax = qparams.full_range(spec.qtype)
        low, high = self.low * self.low_factor, self.high * self.high_factor
        if spec.symmetric:
            below, above = -low, high
            scale = torch.where(above < below, below, -above) / -qmin
        else:
            scale = (high - low) / (qmax - qmin)
        if stored is not None and stored != torch.float32:
            scale = scale.to(stored).float()
        tiny = torch.finfo(torch.float32).tiny
        scale = torch.where(scale < 0, scale.clamp(max=-tiny), scale.clamp(min=tiny))
        if spec.symmetric:
            return scale, torch.zeros_like(scale)
        return scale, _round_through(qmin - low / scale).clamp(qmin, qmax)

    def integers(self, stored: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The rounded integers (as float, rounded through) with their scale and zero point."""
        qmin, qmax = qparams.full_range(self.job.scheme.quantized_weights.qtype)
        scale, zero = self.scale_zero(stored)
        q = (_round_through(self.weight / scale + self.offsets) + zero).clamp(qmin, qmax)
        return q, scale, zero

    def dequantized(self) -> torch.Tensor:
        """The weight as the current parameters round it, [out, in]."""
        q, scale, zero = self.integers()
        return ((q - zero) * scale).reshape(self.module.weight.shape)

    def clamp_(self) -> None:
        """Keep the parameters in range after a step."""
        with torch.no_grad():
            self.offsets.clamp_(-0.5, 0.5)
            self.low_factor.clamp_(0.0, 1.0)
            self.high_factor.clamp_(0.0, 1.0)

    def rounded(self, stored: torch.dtype) -> QuantizedWeight:
        """The weight rounded with the kept parameters, its scale rounded to `stored` first: the layout
        weights.round_weight gives (groups: scale [out, groups] on axis 1; per channel: [out] on axis 0)."""
        spec = self.job.scheme.quantized_weights
        with torch.no_grad():
            q, scale, zero = self.integers(stored)
        out, columns = self.module.weight.shape
        q_np = q.reshape(out, columns).to(torch.int8).cpu().numpy()
        scale_np = scale.squeeze(2).cpu().numpy().astype(np.float32)
        zero_np = zero.squeeze(2).cpu().numpy().astype(np.int32)
        if spec.granularity is Granularity.GROUP:
            return QuantizedWeight(q_np, scale_np, zero_np, spec.qtype, 1, spec.group)
        return QuantizedWeight(q_np, scale_np[:, 0], zero_np[:, 0], spec.qtype, 0, None)


def searched_factors(weight: torch.Tensor, low: torch.Tensor, high: torch.Tensor, qtype: QType,
                     columns: torch.Tensor) -> torch.Tensor:
    """Each symmetric group's clipping factor (in (0, 1]) that the weighted signed search chooses: the group's
    largest magnitude put on -2^(b-1) divided by f, f from quant/weights.py's coarse steps then fine ones around
    each group's best, for the least Σ columns · (rounded − w)²; the factor is 1/f. The search's steps below 1
    (the largest magnitude short of the grid's end) are left out: the factors stay within [0, 1]. The same steps
    as quant/weights.py's numpy search, written here on the block's tensors and device because the learning needs
    factors of its own range, not stored scales. `weight`: [out, groups, group]; `columns`: each input column's
    weight, broadcasting over it."""
    qmin, qmax = qparams.full_range(qtype)
    extreme = torch.where(high > -low, high, low)
    extreme = torch.where(extreme != 0, extreme, torch.ones_like(extreme))  # a group of zeros: any scale
    best_error = torch.full_like(low, float("inf"))
    best = torch.ones_like(low)

    def attempt(divisor: torch.Tensor) -> None:
        nonlocal best_error, best
        scale = extreme / (qmin * divisor)
        error = (((weight / scale).round().clamp(qmin, qmax) * scale - weight).square() * columns).sum(2, keepdim=True)
        better = error < best_error
        best_error, best = torch.where(better, error, best_error), torch.where(better, divisor, best)

    coarse = [f for f in SIGNED_COARSE if f >= 1.0]
    for divisor in coarse:
        attempt(torch.full_like(low, divisor))
    first = best
    for step in SIGNED_FINE:
        attempt((first + step).clamp(1.0, coarse[-1]))
    return 1.0 / best


class _Rounded:
    """While it is entered, each learned Linear computes with its weight as the parameters round it."""

    def __init__(self, learned: list[_Learned]):
        self.learned = learned

    def __enter__(self) -> _Rounded:
        for item in self.learned:
            item.module.weight.requires_grad_(False)
            # on the instance, so the class's forward is untouched (mypy takes any assignment to a method for a
            # monkey-patch of the class)
            item.module.forward = _rounded_forward(item)  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc) -> None:
        for item in self.learned:
            del item.module.forward


def _rounded_forward(item: _Learned) -> Callable:
    def forward(x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, item.dequantized(), item.module.bias)
    return forward


def _rows(value, index: torch.Tensor, count: int):
    """`value` (a block's other inputs) cut to the sample rows `index` of a chunk of `count`: tensors of two or
    more axes whose first is the chunk's (a padding mask, per-sample positions); what broadcasts stays whole."""
    def cut(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.ndim >= 2 and tensor.shape[0] == count:
            return tensor.index_select(0, index.to(tensor.device))
        return tensor
    return streams.tensors_mapped(value, cut)


def _hidden_of(returned):
    """A block's hidden output (a decoder layer returns it alone or first in a tuple)."""
    return returned[0] if isinstance(returned, (tuple, list)) else returned


def step_precision(device) -> contextlib.AbstractContextManager:
    """The steps' matrix products in bfloat16 where the device multiplies it in hardware (a CPU with AVX-512 BF16 or
    AMX, a GPU that has it), as AutoRound's default `amp` does: on SmolLM2-135M's blocks (AMX, two cores) a step
    took 0.17 s against 0.33 in float32; the parameters, the rounding and the loss stay float32. Elsewhere
    (a CPU without them) bfloat16 products are emulated, slower than float32: the steps stay float32. The streams
    a learning block runs on (its float targets, the rounded stream to the next block) take the same precision,
    as AutoRound's do: 0.25 s a pass of 32 samples against about 0.8 s in float32."""
    kind = torch.device(device).type
    fast = torch.cuda.is_bf16_supported() if kind == "cuda" else kind == "cpu" and native_bfloat16()
    return torch.autocast(kind, dtype=torch.bfloat16) if fast else contextlib.nullcontext()


@dataclass
class LearningSteps:
    """How the run's steps run: through torch.compile where the plan chose it (compiled_steps.py: where the work pays
    for it; run_block's `compiled_steps`), else eager. A compiler that fails (a broken toolchain, no Triton on a GPU) leaves
    the rest of the run eager, said once (`failure`, Q451), never a stopped compile."""

    compiled: bool
    span: Span | None = None  # the first learned scheme's, where Q451 points
    failure: str | None = None
    steps: int = 0  # what the blocks have done so far: their steps, the steps' seconds, and per block its output
    seconds: float = 0.0  # error with the kept parameters over the start's (round to nearest), on the first step's
    # samples
    ratios: list[float] = field(default_factory=list)

    def runner(self, block: nn.Module) -> Callable:
        """What a step calls to run `block`."""
        return torch.compile(block) if self.compiled and self.failure is None else block

    def failed(self, exc: Exception) -> None:
        """The compiler failed: the steps run eager from here on."""
        self.failure = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__

    def record(self, steps: int, seconds: float, rtn: float, kept: float) -> None:
        """One block learned: `steps` in `seconds`; its output error against float with the start's parameters
        (`rtn`: round to nearest, with the searched scales where they were searched) and with the kept ones
        (`kept`), on the same samples."""
        self.steps += steps
        self.seconds += seconds
        self.ratios.append(kept / rtn if rtn > 0 else 1.0)

    def outcome(self) -> str | None:
        """What the learning cost and bought, in words (the summary's and the report's), once a block learned."""
        if not self.ratios:
            return None
        mean = sum(self.ratios) / len(self.ratios)
        how = "compiled" if self.compiled and self.failure is None else "uncompiled"
        return (f"{self.steps:,} sign-SGD steps ({how}) over {len(self.ratios)} blocks in {self.seconds:.1f} s; each "
                f"block's output error against float on the first step's samples: {100 * (1 - mean):.0f}% below "
                f"the start's (round to nearest) on average ({100 * (1 - max(self.ratios)):.0f}% to "
                f"{100 * (1 - min(self.ratios)):.0f}%)")

    def warning(self) -> Diagnostic | None:
        """Q451 where the compiler failed."""
        if self.failure is None:
            return None
        return warning("Q451", f"learned rounding's steps ran uncompiled (torch.compile failed: {self.failure})",
                       self.span, "slower than planned",
                       help="the rounding is the same, its steps take about twice the planned time; install a C++ "
                       "compiler (g++) for torch's inductor, or set TORCHDYNAMO_DISABLE=1 so the plan counts "
                       "uncompiled steps")


def learn_block(root: nn.Module, block: nn.Module, number: int, stream: streams.Stream, device, jobs: list[Job],
                targets: list[torch.Tensor], stored: torch.dtype, settings: LearnedRounding, steps: LearningSteps,
                importance: Callable[[Job], np.ndarray | None], seed: int = 0) -> dict[str, QuantizedWeight]:
    """Learn the rounding of `jobs` (Linears of block `number`, modules of `root`) on the calibration `stream` as
    it enters the block, against `targets` (the float block's outputs on each of its chunks, float32); each
    layer's rounded weight by name, its scale rounded to `stored`. `steps` says how the block runs; `importance`
    gives a job's inputs' column mean squares (None where none were gathered), which its start is searched with."""
    learned = [_Learned.of(job, _linear(root, job), importance(job)) for job in jobs]
    generator = torch.Generator().manual_seed(seed + number)
    sizes = [t.shape[0] for t in targets]
    parameters = [p for item in learned for p in item.parameters]
    best, best_loss = [p.detach().clone() for p in parameters], float("inf")
    frozen = [weight for weight in block.parameters() if weight.requires_grad]
    for weight in frozen:
        weight.requires_grad_(False)
    weights = torch.tensor(sizes, dtype=torch.float)  # a chunk drawn in proportion to its samples
    lower_precision = step_precision(device)
    runner = steps.runner(block)
    started, first, rtn_loss = time.perf_counter(), None, 0.0  # the first step: its samples, rtn's error on them
    try:
        with _Rounded(learned), torch.enable_grad():  # inside blockwise's heap_reused(): pages reused
            for step in range(settings.iters):
                chunk = int(torch.multinomial(weights, 1, generator=generator))
                count = sizes[chunk]
                rows = torch.randperm(count, generator=generator)[:settings.batch]
                try:
                    loss = _loss(runner, number, stream, device, chunk, rows, count, targets, lower_precision)
                except torch._dynamo.exc.TorchDynamoException as exc:
                    if runner is block:
                        raise
                    steps.failed(exc)
                    runner = block
                    loss = _loss(runner, number, stream, device, chunk, rows, count, targets, lower_precision)
                value = loss.item()
                if step == 0:  # the start's parameters (round to nearest)
                    first, rtn_loss = (chunk, rows, count), value
                if value < best_loss:  # the parameters this step ran with (the first: the start's), copied
                    best_loss = value  # into the same buffers each time (no fresh ones to fault in)
                    torch._foreach_copy_(best, [p.detach() for p in parameters])
                if step == settings.iters - 1:  # the last step's move would give parameters no step measures,
                    break  # and only measured ones are kept: its backward (two thirds of a step) is skipped
                loss.backward()
                rate = settings.rate * (1.0 - step / settings.iters)
                with torch.no_grad():
                    for p in parameters:
                        if p.grad is not None:  # None: no sample reached its layer (an MoE expert)
                            p.add_(p.grad.sign(), alpha=-rate)
                            p.grad = None
                for item in learned:
                    item.clamp_()
    finally:
        for weight in frozen:
            weight.requires_grad_(True)
    seconds = time.perf_counter() - started
    with torch.no_grad():
        for p, kept in zip(parameters, best, strict=True):
            p.copy_(kept)
        if first is not None:  # what the kept parameters bought: the first step's samples again (uncompiled: one
            with _Rounded(learned):  # forward, where compiling it would cost more)
                kept_loss = _loss(block, number, stream, device, *first, targets, lower_precision).item()
            steps.record(settings.iters, seconds, rtn_loss, kept_loss)
    return {item.job.layer.name: item.rounded(stored) for item in learned}


def _loss(runner: Callable, number: int, stream: streams.Stream, device, chunk: int, rows: torch.Tensor, count: int,
          targets: list[torch.Tensor], lower_precision) -> torch.Tensor:
    """The step's mean squared error of the block as rounded against its float targets, on `rows` of `chunk`."""
    with lower_precision:
        output = _output_of(runner, number, stream, device, chunk, rows, count)
    return nn.functional.mse_loss(output.float(), targets[chunk].index_select(0, rows.to(device)))


def _linear(root: nn.Module, job: Job) -> nn.Linear:
    """The Linear that computes `job` (the torch backend refuses other layers before any work: Q411)."""
    module = root.get_submodule(job.module)
    assert isinstance(module, nn.Linear)
    return module


def _output_of(block: Callable, number: int, stream: streams.Stream, device, chunk: int, rows: torch.Tensor,
               count: int) -> torch.Tensor:
    """The block as rounded on `rows` of chunk `chunk` of the stream: its hidden output."""
    args, kwargs = _rows(streams.on_device(stream.rest[chunk][number], device), rows, count)
    hidden = stream.hidden.get(chunk).index_select(0, rows).to(device, torch.float32)
    return _hidden_of(block(hidden, *args, **kwargs))
