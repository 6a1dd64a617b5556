"""Fused-on-disk MoE experts seen as one Linear per expert, for the families transformers loads that way, and
for those whose GGUF qrc writes from per-expert layers.

Llama 4 stores a block's experts fused (`feed_forward.experts.gate_up_proj` [E, H, 2I], `down_proj` [E, I, H], the
input dimension first), and transformers opens a compressed-tensors folder of it with one `Llama4TextMLP` per
expert (`SequentialLlama4TextExperts`, transformers/quantizers/base.py `MODULES_TO_PATCH_FOR_QUANTIZATION`): the
folder must hold `experts.{e}.gate_proj`, `up_proj` and `down_proj` weights, as nn.Linear stores them ([out, in]).
So qrc indexes those per-expert tensors in place of the fused ones: recipes select them, the plan counts them and
the writers write them; the torch backend reads each as its slice of the fused tensor (torch/expert_shards.py).

gpt-oss stores its experts fused too (`mlp.experts.gate_up_proj` [E, H, 2I] with gate and up interleaved: the gate
the even columns, `GptOssExperts._apply_gate`; `down_proj` [E, I, H]), and transformers opens a quantized folder of
it fused, so a folder keeps them so. llama.cpp's gpt-oss graph reads them as one tensor per projection holding
every expert (`ffn_gate_exps`, …), which the GGUF writer merges from per-expert layers as it does Mixtral's: for a
GGUF output, then, they are indexed per expert as well, and rules round them like any Linear.
Only this module knows the layouts; nothing here reads a weight byte."""

from __future__ import annotations

import math
from dataclasses import dataclass

from compiler.models.index import Headers

# model_type → the fused tensors' leaf names under `….experts.` and the per-expert projections each holds along
# its last axis, which they split evenly: (fused leaf, (projection, …), interleaved). Not interleaved: each
# projection's columns in one run, in order (Llama 4's gate_up holds the gate's half first: `gate_up.chunk(2,
# dim=-1)` in Llama4TextExperts.forward); interleaved: column c belongs to projection c mod n (gpt-oss).
_HALVES = (("gate_up_proj", ("gate_proj", "up_proj"), False), ("down_proj", ("down_proj",), False))
_LAYOUTS = {"llama4": _HALVES, "llama4_text": _HALVES}  # transformers loads a quantized folder per expert
_GGUF_LAYOUTS = {"gpt_oss": (("gate_up_proj", ("gate_proj", "up_proj"), True), ("down_proj", ("down_proj",), False))}


@dataclass(frozen=True, slots=True)
class ExpertSlice:
    """One expert's projection inside a fused tensor: `source`[expert, :, first:last:step], transposed to the
    [out, in] of an nn.Linear weight (`shape`)."""

    source: str  # the fused tensor's name in the checkpoint
    expert: int
    first: int  # columns of the fused tensor's last axis
    last: int
    shape: tuple[int, int]  # [out, in], as the per-expert Linear stores it
    step: int = 1  # every step-th column from `first` (2: gpt-oss's interleaved gate and up)


def loaded_per_expert(family: str) -> bool:
    """Whether transformers opens a quantized folder of this family with one Linear per expert."""
    return family in _LAYOUTS


def split_for_gguf(family: str) -> bool:
    """Whether this family's fused experts are split per expert only where the output is a GGUF (gpt-oss)."""
    return family in _GGUF_LAYOUTS


def per_expert(headers: Headers, family: str, gguf: bool = False) -> dict[str, ExpertSlice]:
    """Each per-expert weight name (`….experts.3.gate_proj.weight`) → where it lies in a fused tensor, for a
    family transformers loads per expert, or (`gguf`: the output is a GGUF) whose GGUF qrc merges from
    per-expert layers; {} for any other family. A fused tensor whose shape is not the layout's (3-D, its last
    axis split evenly) is left out: it stays fused and is refused at check (Q411), or stays float (Q266)."""
    layout = {leaf: (projections, interleaved) for leaf, projections, interleaved in
              _LAYOUTS.get(family, ()) or (_GGUF_LAYOUTS.get(family, ()) if gguf else ())}
    out: dict[str, ExpertSlice] = {}
    for name, (_, shape) in headers.items():
        owner, _, leaf = name.rpartition(".")
        projections, interleaved = layout.get(leaf, ((), False))
        if not projections or not owner.endswith(".experts") or len(shape) != 3 or shape[2] % len(projections):
            continue
        experts, inner, width = shape
        count, part = len(projections), width // len(projections)
        for e in range(experts):
            for i, projection in enumerate(projections):
                out[f"{owner}.{e}.{projection}.weight"] = (
                    ExpertSlice(name, e, i, width, (part, inner), count) if interleaved
                    else ExpertSlice(name, e, i * part, (i + 1) * part, (part, inner)))
    return out


def as_per_expert(headers: Headers, slices: dict[str, ExpertSlice]) -> Headers:
    """The header facts with each fused expert tensor replaced by its per-expert weights (`slices`, per_expert's;
    same dtype), in expert order where the fused tensor was: what the index and the output see of such a
    checkpoint."""
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
