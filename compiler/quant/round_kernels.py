"""The torch backend's rtn of a weight in one pass, compiled by numba: each group's range, scale, zero point,
integers and squared error taken while its values are in L1.

Why our own loop: rounding with numpy is a dozen whole-array passes over a slice (min, max, divide, round,
add, clip, cast, then subtract, multiply, subtract, square and sum for the error), about 7 ns a weight per
core, and data-free rounding of a checkpoint was bounded by that, not by reading and writing it. This loop
reads the weight's bits as stored (bfloat16 or float32, no float32 copy) at about 0.5 ns a weight.

It does numpy's float32 arithmetic in numpy's order, so the integers and scales are bit-identical to the
rule in qparams.torch_scale_zero_point and weights.quantize_weight (tests/test_round_kernels.py compares
both with compressed-tensors' rule written out). Floating-point flags: the rounding is compiled without
reassociation or contraction, so each value's division, rounding and clip are the IEEE operations numpy
performs; only the sums may be reassociated (summed in float32 runs, then in float64: they feed the SQNR,
whose last digits already depend on the slicing). A NaN or an infinity anywhere still gives a non-finite
Σ w², which is what the callers refuse a weight by (Q409).

numba compiles the loop at its first call on a machine and caches the machine code on disk (`cache=True`):
later processes load it. Importing numba and loading the code costs about 125 MiB of RSS, which the torch
plans count (torch/cost.py: ROUNDING_KERNELS)."""

from __future__ import annotations

from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

SUMS = {"reassoc", "nsz", "nnan", "ninf", "contract"}  # reductions only: order and NaN-freedom assumed
EXACT = {"nnan", "ninf", "nsz"}  # no reassociation, no contraction: IEEE per value
_TINY = np.float32(np.finfo(np.float32).tiny)  # a zero range's scale (bfloat16 shares float32's exponent range)


def _float_of_bits(typingctx, bits):
    """The float32 whose bits are the low 32 of an integer (a bit cast, no conversion)."""
    def codegen(context, builder, signature, args):
        value = args[0]
        if value.type.width != 32:
            value = builder.trunc(value, ir.IntType(32))
        return builder.bitcast(value, ir.FloatType())
    return types.float32(bits), codegen


def _bits_of_float(typingctx, value):
    """A float32's bits as uint32 (a bit cast)."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return types.uint32(value), codegen


# compiled-code intrinsics: called with the value only (numba supplies the typing context)
float_of: Any = intrinsic(_float_of_bits)
bits_of: Any = intrinsic(_bits_of_float)


def stored_word(stored):
    """The float32 bits of a weight's stored bits (compiled code only): a bfloat16's (uint16) moved up 16, a
    float32's (uint32) as they are. Chosen by the type when the loop is compiled, so the shift is a constant
    and the loop widens 16 values at a time in 32-bit lanes (a shift by a run-time amount took 64-bit lanes:
    0.75 against 0.81 ns a weight in the FP4 loop)."""
    raise NotImplementedError("stored_word is compiled into numba loops only")


@overload(stored_word, inline="always")
def _stored_word(stored):
    if stored == types.uint16:
        return lambda stored: np.uint32(np.uint32(stored) << np.uint32(16))
    if stored == types.uint32:
        return lambda stored: stored
    return None


@njit(nogil=True, cache=True, fastmath=SUMS)
def sum_of_squares(values: np.ndarray) -> float:
    """Σ v² of a float32 array (summed in float32 lanes, then float64)."""
    squares = np.float32(0.0)
    for i in range(values.shape[0]):
        squares += values[i] * values[i]
    return np.float64(squares)


@njit(nogil=True, cache=True)
def float_range(bits: np.ndarray) -> tuple:
    """min and max of float32 values given as their bits, compared as integers ordered like the floats (a
    negative float's magnitude bits flipped): vector integer min/max, where float min/max would not vectorize."""
    lo = np.int32(0x7FFFFFFF)
    hi = np.int32(-0x80000000)
    for i in range(bits.shape[0]):
        s = np.int32(bits[i])
        key = s ^ ((s >> np.int32(31)) & np.int32(0x7FFFFFFF))
        lo = key if key < lo else lo
        hi = key if key > hi else hi
    return (float_of(lo ^ ((lo >> np.int32(31)) & np.int32(0x7FFFFFFF))),
            float_of(hi ^ ((hi >> np.int32(31)) & np.int32(0x7FFFFFFF))))


@njit(nogil=True, cache=True)
def to_bfloat16(x: np.float32) -> np.float32:
    """A finite float32 rounded to the nearest bfloat16 (ties to even), as float32: torch's conversion."""
    b = bits_of(x)
    return float_of((b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000))


@njit(nogil=True, cache=True, fastmath=EXACT)
def scale_zero_point(mn, mx, lo, hi, symmetric, bfloat16_scales) -> tuple:
    """compressed-tensors' scale and zero point of a range (float32; qparams.torch_scale_zero_point's rule):
    0 put in the range, absmax / ((hi − lo) / 2) with zero point 0 (symmetric) or (max − min) / (hi − lo) with
    zero point clip(round(lo − min / scale)), a zero scale made the smallest normal, rounded to bfloat16 if
    `bfloat16_scales` (where it is stored) and kept positive."""
    mn, mx = min(mn, np.float32(0.0)), max(mx, np.float32(0.0))
    s = max(-mn, mx) / ((hi - lo) * np.float32(0.5)) if symmetric else (mx - mn) / (hi - lo)
    s = s if s > 0 else _TINY
    if bfloat16_scales:
        s = to_bfloat16(s)
        s = s if s > 0 else _TINY
    z = np.float32(0.0) if symmetric else min(max(np.rint(lo - mn / s), lo), hi)
    return s, z


@njit(nogil=True, cache=True, fastmath=EXACT)
def round_run(values, scale, zp, lo, hi, out, errors) -> None:
    """round(v / scale) half to even plus the zero point, clipped to [lo, hi], into `out`; each value's error
    as dequantized, v − (q − zero point) · scale, into `errors`."""
    for i in range(values.shape[0]):
        v = values[i]
        x = min(max(np.rint(v / scale) + zp, lo), hi)
        out[i] = x
        errors[i] = v - (x - zp) * scale


@njit(nogil=True, cache=True, fastmath=EXACT)
def round_groups(bits, group, lo, hi, symmetric, bfloat16_scales, out, scale, zp) -> tuple:
    """compressed-tensors' rtn of an [out, in] weight given as its float bits (uint16 bfloat16, uint32
    float32; stored_word), in groups of `group` along each row (the row's length: per channel): each
    group's range with 0 in it, scale absmax / (range / 2) (symmetric, zero point 0) or (max − min) / range
    with zero point clip(round(lo − min / scale)), a zero scale made the smallest normal, rounded to
    bfloat16 if `bfloat16_scales` (where it is stored), then the integers into `out` ([out, in], any integer
    type), scales and zero points (float32) into `scale` and `zp` ([out, in / group]). Returns (Σ w², Σ (w −
    dequantized)²). qparams.torch_scale_zero_point and weights.quantize_weight are the same rules."""
    rows, cols = bits.shape
    words = np.empty(group, np.uint32)
    values = words.view(np.float32)
    errors = np.empty(group, np.float32)
    squares = 0.0
    error = 0.0
    for r in range(rows):
        source, target = bits[r], out[r]
        for g in range(cols // group):
            start = g * group
            run = source[start:start + group]
            for i in range(group):
                words[i] = stored_word(run[i])
            mn, mx = float_range(words)
            squares += sum_of_squares(values)
            s, z = scale_zero_point(mn, mx, lo, hi, symmetric, bfloat16_scales)
            scale[r, g] = s
            zp[r, g] = z
            round_run(values, s, z, lo, hi, target[start:start + group], errors)
            error += sum_of_squares(errors)
    return squares, error


@njit(nogil=True, cache=True)
def pack_nibbles(pairs, out) -> None:
    """Signed 4-bit values packed as pack_int32 lays them out, in one pass: each uint16 of `pairs` ([rows, n]:
    two int8 values of a row, the first in the low byte) becomes out[r, i] = (v0 + 8) | (v1 + 8) << 4, each sum
    modulo 16 as pack_int32.offset_bytes then pack_int32.pack_int4 give it. Those are four numpy passes with a
    temporary each: 0.72 against 0.12 ns a value here, 1.1 of a 6 GiB W4A16 run's CPU seconds."""
    for r in range(pairs.shape[0]):
        row, target = pairs[r], out[r]
        for i in range(row.shape[0]):
            word = np.uint32(row[i])
            target[i] = np.uint8(((word + 8) & 15) | ((((word >> 8) + 8) & 15) << 4))
