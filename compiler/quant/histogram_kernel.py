"""The histogram observer's update compiled by numba: the batch's finite range, then every value's bin, on
every core.

Why our own loop: np.histogram with a range is about 7 ns a value (a dozen whole-array passes: the range
mask, the index arithmetic, two corrections against the edges, bincount), and static W8A8 calibration with
the default percentile spent seconds there for every second its forwards took. This loop is about 0.9 ns a value a core.

The counts are np.histogram's exactly. Its bins are [edge_i, edge_i+1) (the last one closed) over edges
numpy's linspace makes; with a power-of-two range and a power-of-two bin count every edge is exact in
float32 and float64, so a value's bin is a property of the value and the edges alone, and this loop finds
it exactly (_count_bins). Ranges or bin counts where the edges are not exact are left to numpy
(`exact_edges`), as are batches with a non-finite value (numpy's masking is the rule there).
tests/test_histogram_kernel.py compares the counts with np.histogram's on values at and beside every edge."""

from __future__ import annotations

import numpy as np
from numba import njit

from compiler.quant.parallel import cores, parallel_map
from compiler.quant.round_kernels import float_range

TASK_VALUES = 1 << 20  # values one call bins: ~1 ms of work against ~20 µs of Python around it
_EXPONENT_BITS = np.uint32(0x7F800000)  # all ones: an infinity or a NaN
_LIMIT = 100  # exponents of the range kept well inside float32's, where its edges are exact normal floats


def exact_edges(bins: int, exponent: int) -> bool:
    """Whether the histogram's edges over [-2^exponent, 2^exponent] are exact: a power-of-two bin count and
    a range whose finest edge is a normal float32."""
    return bins & (bins - 1) == 0 and -_LIMIT <= exponent <= _LIMIT


@njit(nogil=True, cache=True)
def _nonfinite(bits) -> int:
    """Values whose exponent bits are all ones (infinities and NaNs), counted as integers (vectorized)."""
    count = 0
    for i in range(bits.shape[0]):
        count += (bits[i] & _EXPONENT_BITS) == _EXPONENT_BITS
    return count


@njit(nogil=True, cache=True)
def _count_bins(values, threshold, counts) -> None:
    """Add each value to the count of its bin [edge_k, edge_k+1), edge_k = (k − bins/2) · step, the last bin
    closed: k = floor(v / step) + bins/2. With step a power of two, v / step in float64 is exact, so is its
    floor: no estimate to correct (np.histogram corrects its own against the edges and lands on the same k)."""
    bins = counts.shape[0]
    half = bins // 2
    last = bins - 1
    inverse = half / threshold  # 1 / step, a power of two
    for i in range(values.shape[0]):
        counts[min(np.int64(np.floor(np.float64(values[i]) * inverse)) + half, last)] += 1


def _parts(size: int) -> list[slice]:
    step = max(TASK_VALUES, -(-size // cores()))
    return [slice(first, first + step) for first in range(0, size, step)]


def finite_range(values: np.ndarray) -> tuple[float, float] | None:
    """(min, max) of a contiguous float32 vector when all of it is finite, else None."""
    bits = values.view(np.uint32)
    seen = parallel_map(lambda part: (_nonfinite(bits[part]), *float_range(bits[part])), _parts(values.size))
    if any(bad for bad, _, _ in seen):
        return None
    return float(min(lo for _, lo, _ in seen)), float(max(hi for _, _, hi in seen))


def add_counts(values: np.ndarray, threshold: float, counts: np.ndarray) -> None:
    """Add a contiguous float32 vector of finite values within ±threshold to `counts` (int64, over the edges
    exact_edges allows), as np.histogram(values, counts.size, range=(-threshold, threshold)) counts them."""
    def one(part: slice) -> np.ndarray:
        mine = np.zeros_like(counts)
        _count_bins(values[part], threshold, mine)
        return mine

    for mine in parallel_map(one, _parts(values.size)):
        counts += mine
