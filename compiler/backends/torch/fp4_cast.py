"""NVFP4 for weights already on a power-of-two FP4 grid (an MXFP4 source: every block of 32 columns is FP4
values times 2^e, the block's e8m0 scale): the exact cast, where rounding by the block's range would round
them again.

NVFP4 stores a block of 16 columns as FP4 values times an e4m3 scale divided by the tensor's float32 global
scale. An e4m3 holds every power of two from 2^-9 to 2^8 exactly, so with a global scale 2^k each 16-column
block can take the scale 2^(e + k), and its values keep their FP4 codes: the weight decompresses to the same
floats, bit for bit. That needs every block's exponent within those 18 binades once shifted by k (k puts the
largest at 2^8); a weight whose exponents span more, or whose values are not on such a grid, rounds by the
usual rule (the block's largest magnitude over 6, compressed-tensors' calculate_qparams).

Block exponents are read from the values: a block whose largest magnitude is m has e = floor(log2 m) - 2 (the
largest FP4 value, 6, is 1.5 · 2^2, and an MX encoder puts m / 2^e in [4, 8)), and the block is on the grid when
every value divided by 2^e is an FP4 value. A half of an MXFP4 block with smaller values takes a smaller e and
the codes double or quadruple on the way, onto FP4 values still: the floats are what count."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from compiler.quant.qparams import FP4_GRID, FP4_MAX

BLOCK = 16  # NVFP4's columns per scale
E4M3_POWERS = (-9, 8)  # the powers of two float8_e4m3fn holds exactly (2^-9 is its smallest subnormal)
_FP4_TOP = 2  # floor(log2 6): a block's largest FP4 magnitude lies in [2^2, 2^3)
# 2 · |FP4 value| is a whole number below 13: these are the FP4 values among them (13 stands for "beyond")
_DOUBLED_FP4 = torch.zeros(14, dtype=torch.bool)
_DOUBLED_FP4[[int(2 * v) for v in FP4_GRID]] = True
ZERO_BLOCK = torch.iinfo(torch.int32).min  # the exponent block_exponents gives a block of zeros
_ROWS = 1024  # rows checked at a time: a few float32 copies of that many rows, not of the weight
_REACH = 100  # exponents scaled in float32 (2^±100 stays normal); a weight beyond them is not cast


@dataclass(frozen=True)
class ExactCast:
    """How NVFP4 represents a weight on an FP4 grid exactly: its global scale (2^k, float32 [1]) and each
    16-column block's range as compressed-tensors' calculate_qparams takes it (6 · 2^e, so the scale it
    computes is 2^(e + k); 0 for a block of zeros) [out, in / 16]."""

    global_scale: torch.Tensor
    high: torch.Tensor


def exact_cast(w: torch.Tensor, absmax: float | None = None, unit: bool = False) -> ExactCast | None:
    """The exact NVFP4 form of `w` [out, in] (any float dtype), or None where it has none. `absmax`: the largest |w|
    over the fused siblings that share the global scale (global_scales.py); None: the weight's own. `unit`: the
    global scale is 1 (2^0, a runtime that reads none): each block keeps its own power of two where e4m3 holds it,
    and a block whose power of two is below e4m3's smallest takes that one (2^-9: its values then round to it, the
    nearest NVFP4 has to them with this global scale), so the cast is exact where the grids allow."""
    exponents = block_exponents(w)
    if exponents is None:
        return None
    nonzero = exponents[exponents != ZERO_BLOCK]
    if unit:
        if nonzero.numel() and int(nonzero.max()) > E4M3_POWERS[1]:
            return None
        exponents = torch.where(exponents != ZERO_BLOCK, exponents.clamp(min=E4M3_POWERS[0]), exponents)
        return ExactCast(torch.tensor([1.0], dtype=torch.float32), _ranges(exponents))
    top = int(nonzero.max()) if absmax is None and nonzero.numel() else None
    shift = global_shift(absmax if absmax is not None else math.ldexp(1.0, (top or 0) + _FP4_TOP))
    if shift is None or (nonzero.numel() and not fits(int(nonzero.min()), shift)):
        return None
    return ExactCast(torch.tensor([2.0 ** shift], dtype=torch.float32), _ranges(exponents))


def _ranges(exponents: torch.Tensor) -> torch.Tensor:
    """Each block's range as calculate_qparams takes it: 6 · 2^e (0 for a block of zeros)."""
    largest = torch.tensor(float(FP4_MAX), device=exponents.device)
    return torch.where(exponents != ZERO_BLOCK, torch.ldexp(largest, _finite(exponents)), largest.new_zeros(()))


def lowest_exponent(w: torch.Tensor) -> int | None:
    """The smallest block exponent of a weight on the grid (a large number for one of zeros), None off it:
    what fused siblings compare against their shared global scale (`fits`) before any of them is cast."""
    exponents = block_exponents(w)
    if exponents is None:
        return None
    nonzero = exponents[exponents != ZERO_BLOCK]
    return int(nonzero.min()) if nonzero.numel() else E4M3_POWERS[1]


def global_shift(absmax: float) -> int | None:
    """k of the global scale 2^k that puts the block holding `absmax` at e4m3's largest power of two."""
    if not 0 < absmax < float("inf"):
        return None
    return E4M3_POWERS[1] - (math.frexp(absmax)[1] - 1 - _FP4_TOP)


def fits(lowest: int, shift: int) -> bool:
    """Whether the smallest block scale, 2^(lowest + shift), is one e4m3 holds."""
    return lowest + shift >= E4M3_POWERS[0]


def block_exponents(w: torch.Tensor) -> torch.Tensor | None:
    """Each 16-column block's e (int32 [out, in / 16]; ZERO_BLOCK for a block of zeros) where every block of
    `w` (any float dtype: each slice of rows is made float32 as it is checked, so a weight off the grid costs
    one row's copy, not the whole weight's) is FP4 values times 2^e, else None."""
    if w.ndim != 2 or w.shape[1] % BLOCK or w.shape[0] == 0:
        return None
    found = []
    for first in [0, *range(1, w.shape[0], _ROWS)]:  # row 0 alone first: most weights are off the grid there already
        rows = 1 if first == 0 else _ROWS
        blocks = w[first:first + rows].float().reshape(min(rows, w.shape[0] - first), -1, BLOCK)  # float32 here
        top = blocks.abs().amax(dim=-1)
        if not bool(torch.isfinite(top).all()):
            return None
        _, exponent = torch.frexp(top)  # top = mantissa · 2^exponent, mantissa in [0.5, 1)
        exponents = torch.where(top > 0, exponent - 1 - _FP4_TOP, ZERO_BLOCK).to(torch.int32)
        nonzero = exponents[exponents != ZERO_BLOCK]
        if nonzero.numel() and int(nonzero.abs().max()) > _REACH:
            return None
        if not _on_grid(torch.ldexp(blocks, (-_finite(exponents)).unsqueeze(-1))):
            return None
        found.append(exponents)
    return torch.cat(found)


def _finite(exponents: torch.Tensor) -> torch.Tensor:
    """The exponents with a zero block's made 0 (its values are 0 at any scale), as float32 for ldexp."""
    return torch.where(exponents != ZERO_BLOCK, exponents, 0).float()


def _on_grid(values: torch.Tensor) -> bool:
    """Whether every value is an FP4 value (±0, 0.5, 1, 1.5, 2, 3, 4, 6): twice it a whole number the table
    holds (a lookup: torch.isin took 3.3 of the 8.7 s the real SmolLM2-135M's MXFP4 folder spent rounding into
    NVFP4)."""
    doubled = values.abs() * 2
    whole = doubled.clamp(max=13).to(torch.uint8)  # a NaN or a fraction differs from its whole number
    return bool((whole == doubled).all()) and bool(_DOUBLED_FP4.to(whole.device)[whole.long()].all())
