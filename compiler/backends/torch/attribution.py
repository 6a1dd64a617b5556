"""Which layers cost the most, on the torch backend: while the quantized verification stream runs through a
block, each quantized Linear's output is compared with what its float weight gives on the same input (the
input the quantized model really sees, before the layer's own input quantizer). The layer's share is that
relative error, ‖ŷ − y‖² / ‖y‖², summed over the held-out samples: its own rounding, not the error carried
in from earlier layers.

The float weight is read again from the checkpoint inside the hook (one layer's worth at a time), so the
attribution adds no resident copy of a block to the plan's memory."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn import functional

from compiler.backends.torch.rotation import online_first

if TYPE_CHECKING:
    from compiler.backends.torch.layers import Job


class LayerCosts:
    """Hooks on a block's quantized Linears for one stream pass; sums per layer name."""

    def __init__(self, read: Callable[[str], torch.Tensor]):
        self.read = read  # checkpoint tensor name → the float weight [out, in] (as a transform folded it)
        self.noise: dict[str, float] = {}
        self.signal: dict[str, float] = {}
        self._handles: list = []
        self._inputs: dict[str, torch.Tensor] = {}

    def watch(self, layers: dict[str, tuple[nn.Module, str]]) -> None:
        """Hook these (layer name → its module and checkpoint weight): the raw input before any input
        quantizer, then the output."""
        for name, (module, weight) in layers.items():
            self._handles.append(module.register_forward_pre_hook(self._keep_input(name), prepend=True))
            online_first(module)  # the raw input a down projection reads is the online-rotated one (R4)
            self._handles.append(module.register_forward_hook(self._compare(name, weight)))

    @contextmanager
    def watching(self, root: nn.Module, jobs: Sequence[Job]) -> Iterator[None]:
        """Each of `jobs`' layers watched in `root` (qrc's model, or the emitted one) while the block runs."""
        self.watch({j.layer.name: (root.get_submodule(j.module), j.layer.weight) for j in jobs})
        try:
            yield
        finally:
            self.stop()

    def stop(self) -> None:
        """Remove the hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._inputs.clear()

    def _keep_input(self, name: str):
        def hook(_, args):
            self._inputs[name] = args[0]
        return hook

    def _compare(self, name: str, weight_key: str):
        def hook(module, _, output):
            x = self._inputs.pop(name)
            weight = self.read(weight_key).to(x.device, x.dtype)
            reference = functional.linear(x, weight, module.bias).float()
            del weight
            self.noise[name] = self.noise.get(name, 0.0) + float((output.float() - reference).pow(2).sum())
            self.signal[name] = self.signal.get(name, 0.0) + float(reference.pow(2).sum())
        return hook

    def added(self) -> dict[str, float]:
        """Layer → the relative output error its quantization adds; largest first."""
        relative = {n: self.noise[n] / max(self.signal[n], 1e-30) for n in self.noise}
        return dict(sorted(relative.items(), key=lambda item: -item[1]))


def jobs_in(jobs: Sequence[Job], scope: str | None, container: str) -> list[Job]:
    """The jobs of one scope of the model: a block's name, None (outside the blocks in `container`) or ""
    (the whole model)."""
    if scope == "":
        return list(jobs)
    if scope is None:
        return [j for j in jobs if not j.module.startswith(container + ".")]
    return [j for j in jobs if j.module.startswith(scope + ".")]
