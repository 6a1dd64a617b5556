"""Outlier-transform math, backend-neutral (numpy): the streaming statistics of a mapping's input, and the
scales SmoothQuant computes and AWQ searches. Weights are [out, in] (the torch layout; the ONNX backend
passes MatMul weights transposed); the scales multiply the input columns.

AWQ's search scores each candidate by the targets' output error over every calibration token,
Σ tr(ΔW·XᵀX·ΔWᵀ) with ΔW = W − Q(W·s)/s: exact for the targets' outputs (llm-compressor scores the parent
module's output on cached inputs instead), and XᵀX is the same mergeable statistic GPTQ keeps."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from compiler.ir.types import Granularity, Transform, TransformKind, WeightQuant

_EPS = 1e-5  # floor of a magnitude that becomes a divisor (llm-compressor's clamp for SmoothQuant)
Rounding = Callable[[np.ndarray, WeightQuant], np.ndarray]  # a weight [out, in] rounded and dequantized


@dataclass
class ChannelStats:
    """One mapping's input statistics: per-channel |x| maximum, and for AWQ its sum and XᵀX; the rows seen. Memory is
    flat in the number of samples; two of them merge by adding (maxima by maximum)."""
    absmax: np.ndarray
    abs_sum: np.ndarray
    gram: np.ndarray | None
    rows: int = 0

    @classmethod
    def empty(cls, channels: int, with_gram: bool) -> ChannelStats:
        """No rows yet; `with_gram` for AWQ."""
        gram = np.zeros((channels, channels), np.float32) if with_gram else None
        return cls(np.zeros(channels, np.float32), np.zeros(channels, np.float64), gram)

    def update(self, x: np.ndarray) -> None:
        """Fold a batch of activations [..., channels] in (rows with a non-finite value are left out)."""
        rows = np.asarray(x, np.float32).reshape(-1, x.shape[-1])
        finite = np.isfinite(rows).all(axis=1)
        if not finite.all():  # a copy only where rows are left out: a chunk's MLP input is a block's largest tensor
            rows = rows[finite]
        del finite
        if not rows.shape[0]:
            return
        # max |x| as max(max x, -min x): the same values without an |x| copy of the chunk (SmoothQuant needs no more)
        np.maximum(self.absmax, np.maximum(rows.max(axis=0), -rows.min(axis=0)), out=self.absmax)
        if self.gram is not None:  # AWQ: the mean |x| (its sum) and XᵀX
            self.abs_sum += np.abs(rows).sum(axis=0, dtype=np.float64)
            self.gram += rows.T @ rows
        self.rows += rows.shape[0]

    def merge(self, other: ChannelStats) -> None:
        """Add another's statistics of the same channels (torchrun's ranks: each saw its own samples); the
        maxima merge exactly, the sums in the order of the calls."""
        np.maximum(self.absmax, other.absmax, out=self.absmax)
        self.abs_sum += other.abs_sum
        if self.gram is not None and other.gram is not None:
            self.gram += other.gram
        self.rows += other.rows


def smoothquant_scales(stats: ChannelStats, weights: list[np.ndarray], alpha: float) -> np.ndarray:
    """s_j = max|x_j|^α / max_i |W_ij|^(1−α) over every target's column j (channels no token reached, or
    whose weights are all zero, keep 1)."""
    w_max = np.maximum(np.concatenate([np.abs(w) for w in weights]).max(axis=0), _EPS)
    x_max = stats.absmax.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        scales = np.maximum(x_max, _EPS) ** alpha / w_max ** (1 - alpha)
    return np.where((x_max > 0) & np.isfinite(scales), scales, 1.0).astype(np.float32)


def awq_scales(stats: ChannelStats, weights: list[np.ndarray], specs: list[WeightQuant | None], grid: int,
               duo: bool, rounding: Rounding) -> tuple[np.ndarray, float]:
    """AWQ's grid search: for ratio r in {0, 1/grid, …}, s = x̄^r / w̄^(1−r) (duo) or x̄^r, normalised to a
    geometric mean range of 1; keep the s with the lowest Σ tr(ΔW·XᵀX·ΔWᵀ) over the quantized targets (the
    identity competes too, so the search never ends worse than no transform). `rounding(w, spec)` rounds a
    weight as its target will be. Returns the scales and the relative error reduction."""
    rows = max(stats.rows, 1)
    x_mean = (stats.abs_sum / rows).astype(np.float32)
    gram = stats.gram / np.float32(rows)
    quantized = [(np.asarray(w, np.float32), spec) for w, spec in zip(weights, specs, strict=True) if spec is not None]
    w_mean = weight_magnitude(quantized)

    def loss(s: np.ndarray) -> float:
        total = 0.0
        for w, spec in quantized:
            delta = w - rounding(w * s, spec) / s
            total += float(((delta @ gram) * delta).sum())
        return total

    best = np.ones_like(x_mean)
    best_loss = baseline = loss(best)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for step in range(grid):
            r = step / grid
            s = x_mean ** r / (w_mean ** (1 - r) + 1e-4) if duo else x_mean ** r
            s = np.maximum(s, 1e-4)
            s = (s / np.sqrt(s.max() * s.min())).astype(np.float32)
            if not np.isfinite(s).all():
                continue
            value = loss(s)
            if value < best_loss:
                best, best_loss = s, value
    gain = 0.0 if baseline <= 0 or not math.isfinite(baseline) else 1 - best_loss / baseline
    return best, gain


def weight_magnitude(quantized: list[tuple[np.ndarray, WeightQuant]]) -> np.ndarray:
    """w̄_j: each weight normalised by the maximum of its quantization group, averaged over rows (AWQ)."""
    parts = []
    for w, spec in quantized:
        size = min(spec.group_size, w.shape[1]) if spec.granularity is Granularity.GROUP and spec.group_size \
            else w.shape[1]
        groups = np.abs(w).reshape(w.shape[0], -1, size)
        parts.append((groups / (groups.max(axis=-1, keepdims=True) + 1e-6)).reshape(w.shape))
    return np.concatenate(parts).mean(axis=0)


def transform_summary(t: Transform, mappings: int, gains: list[float]) -> str:
    """One line for the compile summary: what ran and, for AWQ, the mean error its search removed."""
    if t.kind is TransformKind.SMOOTHQUANT:
        return f"smoothquant (alpha {t.alpha:g}) folded into {mappings} mapping(s)"
    if t.kind is not TransformKind.AWQ:  # a plug-in's
        return f"{t.kind.name} folded into {mappings} mapping(s)"
    mean = sum(gains) / len(gains) if gains else 0.0
    return (f"awq (grid {t.grid}, duo_scaling {'on' if t.duo_scaling else 'off'}) folded into {mappings} mapping(s); "
            f"the search cut the targets' rounding error by {100 * mean:.1f}% on average")
