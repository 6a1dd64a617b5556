"""A checkpoint whose fused MoE experts read as one Linear weight per expert (models/expert_slices.py says which
families and where each expert lies), in the `Shards` interface a TorchModel reads.

Why not load the fused tensor and slice it in the module: one expert's rows of a fused tensor are contiguous in
the file, so each per-expert weight is one positioned read of 1/E of the tensor, and a block's experts are read,
rounded and released one at a time like any other layer's weights, never the whole fused tensor at once."""

from __future__ import annotations

import math

import torch

from compiler.backends.torch.shards import DTYPES, DerivedShards, Entry, Shards, expert_range, read_entry
from compiler.models.expert_slices import ExpertSlice, per_expert


class ExpertShards(DerivedShards):
    """`inner`'s tensors, its fused expert tensors replaced by their per-expert weights ([out, in], the fused
    tensor's dtype). Each per-expert entry's byte range is its expert's part of the fused tensor (the bytes the
    memory figures count); they are never copied as they are, since the file holds them transposed."""

    def __init__(self, inner, slices: dict[str, ExpertSlice]):
        self.pieces = slices
        sources = {piece.source for piece in slices.values()}
        entries: dict[str, Entry] = {k: v for k, v in inner.entries.items() if k not in sources}
        for name, piece in slices.items():
            fused = inner.entries[piece.source]
            whole = expert_range(fused, piece.expert)
            size = math.prod(piece.shape) * DTYPES[fused.dtype].itemsize
            entries[name] = Entry(fused.file, fused.dtype, piece.shape, whole.start, whole.start + size)
        super().__init__(inner, entries, frozenset(slices))

    def derive(self, name: str) -> torch.Tensor:
        """A per-expert weight, read from its expert's rows of the fused tensor alone."""
        piece = self.pieces[name]
        fused = self.inner.entries[piece.source]
        if isinstance(self.inner, Shards) and self.inner.stored_as_is(piece.source):
            rows = read_entry(expert_range(fused, piece.expert), piece.source)
        elif hasattr(self.inner, "read_expert"):  # decoded one expert at a time (an MXFP4 source: mxfp4_source.py)
            rows = self.inner.read_expert(piece.source, piece.expert)
        else:  # stored some other way (block-scaled FP8): decoded whole, then sliced
            rows = self.inner.read(piece.source)[piece.expert]
        return rows[:, piece.first:piece.last:piece.step].t().contiguous()


def with_experts(shards, family: str, gguf: bool = False):
    """`shards` with its fused experts per expert where transformers loads the family that way (or, `gguf`,
    where a GGUF output is written from per-expert layers: models/expert_slices.py); as it is otherwise."""
    slices = per_expert({name: (e.dtype, e.shape) for name, e in shards.entries.items()}, family, gguf)
    return ExpertShards(shards, slices) if slices else shards
