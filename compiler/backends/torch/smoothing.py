"""AWQ and SmoothQuant on the torch backend (compiler/resolve/smoothing.py resolved the mappings; the scales
are compiler/quant/smoothing.py's): hooks gather each mapping's input statistics over the calibration
stream, and the scales are folded into the modules in place, before the block's own calibration sees it."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from compiler.backends.torch.experts import remove_hooks, set_routing
from compiler.ir.kinds import TransformData
from compiler.ir.types import Calibration, Transform
from compiler.quant.smoothing import ChannelStats
from compiler.resolve.smoothing import SmoothingMapping, SourceKind


@dataclass
class SmoothingStatistics:
    """Hooks gathering ChannelStats for `mappings`: a norm's output (what every target reads, before any
    MoE routing), or the first target's input where the source is a Linear (down reads act(gate)·up)."""
    root: nn.Module
    mappings: list[SmoothingMapping]
    modules: dict[str, str]  # index name (checkpoint) → module name
    transform: Transform
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
        remove_hooks(self.root, self._handles)

    def _update(self, m: SmoothingMapping, x: torch.Tensor) -> None:
        if m.source not in self.stats:
            self.stats[m.source] = ChannelStats.empty(x.shape[-1], self.transform.data is TransformData.GRAM,
                                                      self.transform.alpha_search)
        self.stats[m.source].update(x.detach().float().cpu().numpy())

    def _output_hook(self, m: SmoothingMapping):
        def hook(module, args, output):
            self._update(m, output[0] if isinstance(output, (tuple, list)) else output)
        return hook

    def _input_hook(self, m: SmoothingMapping):
        def hook(module, args):
            self._update(m, args[0])
        return hook


def fold(source: nn.Module, kind: SourceKind, targets: list[nn.Module], scales, offset: float = 0.0) -> None:
    """Divide the source's output channels by `scales` and multiply the targets' input columns by them, in
    place. `offset`: a norm computing x·(offset + w) (Gemma's 1 + w) keeps that form."""
    weight = _tensor(source, "weight")
    bias = getattr(source, "bias", None)
    scales = torch.as_tensor(scales)
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
