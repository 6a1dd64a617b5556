"""The floating formats (FP8 per channel or in blocks, NVFP4, MXFP4) rounded straight from a weight's float
bits: slices of rows on every core, each through float_kernels' one-pass loop. What the torch backend's
data-free rounding calls for these formats (float_formats.quantize_float); everything else about them, and
every weight this does not take, goes through compressed-tensors' own functions."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.ir.types import Granularity, QType, WeightQuant
from compiler.quant.parallel import parallel_map

TASK_WEIGHTS = 1 << 20  # weights one call rounds: ~1 ms of work against ~20 µs of Python around it
SCALE_DTYPES = ("float32", "bfloat16")  # FP8's scales as stored (a float16 model's: compressed-tensors)


@dataclass(frozen=True)
class FloatRounded:
    """A weight rounded by the loop: the stored codes (FP8: e4m3 bytes [out, in]; FP4: e2m1 pairs [out, in /
    2]), the scales (FP8: float32 holding the stored dtype's values; FP4: their stored bytes) and the sums
    (Σ w², Σ (w − dequantized)²) of its SQNR."""

    codes: np.ndarray
    scales: np.ndarray
    sums: tuple[float, float]


def applies(spec: WeightQuant, scale_dtype: str, shape: tuple[int, ...]) -> bool:
    """Whether the loop rounds this weight: FP8 per channel or in 2-D blocks with float32 or bfloat16
    scales; NVFP4 and MXFP4 of a weight whose rows are whole groups."""
    if len(shape) != 2:
        return False
    if spec.qtype is QType.FP8:
        return spec.granularity in (Granularity.PER_CHANNEL, Granularity.BLOCK) and scale_dtype in SCALE_DTYPES
    group = spec.qtype.fixed_group
    return spec.qtype in (QType.NVFP4, QType.MXFP4) and group is not None and shape[1] % group == 0


def absmax(bits: np.ndarray) -> float:
    """max |w| of a weight given as its float bits (uint16: bfloat16, uint32: float32), on every core; NaN
    where the weight holds one."""
    from compiler.quant import float_kernels

    flat = bits.reshape(-1)
    peaks = parallel_map(lambda first: float_kernels.peak(flat[first:first + TASK_WEIGHTS]),
                         range(0, flat.shape[0], TASK_WEIGHTS))
    return float_kernels.magnitude_value(int(max(peaks, default=0)))


def round_bits(bits: np.ndarray, spec: WeightQuant, scale_dtype: str,
               global_scale: float | None = None, importance: np.ndarray | None = None) -> FloatRounded | None:
    """An [out, in] weight given as its float bits (uint16: bfloat16, uint32: float32) rounded as
    compressed-tensors rounds `spec` (NVFP4 under `global_scale`, float32); None where a scale cannot be
    rounded here (a non-finite weight, a range beneath the scale dtype's): compressed-tensors rounds it.
    `importance` (NVFP4, MXFP4; float32 [in], ones for `rounding mse`): each group's scale searched for the least
    squared error, each column's weighted by it."""
    from compiler.quant import float_kernels  # numba: only where weights are rounded (not check/plan)

    rows, cols = bits.shape
    if spec.qtype is QType.FP8:
        band, group = spec.block_shape if spec.granularity is Granularity.BLOCK else (1, cols)
        codes = np.empty((rows, cols), np.uint8)
        scales = np.empty((-(-rows // band), -(-cols // group)), np.float32)

        def rounded(part: slice) -> tuple:
            return float_kernels.round_fp8(bits[part], band, group, scale_dtype == "bfloat16", codes[part],
                                           scales[part.start // band:-(-part.stop // band)])
    else:
        band, group = 1, spec.qtype.fixed_group or 0
        codes = np.empty((rows, cols // 2), np.uint8)
        scales = np.empty((rows, cols // group), np.uint8)
        nvfp4 = np.float32(global_scale if spec.qtype is QType.NVFP4 and global_scale is not None else 0.0)

        def rounded(part: slice) -> tuple:
            return float_kernels.round_fp4(bits[part], group, nvfp4, codes[part], scales[part], importance)

    step = -(-max(1, TASK_WEIGHTS // max(cols, 1)) // band) * band  # whole bands of rows
    sums = parallel_map(lambda first: rounded(slice(first, min(first + step, rows))), range(0, rows, step))
    if any(refused for _, _, refused in sums):
        return None
    return FloatRounded(codes, scales, (sum(s for s, _, _ in sums), sum(e for _, e, _ in sums)))
