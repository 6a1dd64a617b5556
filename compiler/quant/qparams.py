"""Scale and zero point, with onnxruntime's conventions (quant_utils.compute_scale_zp / quantize_nparray),
and MLAS's for 4-bit blocks (MatMulNBits), so results compare side by side with onnxruntime's tools."""

from __future__ import annotations

import numpy as np

from compiler.ir.types import QType

FP8_MAX = 448  # the largest finite float8_e4m3fn (a whole number, so FP8 has a range like the integers)
FP4_MAX = 6  # the largest e2m1 value (NVFP4, MXFP4)
FP4_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # the e2m1 magnitudes, by their 3-bit index
# |x| above each threshold moves one e2m1 value up; at a tie between two values the even index wins
# (compressed-tensors' alternating <= and <): > for 0.25, 1.25, 2.5 and 5 (ties down), >= for 0.75, 1.75, 3.5 (up)
FP4_STEPS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))
_SYMMETRIC_RANGES = {QType.INT8: (-127, 127)}  # onnxruntime narrows int8 only


def full_range(qtype: QType) -> tuple[int, int]:
    """The whole range of a type (what values are clipped to once rounded): an integer type's from its width and
    sign (a registered plug-in type's too); FP8's finite range (what a static FP8 input's scale maps its calibrated
    range onto). KeyError for the types rounded by their own rules (FP4, MX, the K-quants)."""
    if qtype is QType.FP8:
        return -FP8_MAX, FP8_MAX
    if qtype.is_float or qtype.is_kquant:
        raise KeyError(qtype.name)
    return (-(1 << (qtype.bits - 1)), (1 << (qtype.bits - 1)) - 1) if qtype.signed else (0, (1 << qtype.bits) - 1)


def np_type(qtype: QType) -> type:
    """The numpy type an integer type's values are held in (up to 8 bits: int8 or uint8)."""
    return np.int8 if qtype.signed else np.uint8


def qrange(qtype: QType, symmetric: bool) -> tuple[int, int]:
    """The integer range of a type (narrowed for symmetric int8, as onnxruntime does)."""
    return _SYMMETRIC_RANGES.get(qtype, full_range(qtype)) if symmetric else full_range(qtype)


def scale_zero_point(rmin: np.ndarray, rmax: np.ndarray, qtype: QType, symmetric: bool) -> tuple[np.ndarray, np.ndarray]:
    """onnxruntime's compute_scale_zp, vectorised: 0 in range, float64 scale stored as float32,
    symmetric zero point round((qmin+qmax)/2), a degenerate range gives scale 1 and zero point 0."""
    qmin, qmax = qrange(qtype, symmetric)
    rmin = np.minimum(np.asarray(rmin, np.float64), 0.0)
    rmax = np.maximum(np.asarray(rmax, np.float64), 0.0)
    if symmetric:
        absmax = np.maximum(np.abs(rmin), np.abs(rmax))
        rmin, rmax = -absmax, absmax
    scale = (rmax - rmin) / float(qmax - qmin)
    degenerate = scale < np.finfo(np.float32).tiny
    safe = np.where(degenerate, 1.0, scale)
    if symmetric:
        zp = np.full(scale.shape, np.round((qmin + qmax) / 2.0))
    else:
        zp = np.round(qmin - rmin / safe)
    zp = np.where(degenerate, 0, zp)
    return safe.astype(np.float32), zp.astype(np.int32)


def quantize(x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, qtype: QType, symmetric: bool) -> np.ndarray:
    """onnxruntime's quantize_nparray: float32 division, round half to even, clip to the full type range."""
    lo, hi = full_range(qtype)
    q = np.round(x.astype(np.float32) / scale) + zero_point
    return np.clip(q, lo, hi).astype(np_type(qtype))


def dequantize(q: np.ndarray, scale: np.ndarray, zero_point: np.ndarray) -> np.ndarray:
    """(q − zero point) × scale, float32."""
    return ((q.astype(np.float32) - zero_point) * scale).astype(np.float32)


def mlas_int4(rmin: np.ndarray, rmax: np.ndarray, signed_max: np.ndarray, symmetric: bool):
    """MLAS's 4-bit block parameters in the unsigned domain [0, 15]: symmetric blocks map the value of
    largest magnitude to -8 (scale = that value / -8, zero point 8; the scale may be negative);
    asymmetric ones use min/max with 0 included over 15 steps, the zero point rounded as C's roundf."""
    if symmetric:
        scale = (np.asarray(signed_max, np.float32) / np.float32(-8.0)).astype(np.float32)
        return scale, np.full(scale.shape, 8, np.int32)
    mn = np.minimum(np.asarray(rmin, np.float32), 0.0)
    mx = np.maximum(np.asarray(rmax, np.float32), 0.0)
    scale = ((mx - mn) / np.float32(15.0)).astype(np.float32)
    safe = np.where(scale == 0, np.float32(1.0), scale)
    zp = np.clip(round_half_away(-mn / safe), 0, 15).astype(np.int32)
    return scale, zp


def round_half_away(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """C's roundf (halves away from zero, which MLAS uses) exactly, for values that are then clipped at 0 or
    above: floor, plus one where the fraction is at least a half (floor(x + 0.5) would round 0.49999997 up).
    `out` (float, x's shape; may be x itself) receives the result instead of a new array."""
    whole = np.floor(x)
    fraction = np.subtract(x, whole, out=out)
    np.greater_equal(fraction, 0.5, out=fraction)
    fraction += whole
    return fraction


def torch_scale_zero_point(rmin: np.ndarray, rmax: np.ndarray, qtype: QType, symmetric: bool,
                           scale_dtype=np.float32) -> tuple[np.ndarray, np.ndarray]:
    """compressed-tensors' calculate_qparams (the torch backend's convention, what vLLM and transformers
    read): 0 in range; symmetric scale = absmax / (range / 2) with zero point 0 and the full signed range
    (int4 [-8, 7], int8 [-128, 127]); asymmetric scale = (max - min) / range, zero point
    clip(round(qmin - min / scale)). The scale is rounded to the dtype it is stored in, then used as
    stored; an all-zero range gets the smallest normal scale (its values quantize to the zero point)."""
    qmin, qmax = full_range(qtype)
    rmin = np.minimum(np.asarray(rmin, np.float32), 0.0)
    rmax = np.maximum(np.asarray(rmax, np.float32), 0.0)
    if symmetric:
        scale = np.maximum(np.abs(rmin), np.abs(rmax)) / np.float32((qmax - qmin) / 2)
    else:
        scale = (rmax - rmin) / np.float32(qmax - qmin)
    scale = np.asarray(scale, np.float32)
    scale = np.where(scale > 0, scale, np.finfo(np.float32).tiny)
    scale = _round_to(scale, scale_dtype)
    if symmetric:
        return scale, np.zeros(scale.shape, np.int32)
    zp = np.clip(np.round(qmin - rmin / scale), qmin, qmax)
    return scale, zp.astype(np.int32)


def stored_signed(values: np.ndarray, dtype) -> np.ndarray:
    """Scales of either sign as float32, rounded to the dtype they are stored in as _round_to rounds their
    magnitudes (rounding to a float type is symmetric in the sign), the sign kept."""
    values = np.asarray(values, np.float32)
    return np.where(values < 0, np.float32(-1), np.float32(1)) * _round_to(np.abs(values), dtype)


def _round_to(values: np.ndarray, dtype) -> np.ndarray:
    """float32 values rounded to a storage dtype (float16 or bfloat16 via torch) and back, kept positive."""
    if dtype in (np.float32, "float32"):
        return values
    import torch

    stored = torch.from_numpy(values).to(getattr(torch, str(dtype))).float().numpy()
    return np.where(stored > 0, stored, np.float32(torch.finfo(getattr(torch, str(dtype))).tiny)).astype(np.float32)
