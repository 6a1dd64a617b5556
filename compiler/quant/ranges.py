"""Activation ranges from observers: minmax, percentile, and layer-wise percentile scored from the
histogram alone (Quark's newest default: Σ h_b·|c_b − x̂(c_b)| / Σ h_b over bin centres)."""

from __future__ import annotations

import numpy as np

from compiler.exhaustive import assert_never
from compiler.ir.types import Calibration, CalibrationMethod, QType, ScoreMetric
from compiler.quant import qparams, range_search
from compiler.quant.observers import HistogramObserver, MinMaxObserver

HISTOGRAM_METHODS = (CalibrationMethod.PERCENTILE, CalibrationMethod.ENTROPY, CalibrationMethod.MSE,
                     CalibrationMethod.LAYERWISE_PERCENTILE)


def tensor_range(observer, calibration: Calibration, qtype: QType, symmetric: bool) -> tuple[float, float] | None:
    """The (rmin, rmax) to quantize a tensor with, or None when it never had a finite value."""
    if isinstance(observer, MinMaxObserver):
        return observer.range()
    match calibration.method:
        case CalibrationMethod.PERCENTILE:
            return observer.percentile_range(calibration.percentile)
        case CalibrationMethod.LAYERWISE_PERCENTILE:
            return best_percentile(observer, calibration.candidates, calibration.score_metric, qtype, symmetric)[1]
        case CalibrationMethod.ENTROPY:
            return range_search.entropy_range(observer)
        case CalibrationMethod.MSE:
            return range_search.mse_range(observer, qtype, symmetric)
        case CalibrationMethod.MINMAX:  # a histogram observer asked for minmax: its exact running range
            return observer.range()
        case _:
            assert_never(calibration.method)


def best_percentile(observer: HistogramObserver, candidates, metric: ScoreMetric, qtype: QType, symmetric: bool):
    """(chosen percentile, its range): the candidate with the lowest expected error; ties → the first."""
    if observer.counts is None or not observer.finite:
        return None, None
    edges = observer.edges()
    centres = (edges[:-1] + edges[1:]) / 2
    weights = observer.counts / observer.counts.sum()
    best: tuple[float, float | None, tuple[float, float] | None] = (np.inf, None, None)
    for p in candidates:
        found = observer.percentile_range(p)
        assert found is not None  # the observer saw finite values (checked above)
        lo, hi = found
        scale, zp = qparams.scale_zero_point(np.array(lo), np.array(hi), qtype, symmetric)
        q = qparams.quantize(centres, scale, zp, qtype, symmetric)
        err = np.abs(qparams.dequantize(q, scale, zp) - centres)
        score = float(np.sum(weights * (err if metric is ScoreMetric.MAE else err * err)))
        if score < best[0]:
            best = (score, p, (lo, hi))
    return best[1], best[2]
