"""The histogram observer's compiled update (compiler/quant/histogram_kernel.py) against its numpy update
(np.histogram): the same counts, range, exponent and value counts after the same batches, on values at and
one float32 step beside every bin edge, zeros of both signs, subnormals, ranges that widen, batches split
over the cores, and the cases left to numpy (a non-finite value, bin counts or ranges without exact edges)."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest

from compiler.quant import histogram_kernel
from compiler.quant.observers import HistogramObserver


def observed(batches: list[np.ndarray], bins: int, compiled: bool) -> HistogramObserver:
    observer = HistogramObserver(bins, compiled=compiled)
    for batch in batches:
        observer.update(batch)
    return observer


def assert_same(batches: list[np.ndarray], bins: int = 2048, compiled_path: bool = True) -> None:
    """The compiled observer ends as numpy's; `compiled_path`: without calling np.histogram."""
    with mock.patch("numpy.histogram", side_effect=AssertionError("numpy binned")) if compiled_path else mock.MagicMock():
        mine = observed(batches, bins, True)
    numpy = observed(batches, bins, False)
    assert (mine.exponent, mine.finite, mine.nonfinite) == (numpy.exponent, numpy.finite, numpy.nonfinite)
    assert (mine.minmax.min, mine.minmax.max) == (numpy.minmax.min, numpy.minmax.max)
    assert mine.counts is not None and numpy.counts is not None
    assert np.array_equal(mine.counts, numpy.counts), np.flatnonzero(mine.counts != numpy.counts)[:10]


def edges_and_neighbours(threshold: float, bins: int) -> np.ndarray:
    """Every edge inside the range, and the float32 values one step below and above it."""
    edges = np.linspace(-threshold, threshold, bins + 1, dtype=np.float32)[1:-1]
    below = np.nextafter(edges, np.float32(-np.inf))
    above = np.nextafter(edges, np.float32(np.inf))
    return np.concatenate([edges, below, above]).astype(np.float32)


@pytest.mark.parametrize("bins", [16, 256, 2048])
def test_values_on_and_beside_every_edge(bins):
    values = np.concatenate([edges_and_neighbours(4.0, bins), np.float32([3.9999998, -3.9999998])])
    assert_same([values], bins)


def test_zeros_tiny_values_and_subnormals():
    values = np.float32([0.0, -0.0, 1e-30, -1e-30, 1e-40, -1e-40, 1e-45, -1e-45, 3.0, -2.5])
    assert_same([values])
    assert_same([np.float32([0.0, -0.0])], compiled_path=False)  # a zero range: exponent -126, numpy bins it


def test_batches_that_widen_the_range():
    rng = np.random.default_rng(7)
    batches = [(rng.standard_normal(5000) * scale).astype(np.float32) for scale in (0.01, 1.0, 0.5, 300.0, 2.0)]
    batches.append(edges_and_neighbours(1024.0, 2048))
    assert_same(batches)


def test_batches_split_over_the_cores():
    rng = np.random.default_rng(3)
    big = (rng.standard_normal(93 * (3 * histogram_kernel.TASK_VALUES // 93 + 1)) * 5).astype(np.float32)
    assert_same([big.reshape(-1, 93)[:, :50], big])  # a strided view, then contiguous


@pytest.mark.parametrize("odd", ["nonfinite", "bins", "huge", "tiny"])
def test_cases_left_to_numpy(odd):
    rng = np.random.default_rng(5)
    values = rng.standard_normal(4000).astype(np.float32)
    bins = 2048
    if odd == "nonfinite":
        values[[3, 9, 11]] = [np.inf, -np.inf, np.nan]
    elif odd == "bins":
        bins = 48  # not a power of two: numpy's linspace edges are rounded
    elif odd == "huge":
        values *= np.float32(1e36)
    else:
        values *= np.float32(1e-35)
    assert_same([values, rng.standard_normal(100).astype(np.float32)], bins, compiled_path=False)


def test_exact_edges_rule():
    assert histogram_kernel.exact_edges(2048, 0) and histogram_kernel.exact_edges(16, -100)
    assert not histogram_kernel.exact_edges(48, 0)
    assert not histogram_kernel.exact_edges(2048, 120) and not histogram_kernel.exact_edges(2048, -120)
