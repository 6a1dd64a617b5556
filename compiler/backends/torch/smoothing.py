"""AWQ and SmoothQuant on the torch backend (compiler/resolve/smoothing.py resolved the mappings).

Per mapping, streaming statistics of the activations the targets read — per-channel |x| maxima
(SmoothQuant), per-channel mean |x| and XᵀX (AWQ) — are gathered by hooks over the calibration stream,
so their memory is flat in the number of samples. Scales come from them; the source's output channels are
divided by the scales (a norm's weight and bias, or a Linear's rows) and the targets' input columns
multiplied by them, in place, before the block's own calibration sees it. The float model computes the same.

AWQ's search scores each candidate by the targets' output error over every calibration token,
Σ tr(ΔW·XᵀX·ΔWᵀ) with ΔW = W − Q(W·s)/s: exact for the targets' outputs (llm-compressor scores the
parent module's output on cached inputs instead), and XᵀX is the same mergeable statistic GPTQ keeps."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from compiler.backends.torch.experts import set_routing
from compiler.ir.types import Calibration, Granularity, QType, Transform, TransformKind, WeightQuant
from compiler.quant.qparams import qrange
from compiler.resolve.smoothing import SmoothingMapping, SourceKind

_EPS = 1e-5  # floor of a magnitude that becomes a divisor (llm-compressor's clamp for SmoothQuant)


@dataclass
class ChannelStats:
    """One mapping's input statistics: per-channel |x| maximum and sum, XᵀX (AWQ), the rows seen."""
    absmax: torch.Tensor
    abs_sum: torch.Tensor
    gram: torch.Tensor | None
    rows: int = 0

    def update(self, x: torch.Tensor) -> None:
        """Fold a batch of activations [..., channels] in (rows with a non-finite value are left out)."""
        rows = x.detach().reshape(-1, x.shape[-1]).float()
        rows = rows[torch.isfinite(rows).all(dim=1)]
        if not rows.shape[0]:
            return
        magnitude = rows.abs()
        torch.maximum(self.absmax, magnitude.amax(dim=0).to(self.absmax.device), out=self.absmax)
        self.abs_sum += magnitude.sum(dim=0, dtype=torch.float64).to(self.abs_sum.device)
        if self.gram is not None:
            self.gram.addmm_(rows.T.to(self.gram.device), rows.to(self.gram.device))
        self.rows += rows.shape[0]


@dataclass
class SmoothingStatistics:
    """Hooks gathering ChannelStats for `mappings`: a norm's output (what every target reads, before any
    MoE routing), or the first target's input where the source is a Linear (down reads act(gate)·up)."""
    root: nn.Module
    mappings: list[SmoothingMapping]
    modules: dict[str, str]  # index name (checkpoint) → module name
    kind: TransformKind
    calibration: Calibration
    stats: dict[str, ChannelStats] = field(default_factory=dict)
    _handles: list = field(default_factory=list)

    def __enter__(self) -> SmoothingStatistics:
        for m in self.mappings:
            if m.kind is SourceKind.NORM:
                module = self.root.get_submodule(self.modules[m.source])
                self._handles.append(module.register_forward_hook(self._output_hook(m)))
            else:
                module = self.root.get_submodule(self.modules[m.targets[0]])
                self._handles.append(module.register_forward_pre_hook(self._input_hook(m)))
        set_routing(self.root, self.calibration.experts)
        return self

    def __exit__(self, *exc) -> None:
        from compiler.ir.types import ExpertRouting

        set_routing(self.root, ExpertRouting.ROUTED)
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _stats(self, m: SmoothingMapping, x: torch.Tensor) -> ChannelStats:
        if m.source not in self.stats:
            k = x.shape[-1]
            gram = torch.zeros(k, k, dtype=torch.float32, device=x.device) if self.kind is TransformKind.AWQ else None
            self.stats[m.source] = ChannelStats(torch.zeros(k, device=x.device),
                                                torch.zeros(k, dtype=torch.float64, device=x.device), gram)
        return self.stats[m.source]

    def _output_hook(self, m: SmoothingMapping):
        def hook(module, args, output):
            x = output[0] if isinstance(output, (tuple, list)) else output
            self._stats(m, x).update(x)
        return hook

    def _input_hook(self, m: SmoothingMapping):
        def hook(module, args):
            self._stats(m, args[0]).update(args[0])
        return hook


def smoothquant_scales(stats: ChannelStats, weights: list[torch.Tensor], alpha: float) -> torch.Tensor:
    """s_j = max|x_j|^α / max_i |W_ij|^(1−α) over every target's column j (channels no token reached, or
    whose weights are all zero, keep 1)."""
    w_max = torch.cat([w.detach().float().abs() for w in weights]).amax(dim=0).clamp(min=_EPS)
    x_max = stats.absmax.float().to(w_max.device)
    scales = x_max.clamp(min=_EPS).pow(alpha) / w_max.pow(1 - alpha)
    return torch.where((x_max > 0) & torch.isfinite(scales), scales, torch.ones_like(scales))


def awq_scales(stats: ChannelStats, weights: list[torch.Tensor], specs: list[WeightQuant | None], grid: int,
               duo: bool, rounding) -> tuple[torch.Tensor, float]:
    """AWQ's grid search: for ratio r in {0, 1/grid, …}, s = x̄^r / w̄^(1−r) (duo) or x̄^r, normalised to a
    geometric mean range of 1; keep the s with the lowest Σ tr(ΔW·XᵀX·ΔWᵀ) over the quantized targets (the
    identity competes too, so the search never ends worse than no transform). `rounding(w, spec)` rounds a
    weight as its target will be. Returns the scales and the relative error reduction."""
    device = weights[0].device
    x_mean = (stats.abs_sum / max(stats.rows, 1)).float().to(device)
    gram = stats.gram.to(device) / max(stats.rows, 1)
    quantized = [(w.detach().float(), spec) for w, spec in zip(weights, specs, strict=True) if spec is not None]
    w_mean = _weight_magnitude(quantized)

    def loss(s: torch.Tensor) -> float:
        total = 0.0
        for w, spec in quantized:
            delta = w - rounding(w * s, spec) / s
            total += float(((delta @ gram) * delta).sum())
        return total

    ones = torch.ones_like(x_mean)
    best, best_loss = ones, loss(ones)
    baseline = best_loss
    for step in range(grid):
        r = step / grid
        s = (x_mean.pow(r) / (w_mean.pow(1 - r) + 1e-4)) if duo else x_mean.pow(r)
        s = s.clamp(min=1e-4)
        s = s / (s.max() * s.min()).sqrt()
        if not bool(torch.isfinite(s).all()):
            continue
        value = loss(s)
        if value < best_loss:
            best, best_loss = s, value
    gain = 0.0 if baseline <= 0 or not math.isfinite(baseline) else 1 - best_loss / baseline
    return best, gain


def _weight_magnitude(quantized: list[tuple[torch.Tensor, WeightQuant]]) -> torch.Tensor:
    """w̄_j: each weight normalised by the maximum of its quantization group, averaged over rows (AWQ)."""
    parts = []
    for w, spec in quantized:
        size = min(spec.group_size, w.shape[1]) if spec.granularity is Granularity.GROUP and spec.group_size \
            else w.shape[1]
        groups = w.abs().reshape(w.shape[0], -1, size)
        parts.append((groups / (groups.amax(dim=-1, keepdim=True) + 1e-6)).reshape(w.shape))
    return torch.cat(parts).mean(dim=0)


def fake_round(w: torch.Tensor, spec: WeightQuant) -> torch.Tensor:
    """An integer weight rounded and dequantized as the torch backend stores it (compressed-tensors'
    convention: symmetric absmax / (range/2) over the full signed range, or min/max with a zero point), per
    tensor, channel or group; the search's stand-in for the final rounding (rtn)."""
    qmin, qmax = qrange(spec.qtype, False)
    size = {Granularity.GROUP: spec.group_size, Granularity.PER_TENSOR: w.numel()}.get(spec.granularity, w.shape[1])
    rows = w.reshape(-1, size)
    low = rows.amin(dim=1, keepdim=True).clamp(max=0)
    high = rows.amax(dim=1, keepdim=True).clamp(min=0)
    if spec.symmetric:
        scale = torch.maximum(-low, high) / ((qmax - qmin) / 2)
        zero = torch.zeros_like(scale)
    else:
        scale = (high - low) / (qmax - qmin)
    scale = scale.clamp(min=torch.finfo(torch.float32).tiny)
    if not spec.symmetric:
        zero = torch.clamp(torch.round(qmin - low / scale), qmin, qmax)
    q = torch.clamp(torch.round(rows / scale) + zero, qmin, qmax)
    return ((q - zero) * scale).reshape(w.shape)


def integer_spec(spec: WeightQuant | None) -> bool:
    """Whether fake_round stands for the scheme exactly (integers per tensor, channel or group)."""
    return spec is not None and not spec.qtype.is_float and spec.granularity is not Granularity.BLOCK \
        and spec.qtype in (QType.INT4, QType.UINT4, QType.INT8, QType.UINT8)


def fold(source: nn.Module, kind: SourceKind, targets: list[nn.Module], scales: torch.Tensor,
         offset: float = 0.0) -> None:
    """Divide the source's output channels by `scales` and multiply the targets' input columns by them, in
    place. `offset`: a norm computing x·(offset + w) (Gemma's 1 + w) keeps that form."""
    weight = _tensor(source, "weight")
    bias = getattr(source, "bias", None)
    with torch.no_grad():
        s = scales.to(weight.device, weight.dtype)
        if kind is SourceKind.NORM:
            weight.copy_((offset + weight) / s - offset)
        else:
            weight.div_(s.view(-1, 1))
        if isinstance(bias, torch.Tensor):
            bias.div_(s)
        for target in targets:
            w = _tensor(target, "weight")
            w.mul_(scales.to(w.device, w.dtype).view(1, -1))


def _tensor(module: nn.Module, name: str) -> torch.Tensor:
    value = getattr(module, name)
    assert isinstance(value, torch.Tensor)
    return value


def norm_offset(module: nn.Module) -> float:
    """1 for the norms that compute x·(1 + w) (Gemma's RMSNorm), else 0."""
    return 1.0 if "Gemma" in type(module).__name__ and "Norm" in type(module).__name__ else 0.0


def transform_summary(t: Transform, mappings: int, gains: list[float]) -> str:
    """One line for the compile summary: what ran and, for AWQ, the mean error its search removed."""
    if t.kind is TransformKind.SMOOTHQUANT:
        return f"smoothquant (alpha {t.alpha:g}) folded into {mappings} mapping(s)"
    mean = sum(gains) / len(gains) if gains else 0.0
    return (f"awq (grid {t.grid}, duo_scaling {'on' if t.duo_scaling else 'off'}) folded into {mappings} mapping(s); "
            f"the search cut the targets' rounding error by {100 * mean:.1f}% on average")
