"""Fused-on-disk MoE experts seen as one Linear per expert, for the families transformers loads that way.

Llama 4 stores a block's experts fused (`feed_forward.experts.gate_up_proj` [E, H, 2I], `down_proj` [E, I, H], the
input dimension first), and transformers opens a compressed-tensors folder of it with one `Llama4TextMLP` per
expert (`SequentialLlama4TextExperts`, transformers/quantizers/base.py `MODULES_TO_PATCH_FOR_QUANTIZATION`): the
folder must hold `experts.{e}.gate_proj`, `up_proj` and `down_proj` weights, as nn.Linear stores them ([out, in]).
So qrc indexes those per-expert tensors in place of the fused ones: recipes select them, the plan counts them and
the writers write them; the torch backend reads each as its slice of the fused tensor (torch/expert_shards.py).
Only this module knows the layout; nothing here reads a weight byte."""

from __future__ import annotations

import math
from dataclasses import dataclass

from compiler.models.index import Headers

# model_type → the fused tensors' leaf names under `….experts.` and the per-expert projections each holds, in
# order along its last axis, which they split evenly: (fused leaf, (projection, …)). gate_up holds the gate's
# half first (`gate_up.chunk(2, dim=-1)` in Llama4TextExperts.forward).
_LAYOUTS = {
    "llama4": (("gate_up_proj", ("gate_proj", "up_proj")), ("down_proj", ("down_proj",))),
    "llama4_text": (("gate_up_proj", ("gate_proj", "up_proj")), ("down_proj", ("down_proj",))),
}



@dataclass(frozen=True, slots=True)
class ExpertSlice:
    """One expert's projection inside a fused tensor: `source`[expert, :, first:last], transposed to the
    [out, in] of an nn.Linear weight (`shape`)."""

    source: str  # the fused tensor's name in the checkpoint
    expert: int
    first: int  # columns of the fused tensor's last axis
    last: int
    shape: tuple[int, int]  # [out, in], as the per-expert Linear stores it


def loaded_per_expert(family: str) -> bool:
    """Whether transformers opens a quantized folder of this family with one Linear per expert."""
    return family in _LAYOUTS


def per_expert(headers: Headers, family: str) -> dict[str, ExpertSlice]:
    """Each per-expert weight name (`….experts.3.gate_proj.weight`) → where it lies in a fused tensor, for a
    family transformers loads per expert; {} for any other family. A fused tensor whose shape is not the
    layout's (3-D, its last axis split evenly) is left out: it stays fused and is refused at check."""
    layout = dict(_LAYOUTS.get(family, ()))
    out: dict[str, ExpertSlice] = {}
    for name, (_, shape) in headers.items():
        owner, _, leaf = name.rpartition(".")
        projections = layout.get(leaf)
        if projections is None or not owner.endswith(".experts") or len(shape) != 3 or shape[2] % len(projections):
            continue
        experts, inner, width = shape
        step = width // len(projections)
        for e in range(experts):
            for i, projection in enumerate(projections):
                out[f"{owner}.{e}.{projection}.weight"] = ExpertSlice(name, e, i * step, (i + 1) * step, (step, inner))
    return out


def as_per_expert(headers: Headers, family: str) -> Headers:
    """The header facts with each fused expert tensor replaced by its per-expert weights (same dtype), in
    expert order where the fused tensor was: what the index and the output see of such a checkpoint."""
    slices = per_expert(headers, family)
    if not slices:
        return headers
    by_source: dict[str, list[str]] = {}
    for name, piece in slices.items():
        by_source.setdefault(piece.source, []).append(name)
    out: Headers = {}
    for name, (dtype, shape) in headers.items():
        if name not in by_source:
            out[name] = (dtype, shape)
            continue
        for derived in sorted(by_source[name], key=lambda n: (slices[n].expert, slices[n].first)):
            out[derived] = (dtype, slices[derived].shape)
    assert sum(math.prod(s) for _, s in out.values()) == sum(math.prod(s) for _, s in headers.values())
    return out
