"""GGUF's blocks as qrc rounds them: Q4_0/Q8_0 with rtn through the gguf package's port of llama.cpp's reference
quantizer (quantize_reference), and the K-quants below.

GGUF's K-quants (Q4_K, Q5_K, Q6_K), rounded as llama.cpp's quantizer searches them (ggml-quants.c), vectorised
over every super-block of a weight at once in float32, and packed into llama.cpp's block layout.

A row is cut into super-blocks of 256 weights. Q4_K/Q5_K: 8 sub-blocks of 32, each with a scale and a min
searched over a grid of candidate scales (weighted least squares), then the 8 scales and 8 mins quantized to 6
bits under one float16 `d` and `dmin` per super-block, and the integers rounded again against those. Q6_K: 16
sub-blocks of 16, symmetric, each scale searched the same way, quantized to int8 under one float16 `d`.

Without an importance vector the weights of the search are llama.cpp's data-free ones (the reference
quantizer); with one (`rounding imatrix`: each input column's mean square over the calibration tokens, what
llama.cpp's imatrix holds) they are llama.cpp's importance-weighted ones, and the sub-block scales are
themselves searched. The float32 sums run in numpy's order, not C's, so a value on a rounding boundary may
land on the other side: close to llama.cpp's output, not bit-identical."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.ir.types import QType

SUPER = 256  # weights per super-block (QK_K)
_F = np.float32
_EPS = _F(1e-15)  # GROUP_MAX_EPS: a sub-block below this is all zero


@dataclass(frozen=True)
class GgufBlocks:
    """One weight in a GGUF type: its bytes in llama.cpp's block layout ([rows, bytes per row]) and the integers,
    scales and mins they hold, decoded to float32 as llama.cpp computes with them."""
    kind: str  # the GGUF type's name (Q4_K, Q4_0, …)
    packed: np.ndarray  # uint8 [rows, row bytes]
    values: np.ndarray  # float32 [rows, columns]

    def dequantize(self) -> np.ndarray:
        """The weight as llama.cpp decodes it (float32)."""
        return self.values


@dataclass(frozen=True)
class KGrid:
    """The grid of a weight in a K-quant, searched as llama.cpp does: per super-block its float16 scales and
    6-bit (Q4_K/Q5_K) or int8 (Q6_K) sub-block scales, and so per sub-block the step and offset each weight is
    rounded with: value = step·level − offset, level = rint((x + offset) / step) in lo..hi (Q6_K: offset 0,
    levels −32..31, stored + 32)."""
    qtype: QType
    shape: tuple[int, int]  # the weight's [rows, columns]
    d: np.ndarray  # float16 [super-blocks]
    dmin: np.ndarray | None  # float16 [super-blocks] (Q4_K/Q5_K)
    sub_scales: np.ndarray  # [super-blocks, sub-blocks]: uint8 6-bit scales, int8 for Q6_K
    sub_mins: np.ndarray | None  # uint8 6-bit mins (Q4_K/Q5_K)
    step: np.ndarray  # float32 [super-blocks, sub-blocks]
    offset: np.ndarray  # float32 [super-blocks, sub-blocks]
    lo: int
    hi: int

    @property
    def group(self) -> int:
        """Weights per sub-block (along the row)."""
        return SUPER // self.step.shape[1]

    def per_row(self, table: np.ndarray) -> np.ndarray:
        """A [super-blocks, sub-blocks] table as [rows, column groups]."""
        return table.reshape(self.shape[0], -1)

    def levels(self, x: np.ndarray, fallback: np.ndarray | None = None) -> np.ndarray:
        """The integers of `x` [rows, columns] on this grid; where a step is 0, `fallback`'s (else 0)."""
        sub = np.ascontiguousarray(x, dtype=_F).reshape(self.step.shape + (self.group,))
        with np.errstate(divide="ignore", invalid="ignore"):
            found = np.clip(_rint((sub + self.offset[..., None]) / self.step[..., None]), self.lo, self.hi)
        usable = (self.step != 0)[..., None]
        return np.where(usable, found, _F(0) if fallback is None else fallback)

    def blocks(self, levels: np.ndarray) -> GgufBlocks:
        """The GGUF blocks of these integers [super-blocks, sub-blocks, group] on this grid."""
        rows, columns = self.shape
        values = self.step[..., None] * levels.astype(_F) - self.offset[..., None]
        if self.qtype is QType.Q6_K:
            stored = (levels + _F(32)).astype(np.uint8)
            packed = _pack_q6_k(self.d, self.sub_scales, stored)
        else:
            assert self.dmin is not None and self.sub_mins is not None  # Q4_K/Q5_K have mins
            packed = _pack_q45_k(self.d, self.dmin, self.sub_scales, self.sub_mins, levels.astype(np.uint8), self.hi)
        return GgufBlocks(self.qtype.name.upper(), packed.reshape(rows, -1), values.reshape(rows, columns))


def quantize_kquant(w: np.ndarray, qtype: QType, importance: np.ndarray | None = None) -> GgufBlocks:
    """Round `w` [rows, columns] (columns a multiple of 256) to `qtype`; `importance` [columns]: llama.cpp's
    imatrix for this layer (None: the data-free search)."""
    grid, searched = kquant_grid(w, qtype, importance)
    return grid.blocks(grid.levels(w, searched))


def kquant_grid(w: np.ndarray, qtype: QType, importance: np.ndarray | None = None) -> tuple[KGrid, np.ndarray]:
    """The grid llama.cpp's search gives `w` [rows, columns] in `qtype` (with `importance`, the imatrix search),
    and the integers that search found (what a sub-block whose step is 0 keeps)."""
    rows, columns = w.shape
    x = np.ascontiguousarray(w, dtype=_F).reshape(-1, SUPER)
    qw = None if importance is None else np.broadcast_to(np.asarray(importance, _F).reshape(-1, SUPER),
                                                         (rows, columns // SUPER, SUPER)).reshape(-1, SUPER)
    if qtype is QType.Q6_K:
        d, sc, step, searched = _q6_k_grid(x, qw)
        grid = KGrid(qtype, (rows, columns), d, None, sc, None, step, np.zeros_like(step), -32, 31)
        return grid, searched
    nmax = 15 if qtype is QType.Q4_K else 31
    d, dmin, ls, lm, levels = _q45_k_grid(x, qw, nmax)
    step = d.astype(_F)[:, None] * ls
    offset = dmin.astype(_F)[:, None] * lm
    grid = KGrid(qtype, (rows, columns), d, dmin, ls.astype(np.uint8), lm.astype(np.uint8), step, offset, 0, nmax)
    return grid, levels


def quantize_reference(w: np.ndarray, kind: str) -> GgufBlocks:
    """`w` [rows, columns] in Q4_0 or Q8_0 as llama.cpp's reference quantizer rounds them, through the gguf
    package's port of it (bit-exact: Q4_0's scale is the signed largest value over -8, so all 16 levels are
    used; Q8_0's the largest magnitude over 127), decoded by the same package."""
    import gguf

    kind_id = gguf.GGMLQuantizationType[kind]
    packed = gguf.quants.quantize(np.ascontiguousarray(w, dtype=_F), kind_id)
    values = gguf.quants.dequantize(packed, kind_id).astype(_F, copy=False)
    return GgufBlocks(kind, packed.reshape(w.shape[0], -1), values.reshape(w.shape))


def _rint(v: np.ndarray) -> np.ndarray:
    """llama.cpp's nearest_int: round half to even, in float32."""
    return np.rint(v.astype(_F, copy=False))


def _sum(v: np.ndarray) -> np.ndarray:
    return v.sum(axis=-1, dtype=_F)


def _search_min_scale(x, w, nmax: int, rmin: float, rdelta: float, nstep: int):
    """make_qkx2/3_quants over [..., n]: the scale, min (as the positive amount subtracted) and integers of each
    sub-block with the least weighted squared error over `nstep + 1` candidate scales."""
    mn = np.minimum(x.min(-1), _F(0))
    mx = x.max(-1)
    flat = mx <= mn
    span = np.where(flat, _F(1), mx - mn)
    sum_w, sum_x = _sum(w), _sum(w * x)
    iscale = _F(nmax) / span
    scale = _F(1) / iscale
    shifted = x - mn[..., None]
    levels = np.clip(_rint(iscale[..., None] * shifted), 0, nmax)
    best = _sum(w * np.square(scale[..., None] * levels + mn[..., None] - x))
    for step in range(nstep + 1):  # as in llama.cpp, each candidate is taken from the best min found so far
        span = np.where(flat, _F(1), mx - mn)
        shifted = x - mn[..., None]
        iscale = (_F(rmin) + _F(rdelta) * _F(step) + _F(nmax)) / span
        trial = np.clip(_rint(iscale[..., None] * shifted), 0, nmax)
        sum_l, sum_l2, sum_xl = _sum(w * trial), _sum(w * trial * trial), _sum(w * trial * x)
        det = sum_w * sum_l2 - sum_l * sum_l
        with np.errstate(divide="ignore", invalid="ignore"):
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / det
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det
            positive = this_min > 0
            this_scale = np.where(positive, sum_xl / sum_l2, this_scale)
        this_min = np.where(positive, _F(0), this_min)
        error = _sum(w * np.square(this_scale[..., None] * trial + this_min[..., None] - x))
        better = (det > 0) & (error < best)
        levels = np.where(better[..., None], trial, levels)
        best, scale, mn = np.where(better, error, best), np.where(better, this_scale, scale), np.where(better, this_min, mn)
    return np.where(flat, _F(0), scale), -mn, np.where(flat[..., None], _F(0), levels)


def _search_positive(x, w, nmax: int):
    """make_qp_quants over [..., n] (n small): quantize non-negative values (sub-block scales or mins) to
    0..nmax under one scale, searched, then refined value by value as llama.cpp does; (scale, levels)."""
    top = x.max(-1)
    zero = top < _EPS
    top = np.where(zero, _F(1), top)
    iscale = _F(nmax) / top
    levels = _rint(iscale[..., None] * x)
    best = _sum(w * np.square(x - (_F(1) / iscale)[..., None] * levels))
    for step in (-4, -3, -2, -1, 1, 2, 3, 4):
        trial_iscale = _F(0.1 * step + nmax) / top
        trial = np.minimum(_F(nmax), _rint(trial_iscale[..., None] * x))
        error = _sum(w * np.square(x - (_F(1) / trial_iscale)[..., None] * trial))
        better = error < best
        best, iscale = np.where(better, error, best), np.where(better, trial_iscale, iscale)
    levels = np.minimum(_F(nmax), _rint(iscale[..., None] * x))
    sumlx, suml2 = _sum(w * x * levels), _sum(w * levels * levels)
    for _ in range(5):  # a pass with no change leaves the next one nothing to change: all blocks run 5
        for i in range(x.shape[-1]):
            wi, xi, li = w[..., i], x[..., i], levels[..., i]
            slx, sl2 = sumlx - wi * xi * li, suml2 - wi * li * li
            usable = (slx > 0) & (sl2 > 0)
            with np.errstate(divide="ignore", invalid="ignore"):
                new = np.minimum(_F(nmax), _rint(np.where(usable, xi * sl2 / slx, li)))
            slx, sl2 = slx + wi * xi * new, sl2 + wi * new * new
            take = usable & (new != li) & (slx * slx * suml2 > sumlx * sumlx * sl2)
            levels[..., i] = np.where(take, new, li)
            sumlx, suml2 = np.where(take, slx, sumlx), np.where(take, sl2, suml2)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(suml2 > 0, sumlx / suml2, _F(0))
    return np.where(zero, _F(0), scale), np.where(zero[..., None], _F(0), levels)


def _q45_k_grid(x: np.ndarray, qw: np.ndarray | None, nmax: int):
    """Q4_K (nmax 15) or Q5_K (31) of super-blocks x [B, 256]: d, dmin (float16 [B]), the 6-bit scales and mins
    [B, 8] and the searched integers [B, 8, 32]."""
    sub = x.reshape(-1, 8, 32)
    if qw is None:  # quantize_row_q4_K_ref / q5_K_ref
        weights = np.sqrt(_sum(sub * sub) / _F(32))[..., None] + np.abs(sub)
        rmin, rdelta, nstep = (-1.0, 0.1, 20) if nmax == 15 else (-0.5, 0.1, 15)
        scales, mins, levels = _search_min_scale(sub, weights, nmax, rmin, rdelta, nstep)
        max_scale, max_min = np.maximum(scales.max(-1), _F(0)), np.maximum(mins.max(-1), _F(0))
        with np.errstate(divide="ignore"):
            inv_scale = np.where(max_scale > 0, _F(63) / max_scale, _F(0))
            inv_min = np.where(max_min > 0, _F(63) / max_min, _F(0))
        ls = np.minimum(_F(63), _rint(inv_scale[:, None] * scales))
        lm = np.minimum(_F(63), _rint(inv_min[:, None] * mins))
        d, dmin = (max_scale / _F(63)).astype(np.float16), (max_min / _F(63)).astype(np.float16)
    else:  # quantize_row_q4_K_impl / q5_K_impl with quant_weights
        sigma2 = _F(2) * _sum(x * x) / _F(SUPER)
        weights = qw.reshape(-1, 8, 32) * np.sqrt(sigma2[:, None, None] + sub * sub)
        scales, mins, levels = _search_min_scale(sub, weights, nmax, -0.9, 0.05, 36)
        block_weights = _sum(weights)
        d_block, ls = _search_positive(scales, block_weights, 63)
        m_block, lm = _search_positive(mins, block_weights, 63)
        d, dmin = d_block.astype(np.float16), m_block.astype(np.float16)
    return d, dmin, ls, lm, levels


def _pack_q45_k(d, dmin, ls, lm, levels, nmax: int) -> np.ndarray:
    """block_q4_K / block_q5_K: d, dmin (float16), 12 bytes of 6-bit scales and mins, [Q5_K: 32 bytes of high
    bits], 128 bytes of low nibbles (each 64 weights: the first 32 in the low nibbles, the next 32 high)."""
    blocks = d.shape[0]
    scales = np.zeros((blocks, 12), np.uint8)
    scales[:, 0:4], scales[:, 4:8] = ls[:, :4], lm[:, :4]
    scales[:, 8:12] = (ls[:, 4:] & 0xF) | ((lm[:, 4:] & 0xF) << 4)
    scales[:, 0:4] |= (ls[:, 4:] >> 4) << 6
    scales[:, 4:8] |= (lm[:, 4:] >> 4) << 6
    flat = levels.reshape(blocks, 4, 2, 32)  # [64-weight chunk, half, 32]
    low = (flat & 0xF).astype(np.uint8)
    qs = (low[:, :, 0] | (low[:, :, 1] << 4)).reshape(blocks, 128)
    parts = [d.reshape(blocks, 1).view(np.uint8), dmin.reshape(blocks, 1).view(np.uint8), scales]
    if nmax == 31:
        high = (flat >> 4).astype(np.uint8)  # bit 2c of qh[j] is weight j of chunk c's first half, 2c+1 its second
        shifts = (2 * np.arange(4)).reshape(1, 4, 1, 1) + np.arange(2).reshape(1, 1, 2, 1)
        parts.append(np.bitwise_or.reduce((high << shifts).reshape(blocks, 8, 32), axis=1).astype(np.uint8))
    return np.concatenate(parts + [qs], axis=1)


def _symmetric_scale(x, w, nmax: int):
    """make_qx_quants(rmse_type 1) over [..., n]: the signed scale of each sub-block (integers -nmax..nmax-1)
    with the best weighted fit over 19 candidate scales, and its integers + nmax."""
    amax_at = np.abs(x).argmax(-1)
    top = np.take_along_axis(x, amax_at[..., None], -1)[..., 0]
    zero = np.abs(top) < _EPS
    top = np.where(zero, _F(1), top)

    def fit(iscale):
        ints = np.clip(_rint(iscale[..., None] * x), -nmax, nmax - 1)
        return ints, _sum(w * x * ints), _sum(w * ints * ints)

    levels, sumlx, suml2 = fit(-_F(nmax) / top)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(suml2 != 0, sumlx / suml2, _F(0))
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        trial, slx, sl2 = fit(-_F(nmax + 0.1 * step) / top)
        better = (sl2 > 0) & (slx * slx > best * sl2)
        with np.errstate(divide="ignore", invalid="ignore"):
            new_scale = slx / sl2
        levels = np.where(better[..., None], trial, levels)
        scale = np.where(better, new_scale, scale)
        best = np.where(better, scale * slx, best)
    return np.where(zero, _F(0), scale), np.where(zero[..., None], _F(0), levels + nmax)


def _q6_k_grid(x: np.ndarray, qw: np.ndarray | None):
    """Q6_K of super-blocks x [B, 256]: d (float16 [B]), the int8 sub-block scales [B, 16], the steps [B, 16]
    (0 for an all-zero super-block) and the searched integers [B, 16, 16] (−32..31)."""
    sub = x.reshape(-1, 16, 16)
    weights = sub * sub if qw is None else qw.reshape(-1, 16, 16)
    scales, levels = _symmetric_scale(sub, weights, 32)
    pick = np.abs(scales).argmax(-1)
    max_scale = np.take_along_axis(scales, pick[:, None], -1)[:, 0]
    zero = np.abs(max_scale) < _EPS
    with np.errstate(divide="ignore"):
        iscale = np.where(zero, _F(0), _F(-128) / np.where(zero, _F(1), max_scale))
        d = np.where(zero, _F(0), _F(1) / np.where(zero, _F(1), iscale)).astype(np.float16)
    sc = np.minimum(_F(127), _rint(iscale[:, None] * scales)).astype(np.int8)
    step = np.where(zero[:, None], _F(0), d.astype(_F)[:, None] * sc.astype(_F))
    searched = np.where(zero[:, None, None], _F(-32), levels - _F(32))  # a zero block: all bytes 0, as llama.cpp
    return d, sc, step, searched


def _pack_q6_k(d, sc, levels) -> np.ndarray:
    """block_q6_K: 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8 scales, d (float16). Each half of
    128 weights: quarters q1..q4 of 32; ql[l] = q1 | q3 << 4, ql[l+32] = q2 | q4 << 4, qh[l] their high bits."""
    blocks = d.shape[0]
    q = levels.reshape(blocks, 2, 4, 32)
    low, high = q & 0xF, q >> 4
    ql = np.concatenate([low[:, :, 0] | (low[:, :, 2] << 4), low[:, :, 1] | (low[:, :, 3] << 4)], axis=2)
    qh = high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)
    return np.concatenate([ql.reshape(blocks, 128).astype(np.uint8), qh.reshape(blocks, 64).astype(np.uint8),
                           sc.view(np.uint8), d.reshape(blocks, 1).view(np.uint8)], axis=1)
