"""An NVFP4 layer of an NVFP4 compressed-tensors source, rounded to NVFP4 again, is written as the source stores it.

Rounding the decompressed weight by its own ranges rounds it a second time: a new global scale from its largest
magnitude, and each 16-column block's scale from the block's largest value, which lies below the block's range
wherever its largest code is not 6 (the real SmolLM2-135M's NVFP4 folder, recompiled to NVFP4, came out with 304
of its 630 stored tensors changed). The source's own tensors already are the NVFP4 form of these values, and
no rounding, rtn or GPTQ, can do better than a weight's exact values: so they are written as they are, bit for
bit (a negative zero included, which compressed-tensors' compressor would make positive).

Kept only where the weight, as it is about to be rounded, is still the source's decoded values (a transform,
AWQ, SmoothQuant or a rotation, changes them) and, for the fused siblings that share one global scale
(global_scales.py), where every one of them is, under the same global scale; otherwise the weight rounds as any
other. The figures are measured as for any rounding: the weight against what the kept tensors decode to."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from compiler.backends.torch.compressed_source import CompressedShards
from compiler.backends.torch.float_formats import FloatQuantized
from compiler.backends.torch.quant_args import DECOMPRESSED_TO_BFLOAT16
from compiler.ir.types import QType
from compiler.quant.qparams import FP4_GRID

BLOCK = 16  # NVFP4's columns per scale
STORED = ("weight_global_scale", "weight_packed", "weight_scale")  # in the order compressed-tensors writes them
# what compressed-tensors' NVFP4 decompressor gives, whatever the model's dtype
DECODED = torch.bfloat16 if QType.NVFP4 in DECOMPRESSED_TO_BFLOAT16 else torch.float32
# e2m1 codes → values (the low three bits index the magnitudes, the high one is the sign), and a packed byte →
# its two values, the low nibble's first (one lookup a byte)
_VALUES = torch.tensor([*FP4_GRID, *(-v for v in FP4_GRID)])
_PAIRS = torch.stack([_VALUES[torch.arange(256) & 15], _VALUES[torch.arange(256) >> 4]], dim=-1)
# how far from its source value a weight's value may lie: a source decompressed into bfloat16 (the model's dtype)
# lies within 2^-9 of it; a weight a transform changed lies anywhere
_TOLERANCE = 2.0 ** -8
_ROWS = 1024  # rows compared at a time: a few float32 copies of that many rows, not of the weight


@dataclass(frozen=True)
class SourceLayer:
    """An NVFP4 source layer's stored tensors by local name (STORED): global scale float32 [1], packed codes uint8
    [out, in / 2], block scales float8_e4m3fn [out, in / 16]."""

    stored: dict[str, torch.Tensor]

    @property
    def global_scale(self) -> torch.Tensor:
        """The layer's global scale."""
        return self.stored["weight_global_scale"]


def stored_layer(shards, weight: str) -> SourceLayer | None:
    """The tensors a compressed-tensors source stores `weight` (`….weight` as qrc reads the layer) as, where it
    stores it as NVFP4; None for a source of any other kind or a layer stored otherwise. `shards`: the model's
    checkpoint, whichever readers wrap the compressed one."""
    while shards is not None and not isinstance(shards, CompressedShards):
        shards = getattr(shards, "inner", None)
    if shards is None:
        return None
    found = shards.nvfp4_tensors(weight, STORED)
    return None if found is None else SourceLayer(found)


def kept(weight: torch.Tensor, layer: SourceLayer) -> FloatQuantized | None:
    """The source's tensors as `weight` [out, in]'s rounding, with the SQNR's sums (Σ w², Σ (w − decoded)²), where
    every value of `weight` is its source value within _TOLERANCE (relative to it, or to its block's step for
    values near zero); None where any is not."""
    packed, scales = layer.stored["weight_packed"], layer.stored["weight_scale"]
    rows, columns = weight.shape
    if packed.shape != (rows, columns // 2) or scales.shape != (rows, columns // BLOCK) or columns % BLOCK:
        return None
    power = error = 0.0
    for first in range(0, rows, _ROWS):
        w = weight[first:first + _ROWS].float().reshape(-1)
        values = _PAIRS[packed[first:first + _ROWS].long()].reshape(-1, columns // BLOCK, BLOCK)
        step = (scales[first:first + _ROWS].float() / layer.global_scale.float()).unsqueeze(-1)
        decoded = (values * step).to(DECODED).float().reshape(-1)  # what a loader decompresses to
        power += float(torch.dot(w, w))
        if torch.equal(w, decoded):  # file to file, nothing changed the weight: the values themselves
            continue
        off = (w - decoded).abs()
        if not bool((off <= _TOLERANCE * torch.maximum(decoded.abs(), step.expand_as(values).reshape(-1))).all()):
            return None  # (a NaN fails too)
        error += float(torch.dot(off, off))
    return FloatQuantized(dict(layer.stored), None, (power, error))
