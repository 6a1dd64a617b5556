"""The torch backend's `rounding mse` of symmetric int4/int8 compiled by numba: weights._signed_params without
importance weights, one group at a time while its values are in L1. Each group's value of largest magnitude
goes on the range's negative end (a negative scale where it is positive) and is divided over 7 to 16 steps
(weights.SIGNED_COARSE, then SIGNED_FINE around the best), the scale with the least squared error kept.

Why our own loop: numpy's search is seventeen candidates of a dozen whole-array passes each; data-free rounding
of a multi-GiB checkpoint is meant to run near the speed of copying it (bench/data_free_floor.py).

The errors are summed in float64 in order, numpy's in pairwise order: where two candidates' errors tie to the
last bits the two can keep different ones (tests/test_signed_kernel.py bounds how often)."""

from __future__ import annotations

import numpy as np
from numba import njit

from compiler.quant.round_kernels import EXACT, float_range, round_run, stored_word, sum_of_squares, to_bfloat16
from compiler.quant.weights import SIGNED_COARSE, SIGNED_FINE

_SUM_ANY_ORDER = {"reassoc", "nsz", "nnan", "ninf"}  # no contraction: each value's error as numpy rounds it
_TINY = np.float32(np.finfo(np.float32).tiny)  # qparams._round_to's floor of a scale rounded to zero
COARSE = np.array(SIGNED_COARSE, np.float32)
FINE = np.array(SIGNED_FINE, np.float32)


@njit(nogil=True, cache=True, fastmath=EXACT)
def _signed_scale(extreme, lo, factor, bfloat16_scales):
    """qparams.stored_signed(extreme / (lo · factor)): the magnitude rounded to bfloat16 where it is stored so
    (kept positive), the sign kept."""
    s = extreme / (lo * factor)
    if not bfloat16_scales:
        return s
    m = to_bfloat16(abs(s))
    m = m if m > 0 else _TINY
    return m if s >= 0 else -m


@njit(nogil=True, cache=True, fastmath=_SUM_ANY_ORDER)
def _squared_error(values, s, lo, hi):
    """Σ (clip(round(v / s)) · s − v)² in float64 (each square taken in float32, as numpy's search does; the
    sum in any order, so it runs in vector lanes: 4 against 23 ns a weight on 2 cores)."""
    total = 0.0
    for i in range(values.shape[0]):
        v = values[i]
        d = min(max(np.rint(v / s), lo), hi) * s - v
        total += np.float64(d * d)
    return total


@njit(nogil=True, cache=True, fastmath=EXACT)
def _best_scale(values, extreme, lo, hi, bfloat16_scales, coarse, fine):
    """The search of one group: the coarse factors, then the fine steps around the best (clipped to the coarse
    span); strict `<`, so the first of equal errors is kept."""
    best_err, best_scale, best_factor = np.inf, np.float32(0.0), np.float32(0.0)
    for k in range(coarse.shape[0]):
        s = _signed_scale(extreme, lo, coarse[k], bfloat16_scales)
        err = _squared_error(values, s, lo, hi)
        if err < best_err:
            best_err, best_scale, best_factor = err, s, coarse[k]
    centre = best_factor
    for k in range(fine.shape[0]):
        factor = min(max(centre + fine[k], coarse[0]), coarse[-1])
        s = _signed_scale(extreme, lo, factor, bfloat16_scales)
        err = _squared_error(values, s, lo, hi)
        if err < best_err:
            best_err, best_scale = err, s
    return best_scale


@njit(nogil=True, cache=True)
def signed_groups(bits, group, lo, hi, symmetric, bfloat16_scales, out, scale, zp) -> tuple:
    """round_kernels.round_groups (the same arguments, outputs and returned sums) with each group's scale from
    the signed search; `symmetric` is always true here (zero points 0)."""
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
            for i in range(group):
                words[i] = stored_word(source[start + i])
            mn, mx = float_range(words)
            squares += sum_of_squares(values)
            extreme = mx if abs(mx) > abs(mn) else mn
            extreme = extreme if extreme != 0 else np.float32(1.0)
            s = _best_scale(values, extreme, lo, hi, bfloat16_scales, COARSE, FINE)
            scale[r, g] = s
            zp[r, g] = 0.0
            round_run(values, s, np.float32(0.0), lo, hi, target[start:start + group], errors)
            error += sum_of_squares(errors)
    return squares, error
