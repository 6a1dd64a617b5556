"""The torch backend's mse clipping search of a weight, compiled by numba: per group (or channel) the range
found once, then each shrink factor of weights.MSE_GRID tried on values still in L1 and the one with the
lowest squared error kept, then the integers rounded with it.

Why our own loop: numpy's search (weights._mse_params) is eleven candidates of a dozen whole-array passes
each; data-free mse of a 6 GiB checkpoint took 52 s against 9 s for rtn (round_kernels.round_groups).

The choice between two candidates can hinge on the last bit of their errors, so the loop decides as numpy
does: each value's squared error by the same float32 operations (no reassociation, no contraction), each
candidate's sum estimated in float32 lanes, and where another candidate's estimate is within the estimates'
error of the lowest (ties, near-ties: rare), those candidates summed in float64 in the order numpy's
`sum(axis=1, dtype=float64)` adds a float32 run in: runs of NUMPY_BUFFER values (its casting buffer), each
summed pairwise (`numpy_order_sum`). tests/test_mse_kernel.py holds that order against numpy's own sum,
the bound, exact and near ties, and whole weights against weights.quantize_weight.

numba compiles a function without fast-math flags of its own with its caller's: a NaN test in `_best` called
from a loop compiled with `nnan` was folded away. So the loops that need flags carry them, and the driver
(`mse_groups`) carries none."""

from __future__ import annotations

from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from compiler.quant.round_kernels import EXACT, float_range, round_run, scale_zero_point, stored_word, sum_of_squares

NUMPY_BUFFER = 8192  # numpy's default ufunc buffer (np.getbufsize()): a cast reduction adds this many at a time
_ANY_ORDER = {"reassoc", "nsz"}  # the estimates' sums: reordered into vector lanes, infinities and NaN kept
_LEAF = 128  # numpy's pairwise summation: runs up to this long are added in 8 interleaved partial sums


def _lane_sums(typingctx, rows, row, start, whole):
    """Σ of rows[row, start:start + whole] (`whole` a multiple of 8, at least 8; a C-contiguous float32 array)
    as numpy's pairwise leaf adds a run: eight float64 running sums (value i into sum i mod 8) combined as
    ((0+1)+(2+3))+((4+5)+(6+7)). Written as LLVM vector code: the eight sums are the lanes of one
    <8 x double>, which LLVM does not make of eight scalar sums itself (0.30 against 0.10 ns a value)."""
    if not (isinstance(rows, types.Array) and rows.ndim == 2 and rows.layout == "C"
            and rows.dtype == types.float32):
        return None

    def codegen(context, builder, signature, args):
        array = context.make_array(signature.args[0])(context, builder, args[0])
        stride = cgutils.unpack_tuple(builder, array.shape)[1]
        index, lanes, wide = ir.IntType(64), ir.VectorType(ir.FloatType(), 8), ir.VectorType(ir.DoubleType(), 8)
        first = builder.gep(array.data, [builder.add(builder.mul(stride, args[1]), args[2])])

        def load(at):
            pointer = builder.bitcast(builder.gep(first, [at]), lanes.as_pointer())
            return builder.fpext(builder.load(pointer, align=4), wide)

        entry, initial = builder.block, load(ir.Constant(index, 0))
        head, body, done = (builder.append_basic_block(f"lanes.{name}") for name in ("head", "body", "done"))
        builder.branch(head)
        builder.position_at_end(head)
        at, sums = builder.phi(index), builder.phi(wide)
        at.add_incoming(ir.Constant(index, 8), entry)
        sums.add_incoming(initial, entry)
        builder.cbranch(builder.icmp_signed("<", at, args[3]), body, done)
        builder.position_at_end(body)
        at.add_incoming(builder.add(at, ir.Constant(index, 8)), body)
        sums.add_incoming(builder.fadd(sums, load(at)), body)
        builder.branch(head)
        builder.position_at_end(done)
        r = [builder.extract_element(sums, ir.Constant(ir.IntType(32), lane)) for lane in range(8)]
        return builder.fadd(builder.fadd(builder.fadd(r[0], r[1]), builder.fadd(r[2], r[3])),
                            builder.fadd(builder.fadd(r[4], r[5]), builder.fadd(r[6], r[7])))
    return types.float64(rows, types.int64, types.int64, types.int64), codegen


lane_sums: Any = intrinsic(_lane_sums)  # compiled code only


@njit(nogil=True, cache=True)
def _pairwise(rows, row, start, n) -> float:
    """numpy's pairwise sum of rows[row, start:start + n] (float32) in float64: under 8 values in order; up to
    128 in eight running sums (`lane_sums`), then the rest in order; longer runs split at half rounded down to
    a multiple of 8, each half summed so and then added."""
    if n > _LEAF:
        half = n // 2
        half -= half % 8
        return _pairwise(rows, row, start, half) + _pairwise(rows, row, start + half, n - half)
    whole = n - n % 8 if n >= 8 else 0
    total = lane_sums(rows, row, start, whole) if whole else 0.0
    for i in range(start + whole, start + n):
        total += np.float64(rows[row, i])
    return total


@njit(nogil=True, cache=True)
def numpy_order_sum(rows, row) -> float:
    """Σ of rows[row] (a [k, n] float32 array) in float64, bit for bit what numpy's `sum(axis=1,
    dtype=np.float64)` gives for that row: a running total (from 0) plus the pairwise sum of each
    NUMPY_BUFFER-long run."""
    n, total = rows.shape[1], 0.0
    for start in range(0, n, NUMPY_BUFFER):
        total += _pairwise(rows, row, start, min(NUMPY_BUFFER, n - start))
    return total


@njit(nogil=True, cache=True, fastmath=EXACT)
def _squared_errors(values, s, z, lo, hi, squares, row) -> None:
    """Each value's squared error (float32) once rounded with scale `s` and zero point `z`, into
    squares[row]: ((clip(round(v / s) + z) − z) · s − v)², weights._Rules.squared_error's operations in its
    order. A zero point of 0 (symmetric) skips adding and taking it: the same values (only a zero's sign could
    differ, which its square loses)."""
    if z == 0:
        for i in range(values.shape[0]):
            v = values[i]
            d = min(max(np.rint(v / s), lo), hi) * s - v
            squares[row, i] = d * d
        return
    for i in range(values.shape[0]):
        v = values[i]
        x = min(max(np.rint(v / s) + z, lo), hi)
        d = (x - z) * s - v
        squares[row, i] = d * d


@njit(nogil=True, cache=True, fastmath=EXACT)
def _candidates(low, high, alphas, lo, hi, symmetric, bfloat16_scales, scales, zero_points) -> None:
    """Each shrink factor's scale and zero point ([factor, group]) for the groups' ranges `low`, `high`
    (float32): the factor times the range in float64, stored as float32, as weights._mse_params computes
    it; one loop over the groups per factor, so it runs in vector lanes."""
    for k in range(alphas.shape[0]):
        alpha = alphas[k]
        for g in range(low.shape[0]):
            scales[k, g], zero_points[k, g] = scale_zero_point(
                np.float32(np.float64(low[g]) * alpha), np.float32(np.float64(high[g]) * alpha), lo, hi,
                symmetric, bfloat16_scales)


@njit(nogil=True, cache=True, fastmath=_ANY_ORDER)
def _estimate(squares, row) -> float:
    """Σ squares[row] in float32 lanes, in whatever order vectorizes: the terms are ≥ 0, so it is within
    (n − 1)·2⁻²⁴ of the exact sum, relatively (an overflow to infinity included)."""
    total = np.float32(0.0)
    for i in range(squares.shape[1]):
        total += squares[row, i]
    return np.float64(total)


@njit(nogil=True, cache=True)  # no fast-math flags: estimates that are infinite or NaN compare as they are
def contenders_of(estimates, n, contenders) -> int:
    """How many candidates could have the lowest exact error, given their errors' float32 `estimates` over `n`
    terms each; their indices into `contenders`, in order. An estimate is within δ = n·2⁻²⁴ of its exact sum,
    so a candidate whose estimate exceeds the lowest by more than (1 + 4δ) has a larger exact sum (its own
    error and the lowest's both taken against it), and is left out. 0 where an estimate is NaN."""
    lowest = np.inf
    for k in range(estimates.shape[0]):
        if np.isnan(estimates[k]):
            return 0
        lowest = min(lowest, estimates[k])
    bound = lowest * (1.0 + 4.0 * n * 2.0 ** -24)
    found = 0
    for k in range(estimates.shape[0]):
        if estimates[k] <= bound:
            contenders[found] = k
            found += 1
    return found


@njit(nogil=True, cache=True)  # no fast-math flags: estimates that are infinite or NaN compare as they are
def _best(values, scales, zero_points, lo, hi, squares, estimates, contenders) -> int:
    """The candidate (a row of `scales`, `zero_points` for this group) whose squared error, summed in numpy's
    order, is lowest: the first on a tie, the first if none is below infinity (weights._mse_params's strict
    `<`). Every candidate's errors are estimated in float32; only the candidates within the estimates'
    error of the lowest one can be lowest, and only those (usually one: then it is chosen) are summed in
    numpy's order. `squares` [candidates, len(values)], `estimates` and `contenders` [candidates] are
    scratch."""
    count, n = scales.shape[0], values.shape[0]
    for k in range(count):
        _squared_errors(values, scales[k], zero_points[k], lo, hi, squares, k)
        estimates[k] = _estimate(squares, k)
    found = contenders_of(estimates, n, contenders)
    if found == 1:
        return contenders[0]
    if found == 0:  # a NaN among the estimates: numpy's choice over every candidate
        for k in range(count):
            contenders[k] = k
        found = count
    best, chosen = np.inf, 0
    for k in contenders[:found]:
        error = numpy_order_sum(squares, k)
        if error < best:
            best, chosen = error, k
    return chosen


@njit(nogil=True, cache=True)  # no flags: its callees without their own would take them (module docstring)
def mse_groups(bits, group, lo, hi, symmetric, bfloat16_scales, alphas, out, scale, zp) -> tuple:
    """round_kernels.round_groups with the scale and zero point of each group chosen by the mse search over
    the shrink factors `alphas` (float64, weights.MSE_GRID) instead of the full range: the same arguments,
    outputs and returned sums (Σ w², Σ (w − dequantized)² of the chosen rounding)."""
    rows, cols = bits.shape
    groups = cols // group
    words = np.empty(cols, np.uint32)
    values = words.view(np.float32)
    low, high = np.empty(groups, np.float32), np.empty(groups, np.float32)
    scales, zero_points = np.empty((alphas.shape[0], groups), np.float32), np.empty((alphas.shape[0], groups), np.float32)
    errors = np.empty(group, np.float32)
    squares_scratch = np.empty((alphas.shape[0], group), np.float32)
    estimates, contenders = np.empty(alphas.shape[0]), np.empty(alphas.shape[0], np.int64)
    squares = 0.0
    error = 0.0
    for r in range(rows):
        source, target = bits[r], out[r]
        for i in range(cols):
            words[i] = stored_word(source[i])
        squares += sum_of_squares(values)
        for g in range(groups):
            low[g], high[g] = float_range(words[g * group:(g + 1) * group])
        _candidates(low, high, alphas, lo, hi, symmetric, bfloat16_scales, scales, zero_points)
        for g in range(groups):
            run = values[g * group:(g + 1) * group]
            k = _best(run, scales[:, g], zero_points[:, g], lo, hi, squares_scratch, estimates, contenders)
            scale[r, g], zp[r, g] = scales[k, g], zero_points[k, g]
            round_run(run, scale[r, g], zp[r, g], lo, hi, target[g * group:(g + 1) * group], errors)
            error += sum_of_squares(errors)
    return squares, error
