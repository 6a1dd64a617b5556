"""Outlier-transform math, backend-neutral (numpy): the streaming statistics of a mapping's input, and the
scales SmoothQuant computes and AWQ searches. Weights are [out, in] (the torch layout; the ONNX backend
passes MatMul weights transposed); the scales multiply the input columns.

AWQ's search scores each candidate by the targets' output error over every calibration token,
Σ tr(ΔW·XᵀX·ΔWᵀ) with ΔW = W − Q(W·s)/s: exact for the targets' outputs (llm-compressor scores the parent
module's output on cached inputs instead), and XᵀX is the same mergeable statistic GPTQ keeps. SmoothQuant's
searched strength (`alpha search`) adds what rounding the scaled inputs x/s costs: the rounding noise of an
integer grid is uniform, step²/12 per input, so the targets' outputs gain ‖Q(W·s)‖²·step²/12 per token, with
the step of a static range from the per-channel extremes and a dynamic one's from a sample of the rows."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from compiler.ir.types import (
    ActivationMode,
    ActivationQuant,
    Granularity,
    Scheme,
    Transform,
    TransformKind,
    WeightQuant,
)

_EPS = 1e-5  # floor of a magnitude that becomes a divisor (llm-compressor's clamp for SmoothQuant)
Rounding = Callable[[np.ndarray, WeightQuant], np.ndarray]  # a weight [out, in] rounded and dequantized
# A searched SmoothQuant strength estimates dynamic (per-token) input steps from every SAMPLE_STRIDE-th row of
# the stream, at most SAMPLE_ROWS of them: K×512 float32, less than the K×K XᵀX beside it wherever K ≥ 512. A
# prime stride: one dividing the sequence length would take every sequence's first token, often its largest.
SAMPLE_ROWS = 512
SAMPLE_STRIDE = 17


@dataclass
class ChannelStats:
    """One mapping's input statistics: per-channel |x| maximum (and the signed extremes), for AWQ and a searched
    SmoothQuant strength the |x| sum and XᵀX, for the latter a sample of rows; the rows seen. Memory is flat in
    the number of samples; two of them merge by adding (extremes by maximum, samples up to SAMPLE_ROWS)."""
    absmax: np.ndarray
    abs_sum: np.ndarray
    gram: np.ndarray | None
    rows: int = 0
    high: np.ndarray | None = None  # per-channel max x (a static asymmetric range's top)
    low: np.ndarray | None = None  # per-channel min x
    sample: np.ndarray | None = None  # [≤ SAMPLE_ROWS, channels] rows kept for per-token steps (None: not kept)

    @classmethod
    def empty(cls, channels: int, with_gram: bool, with_sample: bool = False) -> ChannelStats:
        """No rows yet; `with_gram` for AWQ and a searched strength, `with_sample` for the latter."""
        gram = np.zeros((channels, channels), np.float32) if with_gram else None
        sample = np.zeros((0, channels), np.float32) if with_sample else None
        return cls(np.zeros(channels, np.float32), np.zeros(channels, np.float64), gram,
                   high=np.full(channels, -np.inf, np.float32), low=np.full(channels, np.inf, np.float32),
                   sample=sample)

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
        high, low = rows.max(axis=0), rows.min(axis=0)
        np.maximum(self.absmax, np.maximum(high, -low), out=self.absmax)
        if self.high is not None and self.low is not None:
            np.maximum(self.high, high, out=self.high)
            np.minimum(self.low, low, out=self.low)
        if self.gram is not None:  # AWQ: the mean |x| (its sum) and XᵀX
            self.abs_sum += np.abs(rows).sum(axis=0, dtype=np.float64)
            self.gram += rows.T @ rows
        if self.sample is not None and len(self.sample) < SAMPLE_ROWS:
            first = -self.rows % SAMPLE_STRIDE  # the stream's rows 0, STRIDE, 2·STRIDE, … whatever the chunks
            kept = rows[first::SAMPLE_STRIDE][:SAMPLE_ROWS - len(self.sample)]
            self.sample = np.concatenate([self.sample, kept])
        self.rows += rows.shape[0]

    def merge(self, other: ChannelStats) -> None:
        """Add another's statistics of the same channels (torchrun's ranks: each saw its own samples); the
        maxima merge exactly, the sums in the order of the calls."""
        np.maximum(self.absmax, other.absmax, out=self.absmax)
        if self.high is not None and other.high is not None and self.low is not None and other.low is not None:
            np.maximum(self.high, other.high, out=self.high)
            np.minimum(self.low, other.low, out=self.low)
        self.abs_sum += other.abs_sum
        if self.gram is not None and other.gram is not None:
            self.gram += other.gram
        if self.sample is not None and other.sample is not None:
            self.sample = np.concatenate([self.sample, other.sample])[:SAMPLE_ROWS]
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


def searched_smoothquant_scales(stats: ChannelStats, weights: list[np.ndarray], schemes: list[Scheme | None],
                                grid: int, rounding: Rounding) -> tuple[np.ndarray, float | None, float]:
    """SmoothQuant's strength searched per mapping: α = 0, 1/grid, …, 1 (and the identity) each give
    smoothquant_scales' s, scored by the quantized targets' output error per token: the weights' rounding
    error Σ tr(ΔW·XᵀX·ΔWᵀ)/rows and the inputs' ‖Q(W·s)‖²·noise(x/s) (input_noise). `schemes`: each target's
    (None or `none`: left float, not scored). Returns the scales, the α kept (None: the identity won) and the
    relative error reduction against the identity."""
    quantized = [(np.asarray(w, np.float32), scheme.weights, scheme.activations)
                 for w, scheme in zip(weights, schemes, strict=True) if scheme is not None and scheme.weights]
    gram = stats.gram / np.float32(max(stats.rows, 1)) if stats.gram is not None else None

    def loss(s: np.ndarray) -> float:
        return estimated_error(stats, gram, quantized, s, rounding)

    best, best_alpha = np.ones(stats.absmax.shape, np.float32), None
    best_loss = baseline = loss(best)
    for step in range(grid + 1):
        alpha = step / grid
        s = smoothquant_scales(stats, weights, alpha)
        value = loss(s)
        if value < best_loss:
            best, best_alpha, best_loss = s, alpha, value
    gain = 0.0 if baseline <= 0 or not math.isfinite(baseline) else 1 - best_loss / baseline
    return best, best_alpha, gain


def estimated_error(stats: ChannelStats, gram: np.ndarray | None,
                    quantized: list[tuple[np.ndarray, WeightQuant, ActivationQuant | None]], s: np.ndarray,
                    rounding: Rounding) -> float:
    """The quantized targets' squared output error per token under scales `s` (`gram`: XᵀX per row): for each
    target, tr(ΔW·G·ΔWᵀ) with ΔW = W − Q(W·s)/s, plus ‖Q(W·s)‖²·input_noise (the two are independent to first
    order)."""
    total = 0.0
    for w, spec, act in quantized:
        scaled = rounding(w * s, spec)
        if gram is not None:
            delta = w - scaled / s
            total += float(((delta @ gram) * delta).sum())
        total += float(np.square(scaled, dtype=np.float64).sum()) * input_noise(act, stats, s)
    return total


def input_noise(act: ActivationQuant | None, stats: ChannelStats, s: np.ndarray) -> float:
    """The mean square of rounding x/s to the inputs' integer grid, step²/12 (uniform noise): a static range per
    tensor from the per-channel extremes (max |x/s| symmetric, max − min asymmetric), a dynamic one per token
    (or group) from the sampled rows. Unquantized inputs add nothing, nor do floating formats (their rounding
    error is relative to each value, about the same whatever s is)."""
    if act is None or act.qtype.is_float:
        return 0.0
    levels = 2 ** act.qtype.bits - 1
    if act.mode is ActivationMode.STATIC and act.granularity is Granularity.PER_TENSOR:
        if act.symmetric or stats.high is None or stats.low is None:
            step = float((stats.absmax / s).max()) / (levels // 2)
        else:
            step = (max(float((stats.high / s).max()), 0.0) - min(float((stats.low / s).min()), 0.0)) / levels
        return step * step / 12
    if stats.sample is None or not len(stats.sample):
        return 0.0
    x = stats.sample / s
    width = act.group if act.granularity is Granularity.GROUP else x.shape[1]
    x = x.reshape(x.shape[0], -1, width) if x.shape[1] % width == 0 else x[:, None, :]
    ranges = np.abs(x).max(axis=-1) / (levels // 2) if act.symmetric else (x.max(axis=-1) - x.min(axis=-1)) / levels
    return float(np.mean(np.square(ranges, dtype=np.float64))) / 12


def weight_magnitude(quantized: list[tuple[np.ndarray, WeightQuant]]) -> np.ndarray:
    """w̄_j: each weight normalised by the maximum of its quantization group, averaged over rows (AWQ)."""
    parts = []
    for w, spec in quantized:
        size = min(spec.group_size, w.shape[1]) if spec.granularity is Granularity.GROUP and spec.group_size \
            else w.shape[1]
        groups = np.abs(w).reshape(w.shape[0], -1, size)
        parts.append((groups / (groups.max(axis=-1, keepdims=True) + 1e-6)).reshape(w.shape))
    return np.concatenate(parts).mean(axis=0)


def transform_summary(t: Transform, mappings: int, gains: list[float], alphas: list[float | None] | None = None) -> str:
    """One line for the compile summary: what ran and, for AWQ and a searched SmoothQuant strength, the mean
    error the search removed (`alphas`: the strength each mapping kept, None where the identity won)."""
    if t.kind is TransformKind.SMOOTHQUANT and t.alpha_search:
        return searched_summary(t, mappings, gains, alphas or [])
    if t.kind is TransformKind.SMOOTHQUANT:
        turned = "; then each down projection's input turned online by a random Hadamard (R4)" if t.online else ""
        return f"smoothquant (alpha {t.alpha:g}) folded into {mappings} mapping(s){turned}"
    if t.kind is not TransformKind.AWQ:  # a plug-in's
        return f"{t.kind.name} folded into {mappings} mapping(s)"
    mean = sum(gains) / len(gains) if gains else 0.0
    return (f"awq (grid {t.grid}, duo_scaling {'on' if t.duo_scaling else 'off'}) folded into {mappings} mapping(s); "
            f"the search cut the targets' rounding error by {100 * mean:.1f}% on average")


def searched_summary(t: Transform, mappings: int, gains: list[float], alphas: list[float | None]) -> str:
    """A searched SmoothQuant strength's summary line: the strengths kept and the mean error removed."""
    kept = sorted(a for a in alphas if a is not None)
    spread = "" if not kept else f"{kept[0]:g}" if kept[0] == kept[-1] else \
        f"{kept[0]:g}-{kept[-1]:g}, median {kept[len(kept) // 2]:g}"
    unscaled = len(alphas) - len(kept)
    left = f"; {unscaled} left unscaled" if unscaled else ""
    mean = sum(gains) / len(gains) if gains else 0.0
    return (f"smoothquant (alpha searched over {t.grid + 1} strengths: {spread or 'none kept'}{left}) folded into "
            f"{mappings} mapping(s); the search cut the targets' estimated error by {100 * mean:.1f}% on average")
