"""GPTQ weight rounding (llm-compressor / AutoGPTQ's procedure; docs/recipe-language.md, `rounding gptq`), in float32 numpy.

`H = (2/n)·Σ xᵀx` over the layer's input rows is accumulated by a streaming HessianObserver (mergeable:
sums). Quantizing: dead columns (diag(H) = 0) zeroed; optional act-order (argsort diag(H), descending);
`H += 0.01·mean(diag(H))·I`; the upper Cholesky factor of H⁻¹; columns in blocks of 128: quantize a
column, spread its error `(w - q)/Hinv[i,i]` over the rest of the block, then the block's errors over
the remaining columns. Scales come from the same conventions as RTN (per channel or per group), from the
min/max range or (`mse_scales`, the recipe's default) from a search of its shrink factor weighted by diag H."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from compiler.ir.types import Granularity, Rounding, WeightQuant
from compiler.quant import qparams
from compiler.quant.weights import Convention, QuantizedWeight, quantize_weight, round_weight

DAMPENING = 0.01  # of the mean Hessian diagonal, added to the diagonal (llm-compressor's default)
MAX_DAMPENING = 10.0  # raised tenfold while the Cholesky factorisation fails, up to this
BLOCK = 128
# Inside a block, a column's error is spread one column at a time only over the rest of its sub-block; the
# rest of the block takes a sub-block's errors at once, as one matrix product. The same updates summed in
# another order, at a quarter of the per-column work (the rank-1 updates were most of GPTQ's time on the CPU).
SUB_BLOCK = 32


class SingularHessian(ValueError):
    """H stays indefinite even at MAX_DAMPENING (inputs that are NaN-free but degenerate): round with rtn."""


@dataclass
class HessianObserver:
    """2·Σ xᵀx and the row count, for inputs whose last axis has `features` values."""

    features: int
    sum: np.ndarray = field(init=False)
    rows: int = 0

    def __post_init__(self) -> None:
        self.sum = np.zeros((self.features, self.features), np.float64)

    def update(self, x: np.ndarray) -> None:
        """Add a batch of inputs to the running XᵀX."""
        rows = np.asarray(x, np.float64).reshape(-1, self.features)
        rows = rows[np.isfinite(rows).all(axis=1)]
        self.sum += 2.0 * rows.T @ rows
        self.rows += rows.shape[0]

    def merge(self, other: HessianObserver) -> None:
        """Add another observer's sums (exactly mergeable)."""
        self.sum += other.sum
        self.rows += other.rows

    def hessian(self) -> np.ndarray:
        """The mean XᵀX, float32."""
        return (self.sum / max(self.rows, 1)).astype(np.float32)


def gptq(w: np.ndarray, hessian: np.ndarray, spec: WeightQuant, act_order: bool = False,
         convention: Convention = Convention.ORT, scale_dtype=np.float32, device: str = "cpu",
         dampened: Callable[[float], None] | None = None, static_groups: bool = False,
         mse_scales: bool = False) -> QuantizedWeight:
    """Quantize `w` laid out [out, in] (torch Linear) with GPTQ. Returns a QuantizedWeight in that layout
    (channel axis 0, groups along axis 1). The column loop runs in float32 torch on `device` (a GPU
    when the layer lives on one); the scales come from numpy (quantize_weight).

    `hessian` is consumed: on the CPU its float32 array is factorised in place, so at most two K×K
    matrices exist at once (the caller's array counts as one). When the factorisation fails, dampening is
    raised tenfold (up to MAX_DAMPENING) and `dampened` is told the fraction that worked; SingularHessian
    when none does.

    Group scales (groups only, without act-order) are taken when the loop reaches a group's first column,
    from the columns as the earlier errors left them (the reference GPTQ); with `static_groups` (and with
    act-order) every group's scale comes from the float weight before any column is rounded (AutoGPTQ's
    `static_groups`). Each scale is the min/max range's, or with `mse_scales` the shrink of that range with
    the least squared error over its values, each weighted by its input's mean square (diag H), searched
    over `rounding mse`'s factors; taken at the same moment."""
    w = np.array(w, np.float32)
    factor = _Factor.of(w, hessian, act_order, device)
    del hessian  # this frame's reference: the factor's `h` shared the caller's array on the CPU
    # how the scales are chosen (the rounding is GPTQ's): the min/max range, or the shrink of it with the least
    # squared error, each column's error weighted by its input's mean square (diag H): clipping a group costs what
    # its inputs make of it, as the output error GPTQ minimises does
    rule = _ScaleRule(convention, scale_dtype, factor.diagonal if mse_scales else None)
    params = _Params(rule.quantize(w, spec), spec)  # from the float weight
    hinv = factor.inverse(dampened)
    updated = not static_groups and not act_order and spec.granularity is Granularity.GROUP
    table = _ScaleTable.of(params, device)
    regroup = (lambda group, cols: _recompute_group(params, rule, group, cols, table)) if updated else None
    owner = [w]
    del w  # the loop's copy is the only one left (act-order permutes it into a copy of its own)
    return _requantize(factor.rounded(owner, hinv, table, regroup), params)


def gptq_on_grid(w: np.ndarray, hessian: np.ndarray, scale: np.ndarray, offset: np.ndarray, lo: int, hi: int,
                 act_order: bool = False, device: str = "cpu",
                 dampened: Callable[[float], None] | None = None) -> np.ndarray:
    """GPTQ's rounding of `w` [out, in] onto a grid fixed before any column is rounded: the weights of row r in
    group g (groups of in / scale.shape[1] columns) round to scale[r, g]·level − offset[r, g], level in lo..hi
    (GGUF's K-quants, their grid searched on the float weight as llama.cpp does; every scale positive).
    Returns the rounded values (float32 [out, in]); `hessian` is consumed as in gptq()."""
    import torch

    w = np.array(w, np.float32)
    factor = _Factor.of(w, hessian, act_order, device)
    del hessian
    hinv = factor.inverse(dampened)
    steps, offsets = (torch.from_numpy(np.asarray(t, np.float32)).to(device) for t in (scale, offset))
    table = _ScaleTable(steps, offsets, w.shape[1] // scale.shape[1], lo, hi, offset=True)
    owner = [w]
    del w
    return factor.rounded(owner, hinv, table, None)


def gptq_on_fp4_grid(w: np.ndarray, hessian: np.ndarray, steps: np.ndarray, act_order: bool = False,
                     device: str = "cpu", dampened: Callable[[float], None] | None = None) -> np.ndarray:
    """GPTQ's rounding of `w` [out, in] onto an FP4 grid fixed before any column is rounded: the weights of row
    r in block b (blocks of in / steps.shape[1] columns) round to steps[r, b]·v, v an e2m1 value (±0 … ±6, ties
    as compressed-tensors breaks them); NVFP4's and MXFP4's block scales taken from the float weight. Returns
    the rounded values (float32 [out, in]); `hessian` is consumed as in gptq()."""
    import torch

    w = np.array(w, np.float32)
    factor = _Factor.of(w, hessian, act_order, device)
    del hessian
    hinv = factor.inverse(dampened)
    step = torch.from_numpy(np.asarray(steps, np.float32)).to(device)
    grid = torch.tensor(qparams.FP4_GRID, dtype=torch.float32, device=device)  # built once, not per column
    table = _ScaleTable(step, torch.zeros_like(step), w.shape[1] // steps.shape[1], 0, 0, fp4_grid=grid)
    owner = [w]
    del w
    return factor.rounded(owner, hinv, table, None)


@dataclass
class _Factor:
    """A Hessian made ready for GPTQ's loop: its dead inputs (diagonal 0) set to 1 (their weight columns are
    zeroed), its columns permuted by decreasing diagonal with act-order."""
    h: Any  # torch.Tensor, dropped once factorised
    diagonal: np.ndarray
    order: np.ndarray | None
    device: str

    @staticmethod
    def of(w: np.ndarray, hessian: np.ndarray, act_order: bool, device: str) -> _Factor:
        """`w`'s dead columns are zeroed in place."""
        import torch

        h = _as_tensor(hessian, device)
        diagonal = torch.diagonal(h).cpu().numpy().copy()
        dead = diagonal == 0
        h.diagonal()[torch.from_numpy(dead).to(device)] = 1.0
        w[:, dead] = 0.0
        order = np.argsort(-diagonal, kind="stable") if act_order else None
        if order is not None:
            index = torch.from_numpy(order).to(device)
            h = h.index_select(0, index).index_select(1, index)
        return _Factor(h, diagonal, order, device)

    def inverse(self, dampened: Callable[[float], None] | None):
        """The upper Cholesky factor of H⁻¹ (H is released: the factor held its only reference); `dampened` is
        told a dampening raised above DAMPENING."""
        owner = [self.h]
        self.h = None
        hinv, used = _upper_inverse_factor(owner)
        if used != DAMPENING and dampened is not None:
            dampened(used)
        return hinv

    def rounded(self, owner: list[np.ndarray], hinv, table: _ScaleTable, regroup) -> np.ndarray:
        """The weight `owner` holds (its only reference, taken) rounded column by column onto `table` (in
        act-order, then put back), float32 values [out, in]. Without act-order the loop updates it in place."""
        import torch

        w = owner.pop()
        columns = w if self.order is None else w[:, self.order]
        del w
        q = _columns(torch.from_numpy(columns).to(self.device), hinv, table, self.order, regroup)
        del columns
        if self.order is None:
            return q
        restored = np.empty_like(q)
        restored[:, self.order] = q
        return restored


def _as_tensor(hessian: np.ndarray, device: str):
    """The Hessian as a float32 tensor: the caller's array itself on the CPU (no copy)."""
    import torch

    array = np.asarray(hessian, np.float32)
    if device == "cpu" and array.flags.writeable and array.flags.c_contiguous:
        return torch.from_numpy(array)
    return torch.tensor(array, device=device)


def _upper_inverse_factor(owner: list) -> tuple:
    """The upper Cholesky factor of H⁻¹, in float32, and the dampening that made H definite: a batch of one
    (_upper_inverse_factors). `owner` holds the only reference to H, so each step frees the previous matrix:
    two K×K matrices at most.

    With J the exchange matrix (rows reversed), J·H·J = L'·L'ᵀ gives H⁻¹ = (J·L'⁻ᵀ·J)(J·L'⁻¹·J), and J·L'⁻¹·J is
    upper triangular: H⁻¹'s upper factor is the reversed inverse of the reversed H's lower factor. One
    factorisation and one triangular inverse, where H⁻¹ formed whole and factorised again took two
    factorisations and a full inverse (1.7 times the time on K = 1024; the same factor to 2e-7)."""
    batch = [owner.pop()[None]]
    upper, used = _upper_inverse_factors(batch)
    if not math.isfinite(used[0]):
        raise SingularHessian(f"the Hessian stays indefinite at dampening {MAX_DAMPENING:g}, or its inverse is "
                              "not finite")
    return upper[0], used[0]


def _upper_inverse_factors(owner: list) -> tuple:
    """The upper Cholesky factors of H⁻¹ of a batch of Hessians [n, K, K] (`owner` holds the only reference,
    taken: two batches of K×K matrices at most), each dampened on its own (DAMPENING of its mean diagonal,
    raised tenfold where its factorisation fails, up to MAX_DAMPENING): the factors, and per Hessian the
    dampening used (inf where none made it definite or its inverse is not finite). _upper_inverse_factor says
    how the factor is taken."""
    import torch

    h = owner.pop()
    means = [float(torch.diagonal(one).mean()) for one in h]  # each as _upper_inverse_factor takes it
    used = [DAMPENING] * h.shape[0]
    torch.diagonal(h, dim1=1, dim2=2).add_(torch.tensor([DAMPENING * m for m in means], device=h.device)[:, None])
    flipped = h.flip(1, 2)
    del h
    lower, info = torch.linalg.cholesky_ex(flipped)
    failed = [i for i in range(flipped.shape[0]) if int(info[i]) != 0]
    while failed and used[failed[0]] < MAX_DAMPENING:
        for i in failed:
            flipped[i].diagonal().add_(9 * used[i] * means[i])  # from `used` to ten times it
            used[i] *= 10
        index = torch.tensor(failed, device=flipped.device)
        retried, again = torch.linalg.cholesky_ex(flipped[index])
        lower[index] = retried
        failed = [i for n, i in enumerate(failed) if int(again[n]) != 0]
    for i in failed:
        used[i] = math.inf
        lower[i] = torch.eye(flipped.shape[1], device=flipped.device)  # a placeholder the caller drops
    factor = [lower]
    del lower
    upper = _reversed_inverse(factor, flipped)
    finite = torch.isfinite(upper).flatten(1).all(dim=1).tolist()
    used = [u if ok else math.inf for u, ok in zip(used, finite, strict=True)]
    return upper, used


def _reversed_inverse(owner: list, scratch):
    """J·L⁻¹·J of the lower-triangular factors L ([..., K, K]) `owner` holds (its only reference, taken),
    solved into `scratch` (of their shape, whose values are not needed any more): the upper factor of H⁻¹
    where L factorises the reversed H. Two K×K matrices at a time."""
    import torch

    lower = owner.pop()
    scratch.zero_()
    torch.diagonal(scratch, dim1=-2, dim2=-1).fill_(1.0)
    torch.linalg.solve_triangular(lower, scratch, upper=False, out=scratch)
    del lower
    return scratch.flip(-2, -1)


@dataclass(frozen=True)
class _ScaleRule:
    """How GPTQ's scales are taken, from the float weight and (`updated_groups`) again per group as the loop
    reaches it: the convention they follow, and without `importance` the min/max range, with it the range's
    shrink with the least squared error, each input column's error weighted by its entry."""

    convention: Convention
    scale_dtype: object
    importance: np.ndarray | None

    def quantize(self, w: np.ndarray, spec: WeightQuant, first_column: int = 0) -> QuantizedWeight:
        """`w`'s scales (with the rtn integers), `w` being the columns from `first_column` on of a [out, in] weight."""
        if self.importance is None:
            return quantize_weight(w, spec, Rounding.RTN, 0, 1, self.convention, self.scale_dtype)
        importance = self.importance[first_column:first_column + w.shape[1]]
        # the search's roundings dominate: slices of output channels on every core
        return round_weight(w, spec, Rounding.MSE, 0, 1, self.convention, self.scale_dtype, importance=importance)


def _columns(w, hinv, table: _ScaleTable, order: np.ndarray | None,
             regroup: Callable[[int, np.ndarray], None] | None = None) -> np.ndarray:
    """Quantize column by column; each column's error is spread over the rest of its block of 128,
    then the block's errors over the remaining columns. With `regroup`, each group's scale and zero point
    are recomputed from its columns as they stand when the loop reaches the group's first column. Scales
    are looked up per (channel, group), never expanded to the weight's shape."""
    import torch

    q = torch.zeros_like(w)
    size = table.group_size or 0
    step = _sub_block(size)
    for start in range(0, w.shape[1], BLOCK):
        end = min(start + BLOCK, w.shape[1])
        block = w[:, start:end].clone()  # a contiguous working copy of the block's columns
        local = hinv[start:end, start:end]
        errors = torch.zeros_like(block)
        for first in range(0, end - start, step):
            stop = min(first + step, end - start)
            for j in range(first, stop):
                if regroup is not None and (start + j) % size == 0:
                    regroup((start + j) // size, _group_columns(block, w, start, j, size))
                column = block[:, j]
                quantized = table.rounded(column, start + j if order is None else int(order[start + j]))
                q[:, start + j] = quantized
                err = (column - quantized) / local[j, j]
                # a product, then a difference (not addr_, whose fused multiply-add a batch of experts cannot
                # take): gptq_batched's two roundings per value, so a batch rounds exactly as one layer alone
                block[:, j + 1:stop] -= err[:, None] * local[j, j + 1:stop]
                errors[:, j] = err
            block[:, stop:] -= errors[:, first:stop] @ local[first:stop, stop:]
        w[:, end:] -= errors @ hinv[start:end, end:]
    return q.cpu().numpy()


def _sub_block(group_size: int) -> int:
    """The sub-block width: SUB_BLOCK where every group starts a sub-block or lies inside one (so a group's
    columns carry every earlier update when `updated_groups` takes its scales), else the whole block."""
    fits = group_size == 0 or group_size % SUB_BLOCK == 0 or SUB_BLOCK % group_size == 0
    return SUB_BLOCK if fits else BLOCK


@dataclass
class _ScaleTable:
    """Scales and zero points per (channel, group) as float32 tensors (a zero scale becomes 1: its column
    quantizes to the zero point either way), and the integer range; `rounded(column, index)` gives one
    original column rounded onto its grid. With `offset`, the zero points are offsets subtracted from the
    scaled integers instead (GGUF's K-quants: value = scale·level − offset)."""

    scale: Any  # torch.Tensor [out, groups] (per channel: [out, 1]; per tensor: [out, 1] filled)
    zero_point: Any
    group_size: int | None
    lo: int
    hi: int
    offset: bool = False
    fp4_grid: Any = None  # the e2m1 magnitudes (a tensor): values round to them times the scale, not to integers

    @staticmethod
    def of(params: _Params, device: str) -> _ScaleTable:
        import torch

        scale, zp = _per_group(params)
        group = params.spec.group_size if params.spec.granularity is Granularity.GROUP else None
        return _ScaleTable(torch.from_numpy(scale).to(device), torch.from_numpy(zp).to(device), group,
                           *_limits(params))

    def at(self, column: int):
        g = column // self.group_size if self.group_size else 0
        return self.scale[:, g], self.zero_point[:, g]

    def rounded(self, column, index: int):
        """`column` (original column `index`) rounded onto its groups' grid, as float32 values (tensor methods,
        in place on the one temporary: this runs once per column of every layer)."""
        s, z = self.at(index)
        if self.fp4_grid is not None:
            return _fp4_rounded(column / s, self.fp4_grid).mul_(s)
        if self.offset:  # K-quants: level = rint((x + offset) / scale)
            return ((column + z) / s).round_().clamp_(self.lo, self.hi).mul_(s).sub_(z)
        return (column / s).round_().add_(z).clamp_(self.lo, self.hi).sub_(z).mul_(s)


def _fp4_rounded(x, grid):
    """Each value of `x` (a tensor) the nearest of the e2m1 magnitudes `grid`, its sign kept (qparams.FP4_STEPS:
    one comparison a threshold, as compressed-tensors casts)."""
    import torch

    magnitude = x.abs()
    index = torch.zeros_like(magnitude, dtype=torch.int64)
    for threshold, tie_up in qparams.FP4_STEPS:
        index += magnitude >= threshold if tie_up else magnitude > threshold
    return grid[index].copysign_(x)


def _group_columns(block, w, start: int, j: int, size: int) -> np.ndarray:
    """The columns of the group starting at column start + j as they stand now: those in the current block
    carry the block's updates so far, those after it the updates of the finished blocks."""
    import torch

    inside = block[:, j:j + size]
    beyond = w[:, start + block.shape[1]:start + j + size] if j + size > block.shape[1] else inside[:, :0]
    return torch.cat([inside, beyond], dim=1).cpu().numpy()


def _recompute_group(params: _Params, regroup: _ScaleRule, group: int, columns: np.ndarray, table: _ScaleTable) -> None:
    """Group `group`'s scale and zero point from `columns`, written into the reference (for the final
    integers) and into the table the loop rounds with."""
    import torch

    spec = replace(params.spec, group_size=columns.shape[1])
    fresh = regroup.quantize(columns, spec, group * (params.spec.group_size or 0))
    ref = params.reference
    ref.scale[:, group] = fresh.scale[:, 0]
    ref.zero_point[:, group] = fresh.zero_point[:, 0]
    s = np.where(fresh.scale[:, 0] != 0, fresh.scale[:, 0], 1.0).astype(np.float32)
    table.scale[:, group] = torch.from_numpy(s).to(table.scale.device)
    table.zero_point[:, group] = torch.from_numpy(fresh.zero_point[:, 0].astype(np.float32)).to(table.zero_point.device)


@dataclass(frozen=True)
class _Params:
    reference: QuantizedWeight  # scales and zero points per (channel, group)
    spec: WeightQuant


def _limits(params: _Params) -> tuple[int, int]:
    return qparams.qrange(params.spec.qtype, False)


def _per_group(params: _Params) -> tuple[np.ndarray, np.ndarray]:
    """Scales and zero points as float32 [out, groups] (per channel and per tensor: one group), a zero scale
    as 1 (its columns quantize to the zero point either way)."""
    rows = params.reference.q.shape[0]

    def table(values) -> np.ndarray:
        values = np.array(values, np.float32)  # a copy: the loop may rewrite a group's entries
        return np.full((rows, 1), values) if values.ndim == 0 else values.reshape(rows, -1)

    scale = table(params.reference.scale)
    return np.where(scale != 0, scale, 1.0).astype(np.float32), table(params.reference.zero_point)


def _requantize(dequantized: np.ndarray, params: _Params) -> QuantizedWeight:
    """The integer values of the GPTQ-rounded weight, with the scales it was rounded to (one float32 scratch
    of the weight's size: values divided by their group's scale, rounded and shifted in place)."""
    ref = params.reference
    lo, hi = _limits(params)
    scale, zp = _per_group(params)
    rows, groups = scale.shape
    values = dequantized.reshape(rows, groups, -1) / scale[:, :, None]
    np.round(values, out=values)
    values += zp[:, :, None]
    np.clip(values, lo, hi, out=values)
    q = values.reshape(dequantized.shape).astype(ref.q.dtype)
    return QuantizedWeight(q, ref.scale, ref.zero_point, ref.qtype, ref.axis, ref.block_size)
