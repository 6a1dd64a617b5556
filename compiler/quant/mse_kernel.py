"""The torch backend's mse clipping search of a weight, compiled by numba: per group (or channel) the range
found once, every shrink factor of weights.MSE_GRID tried on the values while they are in L1, the one with
the lowest squared error kept, and the integers rounded with it.

Why our own loop: numpy's search (weights._mse_params) is eleven candidates of a dozen whole-array passes
each; data-free mse of a 6 GiB checkpoint took 52 s against 9 s for rtn (round_kernels.round_groups).

The choice between two factors can hinge on the last bit of their errors, so the loop decides as numpy
does, in two steps:
- Estimate every factor's error in vector code (`lane_estimates`): the quotient by a multiplication with
  the scale's reciprocal instead of numpy's division (the slowest operation), the error measured in units of
  the scale, float32 partial sums. The estimate is within known bounds of numpy's error (`error_bounds`: the
  summation's rounding, the reciprocal's, and a quotient that rounds to the other side of a half-integer).
- A factor whose lower bound is above another's upper bound cannot be the lowest. Where more than one is
  left (near-ties, exact ties: rare), those are summed exactly as numpy does: the same float32 operations
  per value, then float64 in the order numpy's `sum(axis=1, dtype=float64)` adds a float32 run (runs of
  NUMPY_BUFFER values, its casting buffer, each summed pairwise: `numpy_order_sum`).
tests/test_mse_kernel.py holds that order against numpy's own sum, the bounds against numpy's errors where
every reciprocal rounds the other way and where clipping dominates, exact and near ties, and whole weights
against weights.quantize_weight.

numba compiles a function without fast-math flags of its own with its caller's flags: a NaN test called
from a loop compiled with `nnan` was folded away. So the loops that need flags carry them, and the
functions that compare bounds and the driver (`mse_groups`) carry none."""

from __future__ import annotations

from typing import Any

import numpy as np
from llvmlite import ir
from llvmlite.binding import get_host_cpu_features
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from compiler.quant.round_kernels import EXACT, float_range, round_run, scale_zero_point, stored_word, sum_of_squares
from compiler.quant.weights import MSE_GRID

NUMPY_BUFFER = 8192  # numpy's default ufunc buffer (np.getbufsize()): a cast reduction adds this many at a time
_LEAF = 128  # numpy's pairwise summation: runs up to this long are added in 8 interleaved partial sums
ALPHAS = np.array(MSE_GRID, np.float64)  # the shrink factors, a constant of the compiled code
CANDIDATES = len(MSE_GRID)  # the shrink factors the vector code keeps in registers at once
# float32 lanes of one vector register: with 16 on AVX2 (two registers each) the factors' sums did not fit in its
# sixteen registers and went through memory every step (1.5 against 1.1 ns a value here)
LANES = 16 if "+avx512f" in get_host_cpu_features().flatten() else 8
_LANE_SUM_DEPTH = LANES.bit_length() - 1  # the additions that combine one factor's LANES partial sums


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


@njit(nogil=True, cache=True, fastmath=EXACT, error_model="numpy")  # numpy's: no zero test per division
def _candidates(low, high, alphas, lo, hi, symmetric, bfloat16_scales, scales, reciprocals, zero_points) -> None:
    """Each shrink factor's scale, its float32 reciprocal and zero point ([factor, group]) for the groups'
    ranges `low`, `high` (float32): the factor times the range in float64, stored as float32, as
    weights._mse_params computes it; one loop over the groups per factor, so it runs in vector lanes."""
    for k in range(alphas.shape[0]):
        alpha = alphas[k]
        for g in range(low.shape[0]):
            s, z = scale_zero_point(np.float32(np.float64(low[g]) * alpha), np.float32(np.float64(high[g]) * alpha),
                                    lo, hi, symmetric, bfloat16_scales)
            scales[k, g], zero_points[k, g], reciprocals[k, g] = s, z, np.float32(1.0) / s  # s from a register


def _lane_estimates(shared_bounds: bool):
    """`lane_estimates`' typing and code (below), for a numba intrinsic."""
    def typing(typingctx, values, start, whole, reciprocals, zero_points, g, lo, hi, estimates):
        return _typed_estimates(values, start, whole, reciprocals, zero_points, g, lo, hi, estimates, shared_bounds)
    return typing


def _typed_estimates(values, start, whole, reciprocals, zero_points, g, lo, hi, estimates, shared_bounds):
    """Every shrink factor k's error estimate for group g over values[start:start + whole] (`whole` a multiple
    of LANES), in units of its scale squared, into estimates[k, g]: each value's quotient taken as y = v ·
    reciprocals[k, g] (a multiplication: the division was the search's slowest operation), rounded half to
    even and clipped to [lo − z, hi − z] (z = zero_points[k, g]: the same integers as adding z, clipping to
    [lo, hi] and taking z away, all exact), and (x − y)², the error over s², added by a fused multiply-add to
    one of LANES float32 partial sums per factor; the partial sums are then added pairwise. Six operations a
    value and factor. Every factor's sums stay in registers while each run of LANES values is loaded once. LLVM
    vector code, because numba vectorizes a loop over one group's values only with its sum reassociated, and
    such a short loop's reduction cost more than its arithmetic (about 190 ns a group of 128). `shared_bounds`
    (symmetric: every z is 0) clips every factor to the same [lo, hi], which holds two registers, not 2 × 11."""
    if not (all(isinstance(a, types.Array) and a.dtype == types.float32 and a.layout == "C"
                for a in (values, reciprocals, zero_points, estimates))
            and lo == types.float32 and hi == types.float32 and all(i == types.int64 for i in (start, whole, g))):
        return None  # the code below is written for these types only: anything else fails to type, not to run

    def codegen(context, builder, signature, args):
        f32, i32, i64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
        vector = ir.VectorType(f32, LANES)
        undefined = ir.Constant(vector, ir.Undefined)
        arrays = [context.make_array(signature.args[i])(context, builder, args[i]) for i in (3, 4, 8)]
        groups = cgutils.unpack_tuple(builder, arrays[0].shape)[1]

        def splat(x):
            one = builder.insert_element(undefined, x, ir.Constant(i32, 0))
            return builder.shuffle_vector(one, undefined, ir.Constant(ir.VectorType(i32, LANES), [0] * LANES))

        def at(array, k):
            return builder.gep(array.data, [builder.add(builder.mul(ir.Constant(i64, k), groups), args[5])])

        r, z = ([builder.load(at(array, k)) for k in range(CANDIDATES)] for array in arrays[:2])
        r = [splat(x) for x in r]
        low, high = (([splat(bound)] * CANDIDATES if shared_bounds else [splat(builder.fsub(bound, zk)) for zk in z])
                     for bound in (args[6], args[7]))
        rint = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vector, [vector]),
                                              f"llvm.rint.v{LANES}f32")
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vector, [vector] * 3),
                                             f"llvm.fma.v{LANES}f32")
        first = builder.gep(context.make_array(signature.args[0])(context, builder, args[0]).data, [args[1]])
        entry = builder.block
        head, body, done = (builder.append_basic_block(f"estimates.{name}") for name in ("head", "body", "done"))
        builder.branch(head)
        builder.position_at_end(head)
        offset = builder.phi(i64)
        offset.add_incoming(ir.Constant(i64, 0), entry)
        sums = [builder.phi(vector) for _ in range(CANDIDATES)]
        for total in sums:
            total.add_incoming(ir.Constant(vector, [0.0] * LANES), entry)
        builder.cbranch(builder.icmp_signed("<", offset, args[2]), body, done)
        builder.position_at_end(body)
        v = builder.load(builder.bitcast(builder.gep(first, [offset]), vector.as_pointer()), align=4)
        for k, total in enumerate(sums):
            y = builder.fmul(v, r[k])
            x = builder.call(rint, [y])
            x = builder.select(builder.fcmp_ordered("<", x, low[k]), low[k], x)
            x = builder.select(builder.fcmp_ordered(">", x, high[k]), high[k], x)
            t = builder.fsub(x, y)
            total.add_incoming(builder.call(fma, [t, t, total]), body)
        offset.add_incoming(builder.add(offset, ir.Constant(i64, LANES)), body)
        builder.branch(head)
        builder.position_at_end(done)
        for k, total in enumerate(sums):
            width, partial = LANES, total
            while width > 1:
                width //= 2
                halves = [builder.shuffle_vector(partial, partial, ir.Constant(ir.VectorType(i32, width),
                                                                              list(range(begin, begin + width))))
                          for begin in (0, width)]
                partial = builder.fadd(*halves)
            builder.store(builder.extract_element(partial, ir.Constant(i32, 0)), at(arrays[2], k))
        return context.get_dummy_value()
    return types.void(values, start, whole, reciprocals, zero_points, g, lo, hi, estimates), codegen


# compiled code only
lane_estimates: Any = intrinsic(_lane_estimates(shared_bounds=False))
symmetric_lane_estimates: Any = intrinsic(_lane_estimates(shared_bounds=True))


@njit(nogil=True, cache=True, fastmath=EXACT)
def row_estimates(values, group, reciprocals, zero_points, lo, hi, symmetric, estimates) -> None:
    """Every factor's error estimate for every group of a row of values (float32), in units of its scale
    squared, into estimates[factor, group]: runs of LANES by the vector code (`lane_estimates`), the rest one
    value at a time by the same operations (a square rounded before it is added: within the same bound)."""
    whole = group - group % LANES
    for g in range(values.shape[0] // group):
        start = g * group
        if symmetric:  # every zero point 0
            symmetric_lane_estimates(values, start, whole, reciprocals, zero_points, g, lo, hi, estimates)
        else:
            lane_estimates(values, start, whole, reciprocals, zero_points, g, lo, hi, estimates)
        for k in range(estimates.shape[0] if whole < group else 0):
            r, z = reciprocals[k, g], zero_points[k, g]
            total = estimates[k, g]
            for i in range(start + whole, start + group):
                y = values[i] * r
                t = min(max(np.rint(y), lo - z), hi - z) - y
                total += t * t
            estimates[k, g] = total


@njit(nogil=True, cache=True, error_model="numpy", inline="always")  # no fast-math flags (module docstring)
def error_bounds(estimate, scale, zero_point, lo, hi, n, peak) -> tuple:
    """Where numpy's error E of a group of n values (largest magnitude `peak`) lies, given `row_estimates`'
    estimate S = Σ t² (t = x − v·(1/s), float32) for one scale s. With u = 2⁻²⁴, M = max(|lo − z|, |hi − z|)
    (the largest |x − z| left unclipped) and V = peak / s, compare √E = ‖d‖ (numpy's float32 errors d) with
    ‖s·t‖ = s·√S, value by value in magnitude:
    - the same integer: numpy's dequantization rounds twice (u·M·s + u·|d|) and y = v·(1/s) is within 2u·V of
      v / s: ||d| − |s·t|| ≤ u·s·(2V + M) + 2u·|d|;
    - the other neighbour of a half-integer (v·(1/s) and numpy's v / s, both within 3u·|v / s| of the true
      quotient, fell on either side of it; both unclipped, so |v / s| ≤ M + ½): both magnitudes are within
      u·s·(8M + 4) + u·s·(M + 1) of s/2, so ||d| − |s·t|| ≤ u·s·(9M + 5).
    So ‖d‖ and s·‖t‖ are within w = √n·u·s·(12M + 3V + 8) (the two cases' sum, rounded up) plus 2u·‖d‖ of each
    other (the triangle inequality). S's float32 sum is within (depth·u)·Σ of the exact one (a term passes at
    most depth = ⌊n / LANES⌋ + log2(LANES) + n mod LANES additions, a fused square exact before them), numpy's
    squares and float64 sum within u and n·2⁻⁵³: all inside ρ = 2·(depth + 4)·u + n·2⁻⁵². So
    √E ∈ [s·√S·(1 − ρ) − w, s·√S·(1 + ρ) + w], squared here. A scale outside [2⁻⁶⁰, 2⁶⁰] (whose reciprocal the
    quotient bound needs normal), or an S or peak that is not finite: (−∞, ∞)."""
    if not bounded(estimate, scale, peak):
        return -np.inf, np.inf
    relative, width = slack(n), quotient_width(scale, zero_point, lo, hi, n, peak)
    root = np.float64(scale) * np.sqrt(np.float64(estimate))
    return max(root * (1.0 - relative) - width, 0.0) ** 2, (root * (1.0 + relative) + width) ** 2


@njit(nogil=True, cache=True, error_model="numpy", inline="always")
def bounded(estimate, scale, peak) -> bool:
    """Whether `error_bounds` bounds an estimate: S and the peak finite, the scale within [2⁻⁶⁰, 2⁶⁰]."""
    s = np.float64(scale)  # `&`, not `and`: no branches, so the callers' loops stay vector code
    return (estimate < np.inf) & (peak < np.inf) & (s >= 2.0 ** -60) & (s <= 2.0 ** 60)


@njit(nogil=True, cache=True, inline="always")
def slack(n) -> float:
    """`error_bounds`' ρ for a group of n values: the float32 and float64 sums' relative slack."""
    depth = n // LANES + _LANE_SUM_DEPTH + n % LANES
    return 2.0 * (depth + 4) * 2.0 ** -24 + n * 2.0 ** -52


@njit(nogil=True, cache=True, error_model="numpy", inline="always")
def quotient_width(scale, zero_point, lo, hi, n, peak) -> float:
    """`error_bounds`' w = √n·u·s·(12M + 3V + 8), written √n·u·(s·(12M + 8) + 3·peak): no division."""
    s, z = np.float64(scale), np.float64(zero_point)
    unclipped = max(abs(lo - z), abs(hi - z))
    return np.sqrt(np.float64(n)) * 2.0 ** -24 * (s * (12.0 * unclipped + 8.0) + 3.0 * np.float64(peak))


_MARGIN = 1.0 + 2.0 ** -40  # covers the float64 rounding of _possible's squared comparison, which takes no root


@njit(nogil=True, cache=True, error_model="numpy")  # no fast-math flags: NaN and infinity compare as they are
def _possible(estimates, scales, zero_points, low, high, lo, hi, n, least, root_bound, possible, counts) -> None:
    """Which factors could have a group's lowest error (possible[k, g]) and how many (counts[g]; 0 where a
    factor is not `bounded`: every factor is then summed exactly). The factor with the least s²·S bounds the
    lowest error from above (`error_bounds`' upper bound U, its root √U into root_bound[g]); a factor whose
    lower bound is above U cannot be the lowest. That test is taken squared, s²·S·(1 − ρ)² > (√U + w)² (and
    a margin), so a row takes one square root a group, not one a factor and group (they were a tenth of the
    search's time). Loops over the groups per factor, so they run in vector lanes; `least` [group] (float64)
    is scratch."""
    count, groups = estimates.shape
    relative = slack(n)
    least[:] = np.inf
    counts[:] = 0
    for k in range(count):  # the least s²·S, its factor's index kept in counts until the bound is taken
        for g in range(groups):
            s = np.float64(scales[k, g])
            approximate = s * s * np.float64(estimates[k, g])
            counts[g] = k if approximate < least[g] else counts[g]
            least[g] = min(least[g], approximate)
    for g in range(groups):
        k, peak = counts[g], max(abs(low[g]), abs(high[g]))
        width = quotient_width(scales[k, g], zero_points[k, g], lo, hi, n, peak)
        root_bound[g] = np.float64(scales[k, g]) * np.sqrt(np.float64(estimates[k, g])) * (1.0 + relative) + width
        counts[g] = 0
    for k in range(count):
        for g in range(groups):
            s, peak = np.float64(scales[k, g]), max(abs(low[g]), abs(high[g]))
            width = quotient_width(scales[k, g], zero_points[k, g], lo, hi, n, peak)
            above = s * s * np.float64(estimates[k, g]) * (1.0 - relative) ** 2 > (root_bound[g] + width) ** 2 * _MARGIN
            possible[k, g] = not above
            counts[g] += 1 if possible[k, g] else 0
            counts[g] -= 0 if bounded(estimates[k, g], scales[k, g], peak) else count  # below 1 once all are counted
    for g in range(groups):
        counts[g] = max(counts[g], 0)


@njit(nogil=True, cache=True, inline="always")
def _first(possible, g) -> int:
    """The first factor possible for group g."""
    k = 0
    while not possible[k, g]:
        k += 1
    return k


@njit(nogil=True, cache=True)  # no fast-math flags: errors that are infinite or NaN compare as they are
def _chosen(run, scales, zero_points, g, lo, hi, possible, count, squares) -> int:
    """The factor for group g with the lowest error summed as numpy sums it, among the possible ones (every one
    where `count` is 0): the first on a tie, the first if none is below infinity (weights._mse_params's strict
    `<`). `squares` [factors, len(run)] is scratch."""
    best, chosen = np.inf, 0
    for k in range(scales.shape[0]):
        if count and not possible[k, g]:
            continue
        _squared_errors(run, scales[k, g], zero_points[k, g], lo, hi, squares, k)
        error = numpy_order_sum(squares, k)
        if error < best:
            best, chosen = error, k
    return chosen


@njit(nogil=True, cache=True)  # no flags: its callees without their own would take them (module docstring)
def mse_groups(bits, group, lo, hi, symmetric, bfloat16_scales, out, scale, zp) -> tuple:
    """round_kernels.round_groups with the scale and zero point of each group chosen by the mse search over
    the shrink factors weights.MSE_GRID instead of the full range: the same arguments, outputs and returned
    sums (Σ w², Σ (w − dequantized)² of the chosen rounding)."""
    rows, cols = bits.shape
    groups = cols // group
    words = np.empty(cols, np.uint32)
    values = words.view(np.float32)
    low, high = np.empty(groups, np.float32), np.empty(groups, np.float32)
    scales, reciprocals = np.empty((CANDIDATES, groups), np.float32), np.empty((CANDIDATES, groups), np.float32)
    zero_points, estimates = np.empty((CANDIDATES, groups), np.float32), np.empty((CANDIDATES, groups), np.float32)
    possible, counts = np.empty((CANDIDATES, groups), np.bool_), np.empty(groups, np.int64)
    least, root_bound = np.empty(groups), np.empty(groups)
    errors, squares_scratch = np.empty(group, np.float32), np.empty((CANDIDATES, group), np.float32)
    squares = 0.0
    error = 0.0
    for r in range(rows):
        source, target = bits[r], out[r]
        for i in range(cols):
            words[i] = stored_word(source[i])
        squares += sum_of_squares(values)
        for g in range(groups):
            low[g], high[g] = float_range(words[g * group:(g + 1) * group])
        _candidates(low, high, ALPHAS, lo, hi, symmetric, bfloat16_scales, scales, reciprocals, zero_points)
        row_estimates(values, group, reciprocals, zero_points, lo, hi, symmetric, estimates)
        _possible(estimates, scales, zero_points, low, high, lo, hi, group, least, root_bound, possible, counts)
        for g in range(groups):
            run = values[g * group:(g + 1) * group]
            k = _first(possible, g) if counts[g] == 1 else \
                _chosen(run, scales, zero_points, g, lo, hi, possible, counts[g], squares_scratch)
            scale[r, g], zp[r, g] = scales[k, g], zero_points[k, g]
            round_run(run, scale[r, g], zp[r, g], lo, hi, target[g * group:(g + 1) * group], errors)
            error += sum_of_squares(errors)
    return squares, error
