"""Streaming observers: O(bins) state per tensor, never the activations; non-finite values (masks use
-inf) are counted and excluded; two observers of one tensor merge exactly.

The histogram's range is a power of two [-2^e, 2^e] with an even bin count. Widening doubles it,
merging adjacent bin pairs into the central half: the old edges are a superset of the new ones, so the
result equals binning all the data at the final range, whatever the chunking or the merge order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

DEFAULT_BINS = 2048


@dataclass
class MinMaxObserver:
    """Running min and max of the finite values, and a count of the others."""
    min: float = math.inf
    max: float = -math.inf
    finite: int = 0
    nonfinite: int = 0

    def update(self, x: np.ndarray) -> None:
        """Add a batch."""
        finite = _finite(x, self)
        if finite.size:
            self.min = min(self.min, float(finite.min()))
            self.max = max(self.max, float(finite.max()))

    def merge(self, other: MinMaxObserver) -> None:
        """Add another observer's state (exactly mergeable)."""
        self.min, self.max = min(self.min, other.min), max(self.max, other.max)
        self.finite += other.finite
        self.nonfinite += other.nonfinite

    def range(self) -> tuple[float, float] | None:
        """(min, max), or None when nothing finite was seen."""
        return (self.min, self.max) if self.finite else None


def _finite(x: np.ndarray, obs) -> np.ndarray:
    flat = np.asarray(x, dtype=np.float32).reshape(-1)
    mask = np.isfinite(flat)
    kept = flat if mask.all() else flat[mask]
    obs.finite += kept.size
    obs.nonfinite += flat.size - kept.size
    return kept


@dataclass
class HistogramObserver:
    """A histogram of |x| over a power-of-two range that widens by merging bin pairs (exactly mergeable)."""
    bins: int = DEFAULT_BINS
    counts: np.ndarray | None = None
    exponent: int = 0  # the range is [-2^exponent, 2^exponent]
    minmax: MinMaxObserver = field(default_factory=MinMaxObserver)
    compiled: bool = False  # batches binned by quant/histogram_kernel.py (numba; the same counts)

    def __post_init__(self) -> None:
        if self.bins % 2 or self.bins < 16:
            raise ValueError("bins must be even and at least 16")

    @property
    def threshold(self) -> float:
        """The histogram's upper edge."""
        return math.ldexp(1.0, self.exponent)

    @property
    def finite(self) -> int:
        """Finite values seen."""
        return self.minmax.finite

    @property
    def nonfinite(self) -> int:
        """Non-finite values seen (excluded from the histogram)."""
        return self.minmax.nonfinite

    def update(self, x: np.ndarray) -> None:
        """Add a batch, widening the range first when needed."""
        if self.compiled and self._compiled_update(x):
            return
        finite = _finite(x, self.minmax)
        if not finite.size:
            return
        self.minmax.min = min(self.minmax.min, float(finite.min()))
        self.minmax.max = max(self.minmax.max, float(finite.max()))
        self._cover(max(abs(self.minmax.min), abs(self.minmax.max)))
        th = self.threshold
        counts, _ = np.histogram(finite, self.bins, range=(-th, th))
        self.counts += counts

    def _compiled_update(self, x: np.ndarray) -> bool:
        """update() by the compiled loop; False, with nothing added, where numpy's rule must decide (a
        non-finite value, edges the loop does not take)."""
        from compiler.quant import histogram_kernel  # numba: only where a run asked for it

        flat = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
        if not flat.size:
            return True
        seen = histogram_kernel.finite_range(flat)
        if seen is None:
            return False
        lo, hi = min(self.minmax.min, seen[0]), max(self.minmax.max, seen[1])
        needed = _exponent(max(abs(lo), abs(hi)))
        if not histogram_kernel.exact_edges(self.bins, needed if self.counts is None else max(needed, self.exponent)):
            return False
        self.minmax.min, self.minmax.max = lo, hi
        self.minmax.finite += flat.size
        self._cover(max(abs(lo), abs(hi)))
        assert self.counts is not None  # made by _cover
        histogram_kernel.add_counts(flat, self.threshold, self.counts)
        return True

    def _cover(self, absmax: float) -> None:
        needed = _exponent(absmax)
        if self.counts is None:
            self.counts, self.exponent = np.zeros(self.bins, np.int64), needed
        while self.exponent < needed:
            self._double()

    def _double(self) -> None:
        assert self.counts is not None  # doubled only once something was observed
        pairs = self.counts.reshape(-1, 2).sum(axis=1)  # bins/2 values covering the old range
        quarter = self.bins // 4
        grown = np.zeros(self.bins, np.int64)
        grown[quarter:quarter + pairs.size] = pairs
        self.counts, self.exponent = grown, self.exponent + 1

    def merge(self, other: HistogramObserver) -> None:
        """Add another observer's counts (same bins after widening)."""
        if other.counts is None:
            self.minmax.merge(other.minmax)
            return
        if self.counts is None:
            self.counts, self.exponent = other.counts.copy(), other.exponent
            self.minmax.merge(other.minmax)
            return
        theirs = HistogramObserver(self.bins, other.counts.copy(), other.exponent)
        while theirs.exponent < self.exponent:
            theirs._double()
        while self.exponent < theirs.exponent:
            self._double()
        self.counts += theirs.counts
        self.minmax.merge(other.minmax)

    def edges(self) -> np.ndarray:
        """The bin edges."""
        th = self.threshold
        return np.linspace(-th, th, self.bins + 1)

    def abs_histogram(self) -> tuple[np.ndarray, np.ndarray]:
        """Counts of |x| over [0, 2^e] (bins/2 bins) and their edges: the symmetric halves folded."""
        half = self.bins // 2
        assert self.counts is not None, "a histogram exists once something finite was observed"
        counts = self.counts[half:] + self.counts[:half][::-1]
        return counts, np.linspace(0.0, self.threshold, half + 1)

    def percentile_range(self, percentile: float) -> tuple[float, float] | None:
        """Symmetric on |x| (docs/recipe-language.md, `calibrate`): ±edge at the percentile, clamped to the observed min/max."""
        if self.counts is None or not self.finite:
            return None
        counts, edges = self.abs_histogram()
        cdf = np.cumsum(counts) / counts.sum()
        index = int(np.searchsorted(cdf, percentile / 100.0))
        th = float(edges[min(index + 1, len(edges) - 1)])
        return max(-th, self.minmax.min), min(th, self.minmax.max)


def _exponent(absmax: float) -> int:
    """The smallest e with 2^e > absmax (a zero range: float32's smallest normal exponent)."""
    return math.frexp(absmax)[1] if absmax > 0 else -126


def make_observer(histogram: bool, bins: int = DEFAULT_BINS, compiled: bool = False):
    """A histogram observer for histogram methods, else a min/max one. `compiled`: its batches binned by the
    compiled loop (the same counts; numba loaded, which the torch backend's plans count)."""
    return HistogramObserver(bins, compiled=compiled) if histogram else MinMaxObserver()
