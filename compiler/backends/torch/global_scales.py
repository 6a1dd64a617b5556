"""NVFP4's global scale, shared by the layers a runtime fuses into one GEMM: q/k/v of an attention block and
gate/up of an MLP or of one MoE expert (found by name, as `group auto` finds them). vLLM loads a fused layer
with one global scale, and transformers merges per-expert gate/up into one fused parameter; siblings with
global scales of their own dequantize wrongly there (measured: a Qwen3-MoE folder whose experts' gate and up
kept their own scales loaded in transformers with cosine 0.01 against float). The shared scale is the one
of the siblings' largest magnitude (the smallest of their global scales, as llm-compressor chooses)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from compiler.backends.torch import fp4_cast, nvfp4_source
from compiler.backends.torch.float_formats import UNIT_RANGE, FloatQuantized, SharedGlobal, absmax
from compiler.backends.torch.nvfp4_source import SourceLayer
from compiler.ir.types import QType
from compiler.resolve.groups import auto_gate_up_instances, auto_qkv_instances


class SharedGlobalScales:
    """Each NVFP4 layer's siblings, and their common absolute maximum, read once, when the first of them is
    rounded (from the weights as a transform left them: a scale read from the checkpoint before AWQ folded its
    scales in made NVFP4 behind AWQ 3.7× worse in KL than without AWQ, tests/test_transforms.py)."""

    def __init__(self, layers: dict[str, QType], read: Callable[[str], torch.Tensor], compiled: bool = False,
                 source: Callable[[str], SourceLayer | None] | None = None, unit: frozenset[str] = frozenset()):
        """`unit`: the layers whose global scale the output's runtime does not read (llama.cpp's gpt-oss experts:
        gguf_types.UNSCALED_EXPERTS), so it is 1 for them: their block scales carry the whole range."""
        names = [name for name, qtype in layers.items() if qtype is QType.NVFP4]
        self.nvfp4 = frozenset(names)
        self.unit = unit
        self.siblings: dict[str, tuple[str, ...]] = {}
        for instance in auto_qkv_instances(names) + auto_gate_up_instances(names):
            if len(instance.members) > 1:
                self.siblings.update({member: instance.members for member in instance.members})
        self.read = read  # layer name → its float weight as it is about to be rounded
        self.compiled = compiled  # ranges taken by the compiled loop (file to file, where it rounds too)
        self._shared: dict[tuple[str, ...], SharedGlobal] = {}
        self.source = source  # layer name → its NVFP4 source's stored tensors (nvfp4_source.py)
        self._kept: dict[str, FloatQuantized | None] = {}  # siblings' kept tensors until each is rounded

    def shared(self, layer: str) -> SharedGlobal | None:
        """The largest |w| over `layer` and its fused siblings, and whether every one of them casts exactly
        under the global scale it sets (all siblings cast, or none: one global scale); None for a layer
        without siblings."""
        if layer in self.unit:  # one global scale for all of them, 1, whatever their ranges; cast where on a grid
            return SharedGlobal(UNIT_RANGE, fp4_cast.lowest_exponent(self.read(layer).detach()) is not None, unit=True)
        members = self.siblings.get(layer)
        if members is None:
            return None
        if members not in self._shared:
            tops, lowest = [], []
            for member in members:  # one weight read at a time
                weight = self.read(member)
                tops.append(absmax(weight, self.compiled))
                lowest.append(fp4_cast.lowest_exponent(weight.detach()))
            shift = fp4_cast.global_shift(max(tops))
            exact = shift is not None and all(low is not None and fp4_cast.fits(low, shift) for low in lowest)
            self._shared[members] = SharedGlobal(max(tops), exact)
        return self._shared[members]

    def kept(self, layer: str, weight: torch.Tensor) -> FloatQuantized | None:
        """`layer`'s NVFP4 source tensors as its rounding (nvfp4_source.py; `weight` as it is about to be
        rounded): where it and each fused sibling are stored as NVFP4 under one global scale and still hold the
        source's values; None otherwise, and for a layer not rounded to NVFP4."""
        if self.source is None or layer not in self.nvfp4 or layer in self.unit:  # a source's own global scale
            return None
        if layer not in self._kept:
            members = self.siblings.get(layer, (layer,))
            found = self._keep(members, layer, weight)
            self._kept.update({member: None if found is None else found[member] for member in members})
        return self._kept.pop(layer)

    def _keep(self, members: tuple[str, ...], layer: str, weight: torch.Tensor) -> dict[str, FloatQuantized] | None:
        assert self.source is not None
        sources = [self.source(member) for member in members]
        first = sources[0]
        if first is None or any(s is None or not torch.equal(s.global_scale, first.global_scale) for s in sources):
            return None
        found: dict[str, FloatQuantized] = {}
        for member, source in zip(members, sources, strict=True):  # one sibling's weight read at a time
            assert source is not None
            rounded = nvfp4_source.kept(weight if member == layer else self.read(member), source)
            if rounded is None:
                return None
            found[member] = rounded
        return found
