"""Weight quantization for one tensor: per-tensor, per-channel or blocks along the input axis; rtn or an
mse clipping search (a shrink factor per channel/block, vectorised over all of them at once)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from compiler.ir.types import Granularity, QType, Rounding, WeightQuant
from compiler.quant import qparams

MSE_GRID = tuple(np.round(np.linspace(1.0, 0.5, 11), 2))  # shrink factors of the range, 1.0 first


class Convention(enum.Enum):
    """Whose scale/zero-point rules: onnxruntime's and MLAS's (ONNX backend), or compressed-tensors'
    (torch backend: positive scales, symmetric zero point 0, signed values in the full range)."""

    ORT = "ort"
    TORCH = "torch"


@dataclass(frozen=True)
class QuantizedWeight:
    """`q` has the layout of the original weight ([K, N] for an ONNX MatMul); `scale`/`zero_point` have
    the layout of a DequantizeLinear with `axis` and `block_size` (None: per-tensor or per-channel)."""

    q: np.ndarray
    scale: np.ndarray
    zero_point: np.ndarray
    qtype: QType
    axis: int | None  # None: per-tensor
    block_size: int | None

    def dequantize(self) -> np.ndarray:
        """The weight back in float (as the runtime computes with it)."""
        scale, zp = self.scale, self.zero_point.astype(np.float32)
        if self.block_size and self.axis is not None and self.q.shape[self.axis] % self.block_size == 0:
            return self._dequantize_blocks(scale, zp)
        if self.block_size:
            scale = np.repeat(scale, self.block_size, axis=self.axis)
            zp = np.repeat(zp, self.block_size, axis=self.axis)
        elif self.axis is not None:
            shape = [1] * self.q.ndim
            shape[self.axis] = -1
            scale, zp = scale.reshape(shape), zp.reshape(shape)
        return ((self.q.astype(np.float32) - zp) * scale).astype(np.float32)

    def _dequantize_blocks(self, scale: np.ndarray, zp: np.ndarray) -> np.ndarray:
        """Whole blocks: each block's scale broadcast over it (the same float32 arithmetic as repeating the
        scales, without materialising them)."""
        axis, size = self.axis, self.block_size
        assert axis is not None and size is not None  # blocks run along an axis
        shape = self.q.shape
        blocks = shape[:axis] + (shape[axis] // size, size) + shape[axis + 1:]
        q = self.q.reshape(blocks).astype(np.float32)
        q -= np.expand_dims(zp, axis + 1)
        q *= np.expand_dims(scale, axis + 1)
        return q.reshape(shape)


def sqnr_db(w: np.ndarray, qw: QuantizedWeight, channel_axis: int, slice_bytes: int = 16 << 20) -> float:
    """Signal to quantization noise of a weight, 10·log10(‖W‖² / ‖W − Q(W)‖²) in dB, computed a slice
    of output channels at a time so the scratch is a slice's (inf when the rounding is exact)."""
    channels = w.shape[channel_axis]
    step = max(1, slice_bytes // max(1, w.nbytes // max(channels, 1)))
    signal = noise = 0.0
    for first in range(0, channels, step):
        rows = slice(first, min(first + step, channels))
        q, scale, zero_point = (_channels(a, rows, w.ndim, channels, channel_axis) for a in (qw.q, qw.scale, qw.zero_point))
        original = np.asarray(_channels(w, rows, w.ndim, channels, channel_axis), np.float32)
        error = QuantizedWeight(q, scale, zero_point, qw.qtype, qw.axis, qw.block_size).dequantize()
        np.subtract(original, error, out=error)  # float32 error, in the dequantized copy
        signal += _sum_of_squares(original)
        noise += _sum_of_squares(error)
    if noise == 0:
        return float("inf")
    return 10 * float(np.log10(max(signal, 1e-300) / noise))


_SQUARES_BLOCK = 1 << 18  # elements converted to float64 at a time (2 MiB): cache-sized, unlike a float64 copy of a weight


def _sum_of_squares(a: np.ndarray) -> float:
    """Σ a² accumulated in float64, a cache-sized block at a time."""
    flat = np.ravel(a, order="K")  # memory order: no transposing copy of a column-major array
    total = 0.0
    for first in range(0, flat.size, _SQUARES_BLOCK):
        part = flat[first:first + _SQUARES_BLOCK].astype(np.float64)
        total += float(np.dot(part, part))  # BLAS dot: no squared temporaries
    return total


def _channels(a: np.ndarray, rows: slice, ndim: int, channels: int, channel_axis: int) -> np.ndarray:
    """These output channels of a weight-shaped array or a per-channel vector (a scalar stays): views."""
    if a.ndim == ndim:
        index = [slice(None)] * ndim
        index[channel_axis] = rows
        return a[tuple(index)]
    return a[rows] if a.ndim == 1 and a.shape[0] == channels else a


def quantize_weight(w: np.ndarray, spec: WeightQuant, rounding: Rounding, channel_axis: int, input_axis: int,
                    convention: Convention = Convention.ORT, scale_dtype=np.float32,
                    importance: np.ndarray | None = None) -> QuantizedWeight:
    """Quantize `w` (float32). `channel_axis` is the output-channel axis, `input_axis` the axis groups run
    along; `scale_dtype` is what the scales are stored as (torch convention: the model's float dtype).
    `importance` (mse only; a 2-D `w` laid out [out, in]): one weight per input column for the squared
    errors the search compares, e.g. the mean square of each input (GPTQ's Hessian diagonal)."""
    w = np.asarray(w, np.float32)
    rows, restore, axis, block = _blocked(w, spec, channel_axis, input_axis)  # [G, L]: one row per scale
    rules = _Rules(spec, convention, scale_dtype)
    if rounding is Rounding.MSE:
        scale, zp = _mse_params(rows, rules, None if importance is None else _row_weights(importance, w, spec))
    else:
        scale, zp = rules.params(rows, 1.0)
    q = restore(rules.quantize(rows, scale[:, None], zp[:, None]))
    scale = _param_layout(scale, w, spec, input_axis)
    zp = _param_layout(zp, w, spec, input_axis).astype(np.int32)
    if spec.qtype is QType.INT4 and convention is Convention.ORT:  # MLAS works in [0, 15]; signed is that minus 8
        q, zp = (q.astype(np.int16) - 8).astype(np.int8), zp - 8
    return QuantizedWeight(q, scale, zp, spec.qtype, axis, block)


def _row_weights(importance: np.ndarray, w: np.ndarray, spec: WeightQuant) -> np.ndarray:
    """Input-column weights in a shape that broadcasts over `_blocked`'s rows of a [out, in] weight once they
    are viewed as [-1, *shape]: [groups, size] for groups, [1, in] per channel, [1, out·in] per tensor."""
    assert w.ndim == 2 and importance.shape == (w.shape[1],), "importance needs a [out, in] weight"
    weights = np.asarray(importance, np.float32)
    if spec.granularity is Granularity.GROUP:
        return weights.reshape(-1, spec.group)
    if spec.granularity is Granularity.PER_CHANNEL:
        return weights[None]
    return np.tile(weights, w.shape[0])[None]


def _blocked(w: np.ndarray, spec: WeightQuant, channel_axis: int, input_axis: int):
    """Rows to quantize independently, and a function that puts quantized rows back in w's layout."""
    if spec.granularity is Granularity.PER_TENSOR:
        return w.reshape(1, -1), (lambda q: q.reshape(w.shape)), None, None
    moved = np.moveaxis(w, channel_axis, 0)  # [C, ...]
    if spec.granularity is Granularity.PER_CHANNEL:
        shape = moved.shape
        return moved.reshape(shape[0], -1), (lambda q: np.moveaxis(q.reshape(shape), 0, channel_axis)), channel_axis, None
    size = spec.group
    inner = np.moveaxis(w, input_axis, -1)  # [..., K]
    shape = inner.shape
    rows = inner.reshape(-1, shape[-1] // size, size)  # [C, K/bs, bs]
    flat = rows.reshape(-1, size)

    def restore(q):
        return np.moveaxis(q.reshape(shape), -1, input_axis)

    return flat, restore, input_axis, size


def _param_layout(values: np.ndarray, w: np.ndarray, spec: WeightQuant, input_axis: int) -> np.ndarray:
    if spec.granularity is Granularity.PER_TENSOR:
        return values.reshape(())
    if spec.granularity is Granularity.PER_CHANNEL:
        return values.reshape(-1)
    inner_shape = list(np.moveaxis(w, input_axis, -1).shape)
    inner_shape[-1] //= spec.group_size
    return np.moveaxis(values.reshape(inner_shape), -1, input_axis)


@dataclass(frozen=True)
class _Rules:
    """Scale/zero-point choice and rounding of one scheme under one convention."""

    spec: WeightQuant
    convention: Convention
    scale_dtype: object

    def params(self, rows: np.ndarray, alpha: float):
        """Scale and zero point per row for the row's range shrunk by `alpha`."""
        return self.params_at(self.extremes(rows), alpha)

    def extremes(self, rows: np.ndarray) -> tuple:
        """What the scales are computed from, per row: min, max, and (MLAS int4) the value of largest magnitude."""
        signed = None
        if self._mlas:
            signed = np.take_along_axis(rows, np.abs(rows).argmax(axis=1)[:, None], axis=1)[:, 0]
        return rows.min(axis=1), rows.max(axis=1), signed

    def params_at(self, extremes: tuple, alpha: float):
        spec = self.spec
        low, high, signed = extremes
        mn, mx = low * alpha, high * alpha
        if self.convention is Convention.TORCH:
            return qparams.torch_scale_zero_point(mn, mx, spec.qtype, spec.symmetric, self.scale_dtype)
        if signed is not None:
            return qparams.mlas_int4(mn, mx, signed * np.float32(alpha), spec.symmetric)
        return qparams.scale_zero_point(mn, mx, spec.qtype, spec.symmetric)

    def squared_error(self, rows: np.ndarray, scale: np.ndarray, zp: np.ndarray, out: np.ndarray,
                      weights: np.ndarray | None = None) -> np.ndarray:
        """Per row, the sum of (dequantized - value)² (each times its column's entry of `weights`, which
        broadcasts over the rows viewed as [-1, *weights.shape]), the rows rounded as `quantize` rounds them;
        `out` is a float32 scratch of the rows' shape (the search reuses it: no allocation per candidate)."""
        s, z = scale[:, None].astype(np.float32), zp[:, None].astype(np.float32)
        self.round_into(rows, s, z, out)
        out -= z
        out *= s
        out -= rows
        np.square(out, out=out)
        if weights is not None:
            out.reshape(-1, *weights.shape)[...] *= weights
        return out.sum(axis=1, dtype=np.float64)

    def quantize(self, rows: np.ndarray, scale: np.ndarray, zp: np.ndarray) -> np.ndarray:
        """The rows' integers for per-row `scale` and `zp` (given as [rows, 1]), in the type's numpy dtype
        (MLAS 4-bit: unsigned, [0, 15])."""
        rounded = self.round_into(rows, scale.astype(np.float32), zp.astype(np.float32), np.empty(rows.shape, np.float32))
        return rounded.astype(np.uint8 if self._mlas else qparams.NP_TYPES[self.spec.qtype])

    @property
    def _mlas(self) -> bool:
        """MLAS's 4-bit blocks (ONNX MatMulNBits): unsigned [0, 15], values times the scale's inverse."""
        return self.convention is not Convention.TORCH and self.spec.qtype.bits == 4

    def round_into(self, rows: np.ndarray, scale: np.ndarray, zp: np.ndarray, out: np.ndarray) -> np.ndarray:
        """The one rounding rule of every convention, as float32 into `out`: rows divided by the scale
        (onnxruntime, compressed-tensors) or times its inverse (MLAS 4-bit, a zero scale giving the zero
        point), rounded half to even, shifted by the zero point and clipped to the type's full range."""
        if self._mlas:
            inverse = np.where(scale != 0, np.float32(1.0) / np.where(scale != 0, scale, 1), 0).astype(np.float32)
            np.multiply(rows, inverse, out=out)
            lo, hi = qparams.full_range(QType.UINT4)
        else:
            np.divide(rows, scale, out=out)
            lo, hi = qparams.full_range(self.spec.qtype)
        np.round(out, out=out)
        out += zp
        np.clip(out, lo, hi, out=out)
        return out


def _mse_params(rows: np.ndarray, rules: _Rules, weights: np.ndarray | None = None):
    """The shrink factor with the lowest (weighted) squared error, chosen per row; ties keep the wider range."""
    best_err = np.full(rows.shape[0], np.inf)
    best_scale = best_zp = None
    extremes, scratch = rules.extremes(rows), np.empty(rows.shape, np.float32)
    for alpha in MSE_GRID:
        scale, zp = rules.params_at(extremes, alpha)
        err = rules.squared_error(rows, scale, zp, scratch, weights)
        better = err < best_err
        best_err = np.where(better, err, best_err)
        best_scale = scale if best_scale is None else np.where(better, scale, best_scale)
        best_zp = zp if best_zp is None else np.where(better, zp, best_zp)
    assert best_scale is not None and best_zp is not None  # MSE_GRID is not empty
    return best_scale.astype(np.float32), best_zp.astype(np.int32)


def pack_int4(values: np.ndarray) -> np.ndarray:
    """Two 4-bit values per byte, low nibble first, along the last axis (padded with 0 when odd)."""
    v = values.astype(np.uint8) & 0x0F
    if v.shape[-1] % 2:
        v = np.concatenate([v, np.zeros(v.shape[:-1] + (1,), np.uint8)], axis=-1)
    return (v[..., 0::2] | (v[..., 1::2] << 4)).astype(np.uint8)
