"""What happens to each quantized Linear: statistics from forward hooks (a GPTQ Hessian and an activation
observer per distinct input, so q/k/v share one and gate/up another), then rounding, then the module
computes with its dequantized weight (and fake-quantized input) so later blocks see the quantized model."""

from __future__ import annotations

import weakref
from collections import Counter
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from torch import nn

from compiler.backends import BackendError
from compiler.backends.torch import float_formats
from compiler.backends.torch.experts import remove_hooks, set_routing
from compiler.backends.torch.float_formats import FloatQuantized
from compiler.backends.torch.fp4_gptq import gptq_fp4
from compiler.backends.torch.model import TorchModel
from compiler.backends.torch.quant_args import input_args, static_input
from compiler.diagnostics import error
from compiler.ir.types import ActivationMode, ActivationQuant, Calibration, Granularity, QType, Rounding, Scheme
from compiler.models.index import Layer
from compiler.quant import fused_rtn, qparams
from compiler.quant.gptq import gptq, gptq_on_grid
from compiler.quant.kquants import GgufBlocks, kquant_grid, quantize_kquant
from compiler.quant.observers import make_observer
from compiler.quant.weights import Convention, QuantizedWeight, round_weight
from compiler.resolve.assignment import Assignment
from compiler.source import Span

ROW_SLICE_BYTES = 4 << 20  # rtn/mse round a weight this many bytes of rows at a time
Rounded = QuantizedWeight | FloatQuantized | GgufBlocks  # a weight as one of the roundings leaves it


@dataclass(frozen=True)
class Job:
    """A layer to round: its module, index entry and scheme."""
    module: str  # the Linear's name in the torch module tree
    layer: Layer  # its entry in the model index (names as in the checkpoint)
    scheme: Scheme

    @property
    def tied(self) -> bool:
        """A head tied to the embedding: it reads another layer's tensor, which the output keeps as it is."""
        return self.layer.weight != self.layer.name + ".weight"

    @property
    def output_weight(self) -> str:
        """The name of its rounded weight in the output: the checkpoint's, or a tensor of its own for a tied head."""
        return self.layer.name + ".weight" if self.tied else self.layer.weight

    @property
    def gptq(self) -> bool:
        """Rounded with GPTQ."""
        return self.scheme.rounding is Rounding.GPTQ

    @property
    def static_input(self) -> bool:
        """Its inputs are quantized with a calibrated scale."""
        return static_input(self.scheme)

    @property
    def imatrix(self) -> bool:
        """Searched with its inputs' per-column mean squares (llama.cpp's importance matrix): a K-quant's own
        search, an integer scheme's clipping search (mse's)."""
        return self.scheme.rounding is Rounding.IMATRIX

    @property
    def importance_weighted(self) -> bool:
        """Its inputs' column mean squares are gathered: its grid is the imatrix search's (`rounding imatrix`, GPTQ
        onto a K-quant grid), or its learned rounding starts from that search (Scheme.learned_start_searched)."""
        return self.imatrix or (self.gptq and self.scheme.quantized_weights.qtype.is_kquant) or \
            self.scheme.learned_start_searched

    @property
    def learned(self) -> bool:
        """Its rounding is learned against its block's float outputs (`rounding autoround`: torch/learned.py)."""
        return self.scheme.learned is not None

    @property
    def gathers_statistics(self) -> bool:
        """Hooks gather statistics of its inputs for it (GPTQ's Hessian, an importance matrix, a static range)."""
        return self.gptq or self.importance_weighted or self.static_input

    @property
    def needs_data(self) -> bool:
        """It needs calibration data: statistics, or its block's outputs to learn its rounding against."""
        return self.gathers_statistics or self.learned

    def with_rtn(self) -> Job:
        """The same layer and scheme, rounded with rtn (what is left when GPTQ has no usable Hessian)."""
        return replace(self, scheme=replace(self.scheme, rounding=Rounding.RTN))


def finite_rows(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A layer input as rows of features in `dtype`, the rows with a NaN or infinity dropped (the statistics
    skip them)."""
    rows = x.detach().reshape(-1, x.shape[-1]).to(dtype)
    if bool(torch.isfinite(rows.sum())):  # every value finite (a NaN or infinity makes the sum one): one pass
        return rows  # and no copy (the element-wise test below costs 30 times the sum on SmolLM2's inputs)
    finite = torch.isfinite(rows).all(dim=1)  # or a finite sum overflowed: row by row
    return rows if bool(finite.all()) else rows[finite]


# XᵀX is symmetric: only its upper triangle is summed, in strips of this many rows (each strip one matrix
# product from its diagonal rightwards), then mirrored once when it is read. That is 0.58–0.62× the time of the
# whole product on the bench Llama's 1,024- and 2,816-wide inputs (one and two threads); the Hessian sum was
# about a fifth of a GPTQ compile's time. torch has no symmetric rank-k update (BLAS syrk) of its own.
GRAM_STRIP = 256


def add_upper_gram_(total: torch.Tensor, rows: torch.Tensor, alpha: float = 1.0) -> None:
    """total += alpha·rowsᵀ·rows on the upper triangle and the diagonal strips only (the rest of `total` is left
    as it is: mirror_upper_ fills it from the upper triangle)."""
    width = rows.shape[1]
    if width <= GRAM_STRIP:
        total.addmm_(rows.T, rows, alpha=alpha)
        return
    for start in range(0, width, GRAM_STRIP):
        stop = min(start + GRAM_STRIP, width)
        total[start:stop, start:].addmm_(rows[:, start:stop].T, rows[:, start:], alpha=alpha)


def mirror_upper_(total: torch.Tensor) -> torch.Tensor:
    """The lower triangle of `total` set from its upper one, in place, strip by strip (no K×K temporary);
    returns `total`, now exactly symmetric."""
    width = total.shape[0]
    for start in range(0, width, GRAM_STRIP):
        stop = min(start + GRAM_STRIP, width)
        total[stop:, start:stop] = total[start:stop, stop:].T
        diagonal = total[start:stop, start:stop]
        diagonal.copy_(torch.triu(diagonal) + torch.triu(diagonal, 1).T)
    return total


@dataclass
class Hessian:
    """Σ 2·xᵀx over finite input rows (float32, on the layer's device), and the row count. Only the upper
    triangle is summed (add_upper_gram_); mean() returns the whole symmetric matrix."""

    sum: torch.Tensor
    rows: int = 0

    def update(self, x: torch.Tensor) -> None:
        """Add a batch of inputs to the running XᵀX."""
        rows = finite_rows(x, torch.float32)
        add_upper_gram_(self.sum, rows, alpha=2.0)
        self.rows += rows.shape[0]

    def mean(self, in_place: bool = False) -> np.ndarray:
        """XᵀX divided by the number of rows seen (float32; the ranks' merged sum is float64). `in_place`: the
        sum itself becomes the mean (for its last reader: no K×K copy)."""
        rows = max(self.rows, 1)
        return mirror_upper_(self.sum.div_(rows) if in_place else self.sum / rows).float().cpu().numpy()


@dataclass
class Squares:
    """Σ x² of each input column over finite input rows (float64), and the row count: llama.cpp's imatrix."""

    sum: torch.Tensor
    rows: int = 0

    def update(self, x: torch.Tensor) -> None:
        """Add a batch of inputs."""
        rows = finite_rows(x, torch.float32)  # squared in float32, summed in float64: no float64 copy of the
        self.sum += rows.square().sum(dim=0, dtype=torch.float64)  # input (a third of the time on SmolLM2)
        self.rows += rows.shape[0]

    def mean(self) -> np.ndarray:
        """Each column's mean square (float32)."""
        return (self.sum / max(self.rows, 1)).float().cpu().numpy()


@dataclass
class Statistics:
    """Forward pre-hooks on the Linears of `jobs` that need data. Layers reading the same live tensor
    object in one forward pass share one leader, whose Hessian and observer stand for all of them."""

    root: nn.Module
    jobs: list[Job]
    calibration: Calibration | None  # None only where no job needs data (nothing is hooked)
    leader: dict[str, str] = field(default_factory=dict)
    hessians: dict[str, Hessian] = field(default_factory=dict)
    observers: dict[str, object] = field(default_factory=dict)
    squares: dict[str, Squares] = field(default_factory=dict)  # leader → its inputs' column mean squares (imatrix)
    _seen: dict[int, tuple[weakref.ref, str, set]] = field(default_factory=dict)
    _handles: list = field(default_factory=list)
    _remaining: Counter = field(default_factory=Counter)  # leader → layers sharing its Hessian not yet rounded
    _counted: bool = False
    shared: bool = False  # merged over torchrun's ranks (torch/sharing.py): merged once, whoever rounds first
    # under torchrun, the Hessians still holding this rank's partial sum: leader → (shape, rows over every rank)
    pending: dict[str, tuple[tuple[int, ...], int]] = field(default_factory=dict)

    def __enter__(self) -> Statistics:
        for job in self.jobs:
            if job.gathers_statistics:
                module = self.root.get_submodule(job.module)
                self._handles.append(module.register_forward_pre_hook(self._hook(job)))
        if self._handles:  # MoE experts: every token through every expert, for statistics (`experts all`)
            assert self.calibration is not None, "a job needs data: its op carries the calibration settings"
            set_routing(self.root, self.calibration.experts)
        return self

    def __exit__(self, *exc) -> None:
        remove_hooks(self.root, self._handles)
        self._seen.clear()

    def saw(self, job: Job) -> bool:
        """Whether any calibration input reached `job`'s layer (an MoE expert the router never chose with
        `experts routed` sees none)."""
        return job.module in self.leader

    def new_forward(self) -> None:
        """Call before each forward: inputs are matched by identity within one pass, through weak
        references (holding the inputs would keep every layer's input of a whole-model pass alive)."""
        self._seen.clear()

    def _hook(self, job: Job):
        def hook(module, args):
            x = args[0]
            entry = self._seen.get(id(x))
            if entry is None or entry[0]() is not x:  # a new tensor (a dead one's id may be reused)
                entry = self._seen[id(x)] = (weakref.ref(x), job.module, set())
            _, leader, done = entry
            if getattr(module, "unrouted_rows_zero", False):  # an expert's routed tokens alone (none: unseen, Q248;
                # checkpoint_names.py marks the Linears of experts that see every token, unrouted ones as zeros)
                x = x.reshape(-1, x.shape[-1])
                x = x[x.ne(0).any(dim=-1)]
                if x.shape[0] == 0:
                    return
            self.leader[job.module] = leader
            if job.gptq and "hessian" not in done:
                done.add("hessian")
                k = x.shape[-1]
                h = self.hessians.setdefault(leader, Hessian(torch.zeros(k, k, dtype=torch.float32, device=x.device)))
                h.update(x)
            if job.importance_weighted and "squares" not in done:
                done.add("squares")
                k = x.shape[-1]
                self.squares.setdefault(leader, Squares(torch.zeros(k, dtype=torch.float64, device=x.device))).update(x)
            if job.static_input and "observer" not in done:
                done.add("observer")
                histogram = self.calibration.method.histogram
                observer = self.observers.setdefault(leader, make_observer(histogram, self.calibration.bins, compiled=True))
                observer.update(x.detach().float().cpu().numpy())
        return hook

    def hessian(self, job: Job) -> np.ndarray:
        """The Hessian estimate of `job`'s input (shared by layers reading the same tensor). The last layer to
        round with it takes the sum itself, divided in place: GPTQ factorises its Hessian in place, so the widest
        layer (a down_proj, alone on its input) rounds with one K×K matrix fewer than a copy would need."""
        leader = self.leader[job.module]
        if self._users_left()[leader] == 1:
            return self.hessians.pop(leader).mean(in_place=True)
        return self.hessians[leader].mean()

    def hessians_of(self, jobs: list[Job]) -> list[np.ndarray]:
        """hessian() of each of `jobs`, taken once per shared input: jobs reading the same tensor get the same
        array (gptq_batched factorises it once for all of them)."""
        by_leader: dict[str, np.ndarray] = {}
        for job in jobs:
            leader = self.leader[job.module]
            if leader not in by_leader:
                by_leader[leader] = self.hessian(job)
        return [by_leader[self.leader[job.module]] for job in jobs]

    def _users_left(self) -> Counter:
        """leader → the GPTQ layers reading its input not yet rounded."""
        if not self._counted:
            self._remaining.update(self.leader.get(j.module) for j in self.jobs if j.gptq)
            self._counted = True
        return self._remaining

    def release(self, job: Job) -> None:
        """`job` is rounded: free its Hessian once every layer sharing it (q/k/v share one) is, so the
        Hessians alive are those of the layers still to round."""
        remaining = self._users_left()
        leader = self.leader.get(job.module)
        if leader is None or leader not in remaining:
            return
        remaining[leader] -= 1
        if remaining[leader] <= 0:
            self.hessians.pop(leader, None)  # the last layer took it already (hessian): nothing left to pop
            del remaining[leader]

    def importance(self, job: Job) -> np.ndarray:
        """The mean square of each input column of `job` (shared by layers reading the same tensor)."""
        return self.squares[self.leader[job.module]].mean()

    def observer(self, job: Job):
        """The input observer of `job` (shared by layers reading the same tensor)."""
        return self.observers.get(self.leader.get(job.module, job.module))


def quantize_job(job: Job, weight: torch.Tensor, stats: Statistics | None, scale_dtype: torch.dtype,
                 dampened=None, shared: float_formats.SharedGlobal | None = None, measure: bool = False) -> Rounded:
    """Round one Linear weight [out, in] with its scheme's rounding, in the torch convention. GPTQ tells
    `dampened` the dampening it had to raise to; a Hessian no dampening makes definite (SingularHessian)
    propagates to the caller, which rounds with rtn. `shared`: NVFP4 siblings' common range (and exact cast).
    `measure`: rtn/mse and the floating formats also take the sums of the weight's SQNR."""
    spec = job.scheme.quantized_weights
    if spec.qtype.is_float and job.gptq:  # onto the FP4 grid round to nearest's scales give (fp4_gptq.py)
        assert stats is not None, "GPTQ rounds with its layer's statistics"
        return gptq_fp4(weight, job.scheme, stats.hessian(job), scale_dtype, shared, str(weight.device), dampened)
    if spec.qtype.is_float:  # rounded and stored by compressed-tensors (float_formats.py)
        importance = stats.importance(job) if job.imatrix and stats is not None and stats.saw(job) else None
        return float_formats.quantize_scheme(weight, job.scheme, scale_dtype, shared, measure, importance=importance)
    np_dtype = str(scale_dtype).removeprefix("torch.")
    if job.imatrix and not spec.qtype.is_kquant:  # mse's search, each column's error weighted by its inputs
        importance = stats.importance(job) if stats is not None and stats.saw(job) else None
        return round_weight(weight.detach().cpu(), spec, Rounding.MSE, 0, 1, Convention.TORCH, np_dtype,
                            slice_bytes=ROW_SLICE_BYTES, measure=measure, float32=_into_float32, importance=importance)
    if not job.gptq and not spec.qtype.is_kquant:
        # rows (output channels) are independent: rounded in slices on every core, from the float's bits
        # where the fused kernel applies, else each slice made float32 there (a bfloat16 weight is not copied
        # whole first), the scratch a slice's
        bits = float_formats.float_bits(weight.detach().cpu())
        if bits is not None and fused_rtn.applies(spec, job.scheme.rounding, np_dtype):
            return fused_rtn.round_bits(bits, spec, np_dtype, measure, job.scheme.rounding)
        return round_weight(weight.detach().cpu(), spec, job.scheme.rounding, 0, 1, Convention.TORCH, np_dtype,
                            slice_bytes=ROW_SLICE_BYTES, measure=measure, float32=_into_float32)
    w = weight.detach().float().cpu().numpy()
    if spec.qtype.is_kquant and job.gptq:
        assert stats is not None, "GPTQ rounds with its layer's statistics"
        return _gptq_kquant(job, w, stats.importance(job), stats.hessian(job), str(weight.device), dampened)
    if spec.qtype.is_kquant:  # GGUF's own blocks, searched as llama.cpp does (its scales float16 by format)
        assert stats is not None or not job.imatrix, "the imatrix search rounds with its layer's statistics"
        return quantize_kquant(w, spec.qtype, stats.importance(job) if job.imatrix and stats is not None else None)
    assert stats is not None, "GPTQ rounds with its layer's statistics"
    return gptq(w, stats.hessian(job), spec, job.scheme.act_order, Convention.TORCH, np_dtype, str(weight.device),
                dampened, job.scheme.static_groups, job.scheme.mse_scales)


def _into_float32(part: torch.Tensor, scratch: np.ndarray) -> np.ndarray:
    """A slice of a weight (any float dtype) as float32 in `scratch`, round_weight's reused per-core array."""
    torch.from_numpy(scratch).view(part.shape).copy_(part)
    return scratch.reshape(part.shape)


def _gptq_kquant(job: Job, w: np.ndarray, importance: np.ndarray, hessian: np.ndarray, device: str,
                 dampened) -> GgufBlocks:
    """A K-quant rounded by GPTQ: the grid (super-block and sub-block scales, mins) is the one `rounding imatrix`
    writes, llama.cpp's search of the float weight weighted by each input's mean square (`importance`), then
    GPTQ rounds the columns onto that grid, each error spread over the columns not yet rounded. A sub-block
    whose step is 0 keeps the search's integers (its values are −offset either way)."""
    qtype = job.scheme.quantized_weights.qtype
    grid, searched = kquant_grid(w, qtype, importance)
    steps = np.where(grid.step != 0, grid.step, np.float32(1e-30))  # a zero step rounds every value to −offset
    rounded = gptq_on_grid(w, hessian, grid.per_row(steps), grid.per_row(grid.offset), grid.lo, grid.hi,
                           job.scheme.act_order, device, dampened)
    return grid.blocks(grid.levels(rounded, searched))


def input_qparams(job: Job, stats: Statistics | None, calibration: Calibration | None, scale_dtype: torch.dtype):
    """(scale, zero point) of a static input, or None: dynamic, none, or never finite (left in float)."""
    if not job.static_input or stats is None:
        return None
    assert calibration is not None, "statistics come from an op that carries the calibration settings"
    observer = stats.observer(job)
    act = job.scheme.activations
    assert act is not None  # a static input is an activation spec
    bounds = calibration.method.range(observer, act.qtype, act.symmetric) if observer is not None else None
    if bounds is None:
        return None
    if act.qtype is QType.NVFP4:  # the global scale; the block scales are computed at run time
        return float_formats.nvfp4_input_global_scale(bounds[0], bounds[1]), 0
    if act.qtype.is_float:
        return float_formats.fp8_input_scale(bounds[0], bounds[1], scale_dtype), 0
    scale, zp = qparams.torch_scale_zero_point(np.array([bounds[0]]), np.array([bounds[1]]), act.qtype, act.symmetric,
                                               str(scale_dtype).removeprefix("torch."))
    return float(scale[0]), int(zp[0])


def apply_quantized(module: nn.Linear, q: Rounded, job: Job, act: tuple[float, int] | None):
    """The module now computes like the emitted model: dequantized weight, fake-quantized input.
    Returns the hook handle of the input quantizer (None without one)."""
    # what compressed-tensors' decompressor computes from the stored tensors: (q - zp) · scale
    dequantized = torch.from_numpy(q.dequantize()).to(module.weight.device, module.weight.dtype)
    module._parameters["weight"] = nn.Parameter(dequantized, requires_grad=False)
    scheme = job.scheme.activations
    if scheme is None or (scheme.calibrated and act is None):
        return None
    if scheme.qtype.fixed_group:  # NVFP4, MXFP4 inputs
        global_scale = act[0] if act is not None else None
        return module.register_forward_pre_hook(float_formats.fp4_input_hook(input_args(scheme), global_scale))
    if scheme.qtype.is_float:
        return module.register_forward_pre_hook(_fp8_input(scheme, act))
    lo, hi = qparams.qrange(scheme.qtype, False)
    if scheme.mode is ActivationMode.STATIC:
        assert act is not None
        scale, zp = act

        # ((round(x / scale) + zp).clamp(lo, hi) - zp) · scale, each step in place on one copy of the input: the
        # same values, one input-sized temporary instead of four (a chunk's down_proj input is the largest tensor
        # of a block's forward; the plan counts the one copy)
        def static(_, args):
            y = args[0] / scale
            return (y.round_().add_(zp).clamp_(lo, hi).sub_(zp).mul_(scale),) + tuple(args[1:])
        return module.register_forward_pre_hook(static)

    return module.register_forward_pre_hook(lambda _, args: (dynamic_integer(args[0], scheme),) + tuple(args[1:]))


def dynamic_integer(x: torch.Tensor, act: ActivationQuant) -> torch.Tensor:
    """Integer inputs rounded at run time as compressed-tensors' dynamic symmetric scheme does: absmax / (range / 2)
    per token (or per tensor), round, clamp; each step in place on one copy of x, as the static hook does."""
    lo, hi = qparams.qrange(act.qtype, False)
    absmax = x.abs().amax(dim=-1, keepdim=True) if act.granularity is Granularity.PER_TOKEN else x.abs().amax()
    scale = (absmax / ((hi - lo) / 2)).clamp_min(torch.finfo(torch.float32).tiny)
    return (x / scale).round_().clamp_(lo, hi).mul_(scale)


def _fp8_input(scheme, act: tuple[float, int] | None):
    """The forward pre-hook of FP8 inputs: a static scale from calibration, or dynamic ones per token/group."""
    if scheme.mode is ActivationMode.STATIC:
        assert act is not None  # a static input without a range stays float (apply_quantized)
        scale = torch.tensor(act[0])
        return lambda _, args: (float_formats.fake_fp8(args[0], scale),) + tuple(args[1:])
    return lambda _, args: (float_formats.dynamic_fp8(args[0], scheme),) + tuple(args[1:])


def jobs_of(model: TorchModel, assignment: Assignment) -> list[Job]:
    """A job for each layer the assignment quantizes, on the module that computes it."""
    return [Job(model.module_computing(a.layer.weight), a.layer, a.scheme) for a in assignment.layers
            if not a.scheme.is_none]


def refuse_non_linear(model: TorchModel, jobs: list[Job], span: Span | None, assignment: Assignment | None = None) -> None:
    """Q411 before any work for a layer whose module is not an nn.Linear once the model runs (transformers
    5's MoE routers keep their weight in a router module of their own), pointing at the rule that chose it."""
    rules = {a.layer.name: a.rule for a in assignment.layers} if assignment is not None else {}
    for job in jobs:
        module = model.module.get_submodule(job.module)
        if not isinstance(module, torch.nn.Linear):
            rule = rules.get(job.layer.name)
            where = (rule.scheme_span if rule is not None else None) or job.scheme.span or span
            raise BackendError(error(
                "Q411", f"`{job.layer.name}` is computed by a `{type(module).__name__}`, not an nn.Linear: the torch "
                "backend rounds Linear layers when it runs the model", where, "not a Linear here",
                help=f'give it `-> none` (e.g. `"{job.layer.name}" -> none`; MoE routers stay float in serving), or '
                "round it data-free without `verify` (file to file)"))
