"""The floating formats' rounding of a weight compiled by numba: FP8 (e4m3) per channel or in 2-D blocks,
NVFP4 and MXFP4 (e2m1 in groups along a row), each scale, the stored codes and the squared error of what
compressed-tensors' decompressor gives back, from the weight's float bits.

Why our own loop: compressed-tensors' functions are a dozen whole-array passes each (ranges, scales, a
division, a clamp, a cast, a pack, then unpacking and dequantizing again for the error), 7–13 ns a weight
on two cores, 2.6–7× the time of only reading and writing a checkpoint. These take 1.0–1.1 ns a weight on
one core.

The bits are compressed-tensors' (0.20) to the last one; tests/test_float_kernels.py compares every stored
tensor with its own functions (float_formats.quantize_float with `kernel=False`). What that takes:
- FP8: scale = absmax / 448 in float32, a zero scale made float32's eps, then rounded to the stored dtype
  (the model's); values v / scale (no zero point is added: -0 stays -0), clamped to ±448, cast round to
  nearest even (torch's e4m3fn conversion, subnormals included).
- NVFP4: scale = global · (absmax / 6) rounded to e4m3 (0 → 0.125), values divided by scale / global
  (no zero point added: -0 stays), clamped to ±6 and rounded to e2m1 (its thresholds' tie directions),
  packed two to a byte, the first in the low nibble, sign bit set for values below 0.
- MXFP4: absmax rounded to a power of two (a carry at e2m1's mantissa width), exponent − 2 as the e8m0
  scale (clamped at 0), values divided by 2^(e − 127).
The error is taken against what decompression returns: FP8 codes times the stored scale in the scale's
dtype; FP4 values times the divisor, rounded to bfloat16 (its unpacking's dtype).

No fast-math in the rounding: IEEE per value, signed zeros kept (a -0 weight's code has its sign). At a
scale that is zero, infinite or NaN after rounding (a non-finite weight, or ranges beneath bfloat16's
subnormals) the loop stops and says so; the caller hands that weight to compressed-tensors, which then
decides (a non-finite weight's Σ w² is what Q409 refuses)."""

from __future__ import annotations

from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from compiler.quant.round_kernels import SUMS as _SUMS
from compiler.quant.round_kernels import bits_of, float_of, stored_word, sum_of_squares, to_bfloat16

_E4M3_MAX = np.float32(448.0)
_E4M3_MAX_BITS = np.uint32(0x43E00000)  # 448.0
_E4M3_MIN_NORMAL_BITS = np.uint32(0x3C800000)  # 2^-6
_E4M3_BIAS_SHIFT = np.uint32((127 - 7) << 3)  # float32's exponent bias against e4m3's, with 3 mantissa bits
_FLOAT32_EPS = np.float32(np.finfo(np.float32).eps)  # FP8's zero scale (its scale dtype unset: float32's eps)
_NVFP4_ZERO_SCALE, _NVFP4_ZERO_CODE = np.float32(0.125), np.uint8(0x20)  # e4m3's eps, and its code
_E2M1_MAX = np.float32(6.0)
_T0, _T1, _T2, _T3, _T4, _T5, _T6 = (np.float32(t) for t in (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0))  # e2m1's steps
_INF = np.float32(np.inf)


@njit(nogil=True, cache=True)
def _e4m3(x: np.float32) -> tuple:
    """A float32 no larger than 448 in magnitude (or larger: clamped) to float8_e4m3fn, nearest even: its
    code and its value as float32, sign kept. Both roundings are taken and one selected, without branches,
    so that the loops calling it vectorize."""
    b = bits_of(x)
    sign = b & np.uint32(0x80000000)
    a = min(b & np.uint32(0x7FFFFFFF), _E4M3_MAX_BITS)  # 448 rounds to itself
    steps = np.rint(float_of(a) * np.float32(512.0))  # subnormal: multiples of 2^-9, the scaling exact
    rounded = (a + np.uint32(0x7FFFF) + ((a >> np.uint32(20)) & np.uint32(1))) & np.uint32(0xFFF00000)  # normal
    subnormal = a < _E4M3_MIN_NORMAL_BITS
    code = np.uint32(steps) if subnormal else (rounded >> np.uint32(20)) - _E4M3_BIAS_SHIFT
    magnitude = steps * np.float32(1.0 / 512.0) if subnormal else float_of(rounded)
    return np.uint8(code | (sign >> np.uint32(24))), float_of(bits_of(magnitude) | sign)


@njit(nogil=True, cache=True)
def _magnitude(word: np.uint32) -> np.uint32:
    return word & np.uint32(0x7FFFFFFF)


def _group_peak(typingctx, row, start, width):
    """`peak` of row[start:start + width] (a C-contiguous uint16 or uint32 row; `width` a literal): the
    run's words loaded as one vector, moved to float32's bits, the sign masked off, and the largest taken by
    one vector reduction. Written as LLVM vector code because LLVM vectorized `peak`'s loop, unrolled into
    a row's loop over groups, across the groups, gathering a word of each group at a time (0.48 against 0.21
    ns a weight for NVFP4's groups of 16)."""
    if not (isinstance(row, types.Array) and row.ndim == 1 and row.layout == "C"
            and row.dtype in (types.uint16, types.uint32) and isinstance(width, types.IntegerLiteral)):
        return None  # anything else fails to type, not to run
    count, wide = width.literal_value, row.dtype == types.uint32

    def codegen(context, builder, signature, args):
        array = context.make_array(signature.args[0])(context, builder, args[0])
        lanes = ir.VectorType(ir.IntType(32), count)
        stored = ir.VectorType(ir.IntType(32 if wide else 16), count)
        words = builder.load(builder.bitcast(builder.gep(array.data, [args[1]]), stored.as_pointer()), align=2)
        if not wide:  # a bfloat16's bits are float32's top half (stored_word)
            words = builder.shl(builder.zext(words, lanes), ir.Constant(lanes, [16] * count))
        magnitudes = builder.and_(words, ir.Constant(lanes, [0x7FFFFFFF] * count))
        largest = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(32), [lanes]),
                                                 f"llvm.vector.reduce.umax.v{count}i32")
        return builder.call(largest, [magnitudes])
    return types.uint32(row, start, width), codegen


group_peak: Any = intrinsic(_group_peak)  # compiled code only


@njit(nogil=True, cache=True, fastmath=_SUMS)
def _squares(row) -> float:
    """Σ v² of a row given as float bits (summed in float32 lanes, then float64: the SQNR's last digits)."""
    total = np.float32(0.0)
    for c in range(row.shape[0]):
        v = float_of(stored_word(row[c]))
        total += v * v
    return np.float64(total)


def magnitude_value(peak: int) -> float:
    """The float32 magnitude whose bits `peak` gives (as `peak` returns them)."""
    return float(np.uint32(peak).view(np.float32))


@njit(nogil=True, cache=True)
def peak(run) -> np.uint32:
    """The largest magnitude's bits among a run of float bits, as an unsigned integer (ordered like the
    magnitudes; a NaN's bits above infinity's)."""
    peak = np.uint32(0)
    for c in range(run.shape[0]):
        peak = max(peak, _magnitude(stored_word(run[c])))
    return peak


@njit(nogil=True, cache=True, inline="always")  # into each loop below: per value, no call
def _fp8_value(v, s, bfloat16_scales) -> tuple:
    """A value over its scale `s` cast to e4m3: its code, and its error against the code dequantized in the
    scale's dtype (both products taken, one kept: a select, not a branch in the loop)."""
    code, q = _e4m3(v / s)
    d = q * s
    rounded = to_bfloat16(d)
    return code, v - (rounded if bfloat16_scales else d)


@njit(nogil=True, cache=True)
def _fp8_scale(peak, bfloat16_scales) -> np.float32:
    """An FP8 scale from its range's largest magnitude (as bits): absmax / 448, 0 made float32's eps, rounded
    to bfloat16 where stored so; zero, infinite or NaN where the loop cannot round with it."""
    s = float_of(peak) / _E4M3_MAX
    s = s if s != 0 else _FLOAT32_EPS
    return to_bfloat16(s) if bfloat16_scales else s


@njit(nogil=True, cache=True)
def _fp8_channels(bits, bfloat16_scales, codes, scales) -> tuple:
    """round_fp8 per channel: a scale per row, each row one flat loop (the form LLVM vectorizes)."""
    rows, cols = bits.shape
    errors = np.empty(cols, np.float32)
    squares, error = 0.0, 0.0
    for r in range(rows):
        row, out = bits[r], codes[r]
        s = _fp8_scale(peak(row), bfloat16_scales)
        if not (s > 0 and s < _INF):
            return 0.0, 0.0, 1
        scales[r, 0] = s
        for c in range(cols):
            out[c], errors[c] = _fp8_value(float_of(stored_word(row[c])), s, bfloat16_scales)
        squares += _squares(row)
        error += sum_of_squares(errors)
    return squares, error, 0


def _fp8_tiles(group: int):
    """round_fp8 in tiles, compiled for one tile width, which it knows as a constant (as _fp4_rows)."""

    @njit(nogil=True, cache=True)
    def rows_of_tiles(bits, band, bfloat16_scales, codes, scales) -> tuple:
        rows, cols = bits.shape
        groups = -(-cols // group)
        peaks = np.empty(groups, np.uint32)
        errors = np.empty(cols, np.float32)
        squares, error = 0.0, 0.0
        for first in range(0, rows, band):
            last = min(first + band, rows)
            peaks[:] = 0
            for r in range(first, last):
                row = bits[r]
                for g in range(groups):
                    start, most = g * group, peaks[g]
                    for i in range(min(group, cols - start)):
                        most = max(most, _magnitude(stored_word(row[start + i])))
                    peaks[g] = most
            for g in range(groups):
                s = _fp8_scale(peaks[g], bfloat16_scales)
                if not (s > 0 and s < _INF):
                    return 0.0, 0.0, 1
                scales[first // band, g] = s
            for r in range(first, last):
                row, out = bits[r], codes[r]
                for g in range(groups):
                    start, s = g * group, scales[first // band, g]
                    for i in range(min(group, cols - start)):
                        c = start + i
                        out[c], errors[c] = _fp8_value(float_of(stored_word(row[c])), s, bfloat16_scales)
                squares += _squares(row)
                error += sum_of_squares(errors)
        return squares, error, 0

    return rows_of_tiles


_FP8_TILES = {128: _fp8_tiles(128)}  # FP8_BLOCK's tiles; another width is compiled when first asked for


def round_fp8(bits, band, group, bfloat16_scales, codes, scales) -> tuple:
    """compressed-tensors' FP8 of an [out, in] weight given as its float bits (uint16 bfloat16, uint32
    float32): a scale per tile of `band` rows × `group` columns (per channel: 1 × in;
    FP8_BLOCK: 128 × 128, the edges' tiles smaller), into `scales` (float32, rounded to bfloat16 if
    `bfloat16_scales`); the e4m3 codes into `codes` (uint8 [out, in]). Returns (Σ w², Σ (w − dequantized)²,
    1 where it stopped at a scale it cannot round, else 0: when 1, nothing else is valid)."""
    if band == 1 and group >= bits.shape[1]:
        return _fp8_channels(bits, bfloat16_scales, codes, scales)
    if group not in _FP8_TILES:
        _FP8_TILES[group] = _fp8_tiles(group)
    return _FP8_TILES[group](bits, band, bfloat16_scales, codes, scales)


@njit(nogil=True, cache=True)
def _group_scale(peak, global_scale) -> tuple:
    """A group's stored scale (NVFP4: its e4m3 code; MXFP4: its e8m0 exponent) and the divisor of its
    values, from the group's absmax; NVFP4 when `global_scale` > 0."""
    absmax = float_of(peak)
    if global_scale > 0:
        code, s = _e4m3(global_scale * (absmax / _E2M1_MAX))
        if s == 0:
            code, s = _NVFP4_ZERO_CODE, _NVFP4_ZERO_SCALE
        return code, s / global_scale
    power = (peak + np.uint32(0x200000)) >> np.uint32(23)  # rounded up past 1.75 × 2^e: e2m1's mantissa carry
    exponent = np.int64(power) - 2 if power < 255 else np.int64(255)
    exponent = max(exponent, np.int64(0))
    divisor = float_of(np.uint32(exponent) << np.uint32(23)) if exponent > 0 else float_of(np.uint32(0x00400000))
    return np.uint8(exponent), divisor


@njit(nogil=True, cache=True, inline="always")
def _step(passed: bool) -> np.float32:
    """1 where a threshold is passed, else 0, as float32."""
    return np.float32(1.0) if passed else np.float32(0.0)


@njit(nogil=True, cache=True, inline="always")  # into each group size's loop, where `group` is a constant
def _fp4_group(row, start, group, divisor, codes, errors) -> None:
    """One group: each value over `divisor`, clamped to ±6 and rounded to e2m1 (ties as compressed-tensors'
    thresholds break them: > at 0.25, 1.25, 2.5, 5; >= at 0.75, 1.75, 3.5), its 4-bit code into `codes`
    (sign bit for values below 0: -0 has none); the error against it dequantized in bfloat16 into `errors`."""
    for i in range(group):
        c = start + i
        v = float_of(stored_word(row[c]))
        x = min(max(v / divisor, -_E2M1_MAX), _E2M1_MAX)
        m = abs(x)
        # the index summed in float32 lanes, as the values are: integer sums are int64 in numba, which took the
        # loop to 64-bit lanes (1.25 against 0.81 ns a weight)
        index = (_step(m > _T0) + _step(m >= _T1) + _step(m > _T2) + _step(m >= _T3) + _step(m > _T4)
                 + _step(m >= _T5) + _step(m > _T6))
        negative = x < 0
        codes[c] = np.uint8(np.int32(index) | (np.int32(8) if negative else np.int32(0)))
        half = index * np.float32(0.5)  # e2m1's values: index / 2 up to 2, then 3, 4, 6
        q = half if index <= np.float32(4.0) else (half + half - np.float32(2.0) if index < np.float32(7.0) else _E2M1_MAX)
        errors[c] = v - to_bfloat16((-q if negative else q) * divisor)


# `rounding mse`'s candidates for a group's scale, as steps from the one round to nearest takes from its range:
# NVFP4's e4m3 codes (a code is 1/8 to 1/16 of the scale; on the real SmolLM2-135M's Linears the least squared
# error fell on -2 to +2 for all but 0.05% of the groups), MXFP4's powers of two
_NVFP4_STEPS = np.array([-2, -1, 1, 2], np.int64)
_MXFP4_STEPS = np.array([-1, 1], np.int64)
_E4M3_CODES = 126  # the largest finite positive code (448); 127 is NaN


@njit(nogil=True, cache=True)
def _scale_of(code: np.int64, global_scale) -> tuple:
    """A candidate scale's stored code and its values' divisor (NVFP4 under `global_scale` > 0: e4m3 `code`
    over it; MXFP4: 2^(code − 127)); divisor 0 where the code is not a finite positive scale."""
    if global_scale > 0:
        if code < 1 or code > _E4M3_CODES:
            return np.uint8(0), np.float32(0.0)
        exponent, mantissa = code >> 3, code & 7
        value = (np.float32(mantissa) * np.float32(2.0 ** -9) if exponent == 0
                 else np.float32(1.0 + mantissa / 8.0) * np.float32(2.0) ** np.float32(exponent - 7))
        return np.uint8(code), value / global_scale
    if code < 1 or code > 254:
        return np.uint8(0), np.float32(0.0)
    return np.uint8(code), float_of(np.uint32(code) << np.uint32(23))


@njit(nogil=True, cache=True, inline="always")
def _group_error(errors, importance, start, group) -> float:
    """A group's squared error, each column's weighted by its importance."""
    total = 0.0
    for i in range(group):
        total += float(importance[start + i]) * float(errors[start + i]) * float(errors[start + i])
    return total


def _fp4_rows(group: int, search: bool = False):
    """round_fp4's loop compiled for one group size, which it knows as a constant: with the group's length
    known only at run time its per-group loops did not vectorize (about 5 ns a weight against 1.5). `search`
    (`rounding mse`, `rounding imatrix`): each group also rounded with the scales next to its own
    (_NVFP4_STEPS, _MXFP4_STEPS), and the one with the least squared error, each column's weighted by its
    `importance` (float32 [in]), kept."""

    @njit(nogil=True, cache=True)
    def rows_of_groups(bits, global_scale, packed, scales, importance) -> tuple:
        rows, cols = bits.shape
        groups = cols // group
        peaks = np.empty(groups, np.uint32)
        divisors = np.empty(groups, np.float32)
        codes = np.empty(cols, np.uint8)
        errors = np.empty(cols, np.float32)
        trial_codes = np.empty(cols, np.uint8)
        trial_errors = np.empty(cols, np.float32)
        steps = _NVFP4_STEPS if global_scale > 0 else _MXFP4_STEPS
        squares, error = 0.0, 0.0
        for r in range(rows):
            row = bits[r]
            for g in range(groups):  # three passes over a row: its groups' ranges, their scales, their values
                peaks[g] = group_peak(row, g * group, group)
            for g in range(groups):
                code, divisors[g] = _group_scale(peaks[g], global_scale)
                scales[r, g] = code
            if peaks.max() >= np.uint32(0x7F800000) or not divisors.max() < _INF:  # a non-finite value or scale
                return 0.0, 0.0, 1
            for g in range(groups):
                _fp4_group(row, g * group, group, divisors[g], codes, errors)
            if search:
                for g in range(groups):
                    if peaks[g] == 0:  # a group of zeros: every scale rounds it exactly
                        continue
                    start, own = g * group, np.int64(scales[r, g])
                    best = _group_error(errors, importance, start, group)
                    for step in steps:
                        code, divisor = _scale_of(own + step, global_scale)
                        if divisor == 0:
                            continue
                        _fp4_group(row, start, group, divisor, trial_codes, trial_errors)
                        trial = _group_error(trial_errors, importance, start, group)
                        if trial < best:
                            best = trial
                            scales[r, g] = code
                            for i in range(group):
                                codes[start + i], errors[start + i] = trial_codes[start + i], trial_errors[start + i]
            for k in range(cols // 2):
                packed[r, k] = codes[2 * k] | (codes[2 * k + 1] << np.uint8(4))
            squares += _squares(row)
            error += sum_of_squares(errors)
        return squares, error, 0

    return rows_of_groups


_FP4_ROWS = {16: _fp4_rows(16), 32: _fp4_rows(32)}  # NVFP4's and MXFP4's groups
_FP4_SEARCHED = {16: _fp4_rows(16, True), 32: _fp4_rows(32, True)}
_NO_IMPORTANCE = np.ones(1, np.float32)  # what the loop without a search is handed (it reads none)


def round_fp4(bits, group, global_scale, packed, scales, importance=None) -> tuple:
    """compressed-tensors' NVFP4 (`global_scale` > 0, float32; `group` 16) or MXFP4 (`global_scale` 0;
    `group` 32) of an [out, in] weight given as its float bits (as round_fp8): each group's scale code into
    `scales` (uint8 [out, in / group]: e4m3 codes for NVFP4, e8m0 exponents for MXFP4), the e2m1 codes two
    to a byte into `packed` (uint8 [out, in / 2]). `importance` (float32 [in]; ones for `rounding mse`): each
    group's scale the one of least squared error so weighted among its own and its neighbours; None: its own.
    Returns as round_fp8."""
    if importance is None:
        return _FP4_ROWS[group](bits, global_scale, packed, scales, _NO_IMPORTANCE)
    return _FP4_SEARCHED[group](bits, global_scale, packed, scales, importance)
