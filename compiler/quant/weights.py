"""Weight quantization for one tensor: per-tensor, per-channel or blocks along the input axis; rtn or an
mse clipping search (a shrink factor per channel/block, vectorised over all of them at once)."""

from __future__ import annotations

import enum
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from compiler.ir.types import Granularity, QType, Rounding, WeightQuant
from compiler.quant import qparams
from compiler.quant.parallel import cores, parallel_map

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
    sums: tuple[float, float] | None = None  # (Σ w², Σ (w − dequantized)²) when the rounding measured them

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


SQNR_SLICE_BYTES = 1 << 20  # float bytes of the weight per SQNR task: fixed, so the float64 sums are the same on any machine


def sqnr_db(w: np.ndarray, qw: QuantizedWeight, slice_bytes: int = SQNR_SLICE_BYTES) -> float:
    """Signal to quantization noise of a weight, 10·log10(‖W‖² / ‖W − Q(W)‖²) in dB (inf when the rounding
    is exact). Computed in slices along the weight's first axis (contiguous in memory, whole blocks when
    the blocks run along it) on every core; the scratch is a few slices'. A weight rounded with `measure`
    carries its sums already."""
    if qw.sums is not None:
        return sqnr_from_sums(qw.sums)
    leading = w.shape[0] if w.ndim else 1
    step = max(1, slice_bytes // max(1, w.nbytes // max(leading, 1)))
    if qw.block_size and qw.axis == 0:
        step = -(-step // qw.block_size) * qw.block_size
    sums = parallel_map(lambda first: _slice_squares(w, qw, first, min(first + step, leading)),
                        range(0, leading, step) if w.ndim else [0])
    return _decibels(sum(s for s, _ in sums), sum(n for _, n in sums))


def sqnr_from_sums(sums: tuple[float, float]) -> float:
    """The SQNR in dB of a weight rounded with `measure`, from its (Σ w², Σ err²)."""
    return _decibels(*sums)


def _decibels(signal: float, noise: float) -> float:
    return float("inf") if noise == 0 else 10 * float(np.log10(max(signal, 1e-300) / noise))


def _slice_squares(w: np.ndarray, qw: QuantizedWeight, first: int, stop: int) -> tuple[float, float]:
    """(Σ w², Σ (w − dequantized)²) over rows first:stop of the weight's first axis."""
    if w.ndim == 0:
        original, part = np.asarray(w, np.float32), qw
    else:
        original = np.asarray(w[first:stop], np.float32)
        part = QuantizedWeight(qw.q[first:stop], _leading_params(qw, qw.scale, first, stop),
                               _leading_params(qw, qw.zero_point, first, stop), qw.qtype, qw.axis, qw.block_size)
    return error_sums(original, part.dequantize())  # the float32 error, in the dequantized copy


def error_sums(original: np.ndarray, dequantized: np.ndarray) -> tuple[float, float]:
    """(Σ w², Σ (w − dequantized)²) of float32 arrays, as `measure` takes them; `dequantized` is overwritten."""
    np.subtract(original, dequantized, out=dequantized)
    return _sum_of_squares(original), _sum_of_squares(dequantized, dequantized)


def _leading_params(qw: QuantizedWeight, a: np.ndarray, first: int, stop: int) -> np.ndarray:
    """The scales (or zero points) of rows first:stop of the weight's first axis: all of them when they do
    not vary along it (per tensor, per channel of another axis), else those rows' (or blocks')."""
    if a.ndim == 0 or qw.axis != 0 and a.ndim == 1:
        return a
    if qw.block_size and qw.axis == 0:
        return a[first // qw.block_size:-(-stop // qw.block_size)]
    return a[first:stop]


def _sum_of_squares(a: np.ndarray, scratch: np.ndarray | None = None) -> float:
    """Σ a²: the squares in float32 (each within half an ulp), summed in float64 (a relative error near
    1e-10 where a float32 sum drifts by 1e-6); `scratch` (a's shape) is overwritten instead of a new array."""
    squares = np.square(a, out=scratch)
    return float(squares.sum(dtype=np.float64))


def quantize_weight(w: np.ndarray, spec: WeightQuant, rounding: Rounding, channel_axis: int, input_axis: int,
                    convention: Convention = Convention.ORT, scale_dtype=np.float32,
                    importance: np.ndarray | None = None, measure: bool = False,
                    out: np.ndarray | None = None) -> QuantizedWeight:
    """Quantize `w` (float32). `channel_axis` is the output-channel axis, `input_axis` the axis groups run
    along; `scale_dtype` is what the scales are stored as (torch convention: the model's float dtype).
    `importance` (mse only; a 2-D `w` laid out [out, in]): one weight per input column for the squared
    errors the search compares, e.g. the mean square of each input (GPTQ's Hessian diagonal). `measure`:
    also the sums the SQNR is made of, taken while the rows are in cache (`QuantizedWeight.sums`). `out`: an
    integer array of w's shape (and `_integer_dtype`) the values are stored in instead of a new one."""
    w = np.asarray(w, np.float32)
    blocks = _Blocks.of(w, spec, channel_axis, input_axis)
    view, rules = blocks.view, _Rules(spec, convention, scale_dtype)
    if rounding is Rounding.MSE:
        scale, zp = _mse_params(view, rules, None if importance is None else _column_weights(importance, w, spec))
    elif rounding.scales is not None:  # a registered plug-in chooses each block's scale (ScaleChoice)
        scale, zp = rounding.scales(ScaleChoice(view, rules))
    else:
        scale, zp = rules.params(view, 1.0)
    scale32, zp32 = scale[:, None].astype(np.float32), zp[:, None].astype(np.float32)
    rounded = rules.round_into(view, scale32, zp32, np.empty(view.shape, np.float32))
    signed_mlas = spec.qtype is QType.INT4 and convention is Convention.ORT
    q: np.ndarray
    if out is None:
        q = rounded.astype(_integer_dtype(spec, convention))
    else:
        q = _reshaped(out, view.shape)
        q[...] = rounded
    sums = _error_sums(view, rounded, scale32, zp32) if measure else None  # `rounded` is its scratch
    zp = zp.astype(np.float32 if rounding.float_zero_points else np.int32)
    if signed_mlas:  # MLAS works in [0, 15]; signed is that minus 8
        q -= 8
        zp -= 8
    return QuantizedWeight(blocks.restore(q), blocks.param_layout(scale), blocks.param_layout(zp), spec.qtype,
                           blocks.axis, blocks.block_size, sums)


def _error_sums(rows: np.ndarray, rounded: np.ndarray, scale: np.ndarray, zp: np.ndarray) -> tuple[float, float]:
    """(Σ w², Σ (w − dequantized)²) of rows and their rounded values, dequantized as the runtime does:
    (q − zero point) · scale in float32. `rounded` is overwritten (the error is computed in it)."""
    np.subtract(rounded, zp, out=rounded)
    rounded *= scale
    return error_sums(rows, rounded)


ROUND_TASK_BYTES = 2 << 20  # float bytes one core rounds at a time: the passes over a slice stay in its cache


def round_weight(w, spec: WeightQuant, rounding: Rounding, channel_axis: int, input_axis: int,
                 convention: Convention = Convention.ORT, scale_dtype=np.float32,
                 slice_bytes: int = 16 << 20, measure: bool = False,
                 float32: Callable[[Any, np.ndarray], np.ndarray] | None = None,
                 importance: np.ndarray | None = None) -> QuantizedWeight:
    """`quantize_weight` of a whole weight in slices of output channels rounded on every core: per-channel
    and per-group scales are independent across channels, so the bytes are those of one piece. At most
    `slice_bytes` of float weight are in flight at once (each core's slice is at most slice_bytes / cores),
    so the scratch is what the backends' plans charge for one slice. With `measure`, the SQNR's float64
    sums are added slice by slice: their last digits may differ between machines with other core counts.
    `float32(part, scratch)`: writes a slice of `w` (a weight in another type: a bfloat16 torch tensor) as
    float32 into `scratch` (a flat float32 array of its size) and returns it in the slice's shape; each core
    converts its slice while it is in cache, into scratch it reuses (fresh memory for every slice would be
    faulted in afresh), instead of the whole weight first. Slices of the first axis are rounded into one
    integer array (no copy to join them). `importance`: quantize_weight's, one weight per input column (the
    same for every slice of output channels), or one per value ([out, in], sliced with the rows)."""
    if float32 is None:
        w = np.asarray(w, np.float32)
    shape = tuple(w.shape)
    channels = shape[channel_axis] if shape else 1
    workers = cores()
    task = max(1, min(ROUND_TASK_BYTES, slice_bytes // workers))
    slices = min(channels, max(workers, -(-4 * math.prod(shape) // task)))
    joined = channel_axis == 0 and len(shape) > 1 and spec.granularity is not Granularity.PER_TENSOR
    q = np.empty(shape, _integer_dtype(spec, convention)) if joined else None

    def rounded(part, out: np.ndarray | None = None, rows: np.ndarray | None = importance) -> QuantizedWeight:
        values = part if float32 is None else float32(part, _scratch(math.prod(part.shape), task))
        # a non-finite value (which the caller refuses, Q409, seeing the sums) gives NaN scales: no warnings
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            return quantize_weight(values, spec, rounding, channel_axis, input_axis, convention, scale_dtype,
                                   rows, measure=measure, out=out)

    if spec.granularity is Granularity.PER_TENSOR or slices <= 1:
        return rounded(w, q)
    step = -(-channels // slices)

    def one(first: int) -> QuantizedWeight:
        index = [slice(None)] * len(shape)
        index[channel_axis] = slice(first, first + step)
        rows = importance[first:first + step] if importance is not None and importance.ndim == 2 else importance
        return rounded(w[tuple(index)], None if q is None else q[first:first + step], rows)

    parts = parallel_map(one, range(0, channels, step))
    scale_axis = channel_axis if spec.granularity is Granularity.GROUP else 0
    head = parts[0]
    sums = (sum(p.sums[0] for p in parts if p.sums), sum(p.sums[1] for p in parts if p.sums)) if measure else None
    return QuantizedWeight(q if q is not None else np.concatenate([p.q for p in parts], axis=channel_axis),
                           np.concatenate([p.scale for p in parts], axis=scale_axis),
                           np.concatenate([p.zero_point for p in parts], axis=scale_axis), head.qtype, head.axis,
                           head.block_size, sums)


_scratches = threading.local()


def _scratch(count: int, task_bytes: int) -> np.ndarray:
    """A flat float32 array of `count` values for the calling thread: the one it used last when both fit in
    two tasks' bytes (a slice is a task's rows rounded up to whole rows, so a thread keeps at most that), else
    a new one (a per-tensor weight rounded whole)."""
    if 4 * count > 2 * task_bytes:
        return np.empty(count, np.float32)
    kept = getattr(_scratches, "array", None)
    if kept is None or kept.size < count:
        kept = _scratches.array = np.empty(max(count, task_bytes // 4), np.float32)
    return kept[:count]


def _integer_dtype(spec: WeightQuant, convention: Convention) -> type:
    """What a rounded weight's integers are stored in: MLAS's 4-bit values (ONNX int4 and uint4) are rounded
    in [0, 15] (int4 is then shifted to signed), every other type in its own numpy type."""
    if spec.qtype.bits == 4 and convention is Convention.ORT:
        return np.int8 if spec.qtype is QType.INT4 else np.uint8
    return qparams.np_type(spec.qtype)


def _reshaped(out: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """`out` seen in `shape` without a copy (numpy refuses to assign a shape that would need one)."""
    view = out.view()
    view.shape = shape
    return view


def _column_weights(importance: np.ndarray, w: np.ndarray, spec: WeightQuant) -> np.ndarray:
    """Input-column weights of a [out, in] weight in a shape that broadcasts over its blocks' view once that
    is viewed as [-1, *shape]: [in/group, group, 1] for groups, [in, 1] per channel and per tensor; an
    importance per row ([out, in]: weights stacked from layers of their own) in the view's whole shape."""
    assert w.ndim == 2 and importance.shape in ((w.shape[1],), w.shape), "importance needs a [out, in] weight"
    weights = np.asarray(importance, np.float32)
    if spec.granularity is Granularity.GROUP:
        return weights.reshape(-1, spec.group, 1)
    return weights[..., None]


@dataclass(frozen=True)
class _Blocks:
    """A weight seen as [A, L, B]: each of the A·B sets of L values shares one scale, and the scales form an
    [A, B] array. Where the shared values run along one axis of the weight, this is a view of it with no
    copy and long contiguous inner loops (ONNX's [K, N] in blocks along K is [K/bs, bs, N]; torch's
    [out, in] in groups is [out·in/bs, bs, 1]); a channel axis in the middle of a weight is moved first."""

    view: np.ndarray
    shape: tuple[int, ...]  # of the weight
    moved_from: int | None  # the channel axis moved to the front (a copy), if one was
    axis: int | None  # the scales' axis in the stored layout (None: per tensor)
    block_size: int | None

    @classmethod
    def of(cls, w: np.ndarray, spec: WeightQuant, channel_axis: int, input_axis: int) -> _Blocks:
        shape = w.shape
        if spec.granularity is Granularity.PER_TENSOR:
            return cls(w.reshape(1, -1, 1), shape, None, None, None)
        if spec.granularity is Granularity.PER_CHANNEL:
            if channel_axis == w.ndim - 1:
                return cls(w.reshape(1, -1, shape[-1]), shape, None, channel_axis, None)
            moved = channel_axis if channel_axis else None
            front = np.ascontiguousarray(np.moveaxis(w, channel_axis, 0)) if moved else w
            return cls(front.reshape(shape[channel_axis], -1, 1), shape, moved, channel_axis, None)
        size = spec.group
        before, after = math.prod(shape[:input_axis]), math.prod(shape[input_axis + 1:])
        return cls(w.reshape(before * shape[input_axis] // size, size, after), shape, None, input_axis, size)

    def restore(self, q: np.ndarray) -> np.ndarray:
        """Values of the view's shape back in the weight's layout."""
        if self.moved_from is None:
            return q.reshape(self.shape)
        front = (self.shape[self.moved_from],) + self.shape[:self.moved_from] + self.shape[self.moved_from + 1:]
        return np.moveaxis(q.reshape(front), 0, self.moved_from)

    def param_layout(self, values: np.ndarray) -> np.ndarray:
        """[A, B] scales (or zero points) as DequantizeLinear stores them: a scalar, one per channel, or the
        weight's shape with the blocked axis divided by the block size."""
        if self.axis is None:
            return values.reshape(())
        if self.block_size is None:
            return values.reshape(-1)
        blocked = list(self.shape)
        blocked[self.axis] //= self.block_size
        return values.reshape(blocked)


@dataclass(frozen=True)
class _Rules:
    """Scale/zero-point choice and rounding of one scheme under one convention."""

    spec: WeightQuant
    convention: Convention
    scale_dtype: object

    @property
    def signed_search(self) -> bool:
        """Whether the weighted search may put a block's largest value on the negative end (_signed_params):
        symmetric int4/int8 in compressed-tensors' convention, whose runtimes multiply by the scale as stored."""
        return (self.convention is Convention.TORCH and self.spec.symmetric
                and self.spec.qtype in (QType.INT4, QType.INT8))

    def params(self, rows: np.ndarray, alpha: float):
        """Scale and zero point of each block of an [A, L, B] view (`_Blocks`), [A, B], for its range shrunk
        by `alpha`."""
        return self.params_at(self.extremes(rows), alpha)

    def extremes(self, rows: np.ndarray) -> tuple:
        """What the scales are computed from, per block (over the view's axis 1): min, max, and (MLAS int4)
        the value of largest magnitude."""
        low, high = rows.min(axis=1), rows.max(axis=1)
        return low, high, _largest_magnitude(low, high) if self.mlas else None

    def params_at(self, extremes: tuple, alpha: float | np.ndarray):
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
        """Per block, the sum of (dequantized - value)² (each times its column's entry of `weights`, which
        broadcasts over the view seen as [-1, *weights.shape]), rounded as `round_into` rounds; `out` is a
        float32 scratch of the view's shape (the search reuses it: no allocation per candidate)."""
        s, z = scale[:, None].astype(np.float32), zp[:, None].astype(np.float32)
        self.round_into(rows, s, z, out)
        out -= z
        out *= s
        out -= rows
        np.square(out, out=out)
        if weights is not None:
            out.reshape(-1, *weights.shape)[...] *= weights
        return out.sum(axis=1, dtype=np.float64)

    def levels(self) -> tuple[int, int]:
        """The integers `round_into` clips to: MLAS's unsigned [0, 15] for 4 bits, else the type's full range."""
        return qparams.full_range(QType.UINT4) if self.mlas else qparams.full_range(self.spec.qtype)

    @property
    def mlas(self) -> bool:
        """MLAS's 4-bit blocks (ONNX MatMulNBits): unsigned [0, 15], values times the scale's inverse."""
        return self.convention is not Convention.TORCH and self.spec.qtype.bits == 4

    def round_into(self, rows: np.ndarray, scale: np.ndarray, zp: np.ndarray, out: np.ndarray) -> np.ndarray:
        """The rounding rule of each convention, as float32 into `out`: rows divided by the scale, rounded half
        to even and shifted by the zero point (onnxruntime, compressed-tensors), or times the scale's inverse
        plus the zero point, rounded halves away from zero (MLAS 4-bit; a zero scale gives the zero point);
        then clipped to the type's full range."""
        if self.mlas:  # MLAS: roundf(v · (1 / scale) + zero point), halves away from zero
            inverse = np.where(scale != 0, np.float32(1.0) / np.where(scale != 0, scale, 1), 0).astype(np.float32)
            np.multiply(rows, inverse, out=out)
            out += zp
            qparams.round_half_away(out, out=out)
        else:  # onnxruntime and compressed-tensors: round(v / scale) half to even, plus the zero point
            np.divide(rows, scale, out=out)
            np.round(out, out=out)
            out += zp
        np.clip(out, *self.levels(), out=out)
        return out


def _largest_magnitude(low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Per block, its value of largest magnitude as MLAS picks it (onnxruntime's quantize_matmul_4bits): the
    max where its magnitude is strictly larger than the min's, else the min (so a block holding -x and x
    takes -x, in either order)."""
    return np.where(np.abs(high) > np.abs(low), high, low)


# The signed search's divisors of a block's value of largest magnitude, over the type's largest level (8 for
# int4): 1 maps that value exactly to the range's negative end, more clips it (2: half the range clipped). Coarse
# steps of 0.125 from 0.875 to 2, then steps of 0.025 within one coarse step of each block's best: 17 roundings
# of the block, on the real SmolLM2's layers within 1% of the held-out output error of 101 even steps from 0.75
# (AutoRound's grid) and 4% below 21 steps from 1 (bench/README.md).
SIGNED_COARSE = tuple(float(f) for f in np.linspace(0.875, 2.0, 10))
SIGNED_FINE = tuple(float(f) for f in np.arange(-4, 5) * 0.025 if f != 0)


def _signed_params(rows: np.ndarray, rules: _Rules, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The weighted search of symmetric signed integers in compressed-tensors' convention (dequantized = q ·
    scale, q in [-8, 7] for int4): each block's value of largest magnitude is put on the range's negative end
    -8 (a negative scale where that value is positive), so it is on the grid with 8 steps of either sign where
    the absmax/7.5 scale gives it 7.5 and rounds it off, and the search divides it over 7 to 16 steps (clipping
    up to half the range), keeping the scale with the least weighted squared error. The search AutoRound's RTN
    mode and llama.cpp's make_qx_quants make; on the real SmolLM2's layers its held-out output error was 15-20%
    below the shrink search's (`_mse_params`)."""
    lo, _ = qparams.full_range(rules.spec.qtype)
    extreme = _largest_magnitude(rows.min(axis=1), rows.max(axis=1)).astype(np.float32)
    extreme = np.where(extreme != 0, extreme, np.float32(1.0))  # an all-zero block: any scale rounds it to 0
    zero = np.zeros(extreme.shape, np.int32)
    scratch = np.empty(rows.shape, np.float32)
    best_err = np.full(extreme.shape, np.inf)
    best_scale = np.zeros(extreme.shape, np.float32)
    best_factor = np.zeros(extreme.shape, np.float32)

    def attempt(factor) -> None:
        nonlocal best_err, best_scale, best_factor
        scale = qparams.stored_signed(extreme / (np.float32(lo) * np.float32(factor)), rules.scale_dtype)
        err = rules.squared_error(rows, scale, zero, scratch, weights)
        better = err < best_err
        best_err = np.where(better, err, best_err)
        best_scale = np.where(better, scale, best_scale)
        best_factor = np.where(better, factor, best_factor)

    for factor in SIGNED_COARSE:
        attempt(factor)
    coarse = best_factor
    for step in SIGNED_FINE:
        attempt(np.clip(coarse + np.float32(step), SIGNED_COARSE[0], SIGNED_COARSE[-1]).astype(np.float32))
    return best_scale, zero


@dataclass(frozen=True)
class ScaleChoice:
    """What a rounding method registered by a plug-in (compiler/ir/kinds.py Rounding.scales) chooses from: the
    blocks of one slice of a weight, and the scheme's own scale rules. Its answer, each block's scale and zero
    point, is rounded to the nearest grid value by the shared code, in the convention of the backend's runtime."""

    rows: np.ndarray  # the blocks as an [A, L, B] float32 view: the L values of each of A×B blocks (over axis 1)
    rules: _Rules

    def at(self, shrink: float | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each block's (scale, zero point), [A, B], for its range times `shrink` (1: rtn's; an [A, B] array: one
        factor a block)."""
        return self.rules.params_at(self.rules.extremes(self.rows), shrink)

    def error(self, scale: np.ndarray, zero_point: np.ndarray) -> np.ndarray:
        """Each block's sum of squared rounding errors, [A, B], rounded with (scale, zero point)."""
        return self.rules.squared_error(self.rows, scale, zero_point, np.empty(self.rows.shape, np.float32))


def _mse_params(rows: np.ndarray, rules: _Rules, weights: np.ndarray | None = None):
    """The shrink factor with the lowest (weighted) squared error, chosen per block; ties keep the wider range.
    Weighted symmetric signed integers in compressed-tensors' convention take the signed search instead."""
    if weights is not None and rules.signed_search:
        return _signed_params(rows, rules, weights)
    best_err = np.full((rows.shape[0], rows.shape[2]), np.inf)
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
