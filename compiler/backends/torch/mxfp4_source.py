"""An MXFP4 checkpoint (gpt-oss's; models/mxfp4_source.py says which tensors pair up) read as a float one, in the
`Shards` interface a TorchModel reads: each packed expert tensor decoded when it is read, by transformers' own
decoder (`convert_moe_packed_tensors`, what its MXFP4 loader runs where it dequantizes), one tensor at a time."""

from __future__ import annotations

import torch

from compiler.backends import BackendError
from compiler.backends.torch.shards import DerivedShards, Shards, decoded_entry, expert_range, read_entry
from compiler.diagnostics import error
from compiler.models.mxfp4_source import float_shape, is_mxfp4, packed_pairs

NAN_EXPONENT = 255  # E8M0's one code that is no power of two


class Mxfp4Shards(DerivedShards):
    """`inner`'s tensors with each packed pair one float32 tensor of the shape transformers gives it."""

    def __init__(self, inner, config: dict):
        headers = {name: (e.dtype, e.shape) for name, e in inner.entries.items()}
        self.pairs = packed_pairs(headers, config)
        stored = {name for pair in self.pairs.values() for name in pair}
        entries = {name: entry for name, entry in inner.entries.items() if name not in stored}
        for name, (blocks, _) in self.pairs.items():
            entries[name] = decoded_entry(inner.entries[blocks], float_shape(inner.entries[blocks].shape))
        super().__init__(inner, entries, frozenset(self.pairs))

    def derive(self, name: str) -> torch.Tensor:
        """A packed tensor decoded to float32 (every MXFP4 value is exact in it)."""
        blocks, scales = self.pairs[name]
        return self._decoded(blocks, scales, self.inner.read(blocks), self.inner.read(scales))

    def read_expert(self, name: str, expert: int) -> torch.Tensor:
        """Expert `expert`'s part of a packed tensor, decoded: [in, out] as `derive`'s [expert] (the packed
        tensors hold each expert's bytes in one run; a per-expert split reads each expert's alone, not the
        whole tensor once per expert)."""
        blocks, scales = self.pairs[name]
        if not (isinstance(self.inner, Shards) and self.inner.stored_as_is(blocks) and self.inner.stored_as_is(scales)):
            return self.derive(name)[expert]
        one = [read_entry(expert_range(self.inner.entries[n], expert), n).unsqueeze(0) for n in (blocks, scales)]
        return self._decoded(blocks, scales, *one)[0]

    def _decoded(self, blocks: str, scales: str, stored: torch.Tensor, exponents: torch.Tensor) -> torch.Tensor:
        from transformers.integrations.mxfp4 import convert_moe_packed_tensors

        if bool((exponents == NAN_EXPONENT).any()):  # decoded, it would write infinities into the output
            raise BackendError(error("Q404", f"the MXFP4 scales `{scales}` hold {NAN_EXPONENT}, E8M0's NaN", None,
                                     "cannot read this tensor", help="a scale byte of 255 marks a block with no "
                                     "value; re-export the checkpoint"))
        try:
            return convert_moe_packed_tensors(stored, exponents, dtype=torch.float32)
        except (ValueError, RuntimeError, AssertionError, IndexError) as exc:
            raise BackendError(error("Q404", f"transformers cannot decode the MXFP4 tensor `{blocks}` ({type(exc).__name__}: "
                                     f"{str(exc).strip()[:160]})", None, "cannot read this tensor",
                                     help="an MXFP4 checkpoint transformers loads decodes here too; re-export "
                                     "this one")) from None


def with_packed_experts(shards, config: dict):
    """`shards` read as a float checkpoint where `config` says its experts are MXFP4; as it is otherwise."""
    return Mxfp4Shards(shards, config) if is_mxfp4(config) else shards
