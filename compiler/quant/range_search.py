"""Range searches over a histogram, vectorised over every candidate threshold at once.

entropy (KL): for each threshold i, the 2i+1 central bins with the outliers folded into the end bins
are P; P merged into Q quantized bins and expanded back over P's non-zero bins is Q; both smoothed
(eps 1e-4); the threshold with the lowest KL(P‖Q) wins (TensorRT's procedure, as onnxruntime's).
mse: the threshold whose quantize→dequantize has the lowest expected squared error over the bins.
"""

from __future__ import annotations

import numpy as np

from compiler.ir.types import QType
from compiler.quant import qparams
from compiler.quant.observers import HistogramObserver

QUANTIZED_BINS = 128
EPS = 1e-4
ROWS_PER_BLOCK = 128  # thresholds evaluated together: bounds the temporaries to a few MB


def entropy_range(observer: HistogramObserver, quantized_bins: int = QUANTIZED_BINS) -> tuple[float, float] | None:
    """The range minimising the KL divergence between the histogram and its quantized form (TensorRT's entropy method)."""
    if observer.counts is None or not observer.finite:
        return None
    hist = observer.counts.astype(np.float64)
    nb, zero = hist.size, hist.size // 2
    first = min(quantized_bins // 2, zero)
    thresholds = np.arange(first, zero + 1)
    kl = np.concatenate([_kl_block(hist, zero, block, quantized_bins)
                         for block in np.array_split(thresholds, max(1, len(thresholds) // ROWS_PER_BLOCK))])
    best = int(thresholds[int(np.argmin(kl))])
    edges = observer.edges()
    lo, hi = float(edges[zero - best]), float(edges[min(zero + best + 1, nb)])
    return max(lo, observer.minmax.min), min(hi, observer.minmax.max)


def _kl_block(hist: np.ndarray, zero: int, thresholds: np.ndarray, qbins: int) -> np.ndarray:
    """KL(P‖Q) for a block of thresholds, as [rows] (inf where P or Q cannot be smoothed)."""
    nb = hist.size
    rows = thresholds.size
    starts = zero - thresholds
    ends = np.minimum(zero + thresholds + 1, nb)
    lengths = ends - starts
    width = int(lengths.max())
    cols = np.arange(width)
    valid = cols[None, :] < lengths[:, None]
    index = np.clip(starts[:, None] + cols[None, :], 0, nb - 1)
    p = np.where(valid, hist[index], 0.0)
    cumulative = np.concatenate([[0.0], np.cumsum(hist)])
    p[:, 0] += cumulative[starts]  # left outliers
    last = lengths - 1
    p[np.arange(rows), last] += cumulative[nb] - cumulative[ends]  # right outliers
    merged = np.maximum(lengths // qbins, 1)
    group = np.minimum(cols[None, :] // merged[:, None], qbins - 1)
    flat = (np.arange(rows)[:, None] * qbins + group)[valid]
    sums = np.bincount(flat, weights=p[valid], minlength=rows * qbins).reshape(rows, qbins)
    nonzero = (p != 0) & valid
    counts = np.bincount(flat, weights=nonzero[valid].astype(np.float64), minlength=rows * qbins).reshape(rows, qbins)
    per_bin = np.take_along_axis(sums, group, axis=1) / np.maximum(np.take_along_axis(counts, group, axis=1), 1)
    q = np.where(nonzero, per_bin, 0.0)
    p_s, ok_p = _smooth(p, valid)
    q_s, ok_q = _smooth(q, valid)
    p_n = p_s / p_s.sum(axis=1, keepdims=True)
    q_n = q_s / np.where(q_s.sum(axis=1, keepdims=True) > 0, q_s.sum(axis=1, keepdims=True), 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(valid & (p_n > 0), p_n * np.log(p_n / q_n), 0.0)
    kl = terms.sum(axis=1)
    return np.where(ok_p & ok_q, kl, np.inf)


def _smooth(dist: np.ndarray, valid: np.ndarray):
    """Give zero bins eps, taken proportionally from the non-zero ones; rows that cannot be smoothed fail."""
    is_zero = (dist == 0) & valid
    is_nonzero = (dist != 0) & valid
    n_zero, n_nonzero = is_zero.sum(axis=1), is_nonzero.sum(axis=1)
    eps1 = EPS * n_zero / np.maximum(n_nonzero, 1)
    smoothed = dist + EPS * is_zero - eps1[:, None] * is_nonzero
    ok = (n_nonzero > 0) & ~np.any(smoothed < 0, axis=1)
    return np.where(valid, smoothed, 0.0), ok


def mse_range(observer: HistogramObserver, qtype: QType, symmetric: bool, candidates: int = 256) -> tuple[float, float] | None:
    """The symmetric threshold (clamped to the observed range) with the lowest expected squared error."""
    if observer.counts is None or not observer.finite:
        return None
    edges = observer.edges()
    centres = (edges[:-1] + edges[1:]) / 2
    weights = observer.counts / observer.counts.sum()
    absmax = max(abs(observer.minmax.min), abs(observer.minmax.max))
    ths = absmax * np.arange(1, candidates + 1) / candidates
    lo = np.maximum(-ths, observer.minmax.min)
    hi = np.minimum(ths, observer.minmax.max)
    scale, zp = qparams.scale_zero_point(lo, hi, qtype, symmetric)
    q = np.clip(np.round(centres[None, :] / scale[:, None]) + zp[:, None], *qparams.qrange(qtype, False))
    err = ((q - zp[:, None]) * scale[:, None] - centres[None, :]) ** 2
    best = int(np.argmin(err @ weights))
    return float(lo[best]), float(hi[best])

