"""A compressed-tensors folder read as a float checkpoint (models/compressed_source.py says which tensors make
each layer), in the `Shards` interface a TorchModel reads: each compressed Linear's weight decompressed when it
is read, by compressed-tensors' own decompressor for the layer's config group (the library that wrote the format
defines it), one layer at a time."""

from __future__ import annotations

import torch

from compiler.backends import BackendError
from compiler.backends.torch.shards import DerivedShards, decoded_entry
from compiler.diagnostics import error
from compiler.models.compressed_source import COMPANIONS, CompressedLayer, compressed_layers, quantization

SERIALIZED = ("weight", "weight_packed", "weight_scale", "weight_zero_point", "weight_global_scale", "weight_shape")


def decompressed(read, prefix: str, has, scheme, fmt: str) -> torch.Tensor:
    """compressed-tensors' decompression of one layer's stored tensors under `scheme` (its QuantizationScheme)
    and format `fmt`, in float32: what transformers' `dequantize` conversion computes. `read(name)` reads a
    tensor, `has(name)` says whether the folder holds it."""
    from compressed_tensors.compressors import BaseCompressor

    state = {leaf: read(f"{prefix}.{leaf}") for leaf in SERIALIZED if has(f"{prefix}.{leaf}")}
    compressor = BaseCompressor.get_value_from_registry(fmt)
    return compressor.decompress(state, scheme)["weight"].float()


class CompressedShards(DerivedShards):
    """`inner`'s tensors with each compressed layer one float32 `weight`, its companions and the folder's activation
    scales left out."""

    def __init__(self, inner, config: dict):
        from compressed_tensors.quantization import QuantizationConfig

        headers = {name: (e.dtype, e.shape) for name, e in inner.entries.items()}
        self.layers: dict[str, CompressedLayer] = compressed_layers(headers, config)
        self.groups = QuantizationConfig.model_validate(quantization(config)).config_groups
        stored = {f"{layer.prefix}.{leaf}" for layer in self.layers.values() for leaf in SERIALIZED}
        entries = {name: entry for name, entry in inner.entries.items()  # as the index sees the folder
                   if name not in stored and name.rpartition(".")[2] not in COMPANIONS}
        for name, layer in self.layers.items():
            entries[name] = decoded_entry(inner.entries.get(f"{layer.prefix}.weight_packed") or inner.entries[name],
                                          layer.shape)
        super().__init__(inner, entries, frozenset(self.layers))

    def nvfp4_tensors(self, name: str, leaves: tuple[str, ...]) -> dict[str, torch.Tensor] | None:
        """The stored tensors `leaves` of a layer stored as NVFP4 (blocks of 16, symmetric), as the folder holds
        them; None for a layer stored otherwise (torch/nvfp4_source.py keeps them)."""
        layer = self.layers.get(name)
        if layer is None or layer.format != "nvfp4-pack-quantized":
            return None
        weights = self.groups[layer.group].weights
        if weights is None or weights.group_size != 16 or not weights.symmetric:
            return None
        if not all(f"{layer.prefix}.{leaf}" in self.inner for leaf in leaves):
            return None
        return {leaf: self.inner.read(f"{layer.prefix}.{leaf}") for leaf in leaves}

    def derive(self, name: str) -> torch.Tensor:
        """A compressed layer's weight, decompressed (float32)."""
        layer = self.layers[name]
        try:
            return decompressed(self.inner.read, layer.prefix, self.inner.__contains__, self.groups[layer.group],
                                layer.format)
        except (ValueError, KeyError, RuntimeError, NotImplementedError) as exc:
            raise BackendError(error("Q404", f"compressed-tensors cannot decompress `{layer.prefix}` ({layer.format}: "
                                     f"{type(exc).__name__}: {str(exc).strip()[:160]})", None, "cannot read this layer",
                                     help="a folder compressed-tensors wrote loads; this one's tensors and its "
                                     "quantization_config disagree")) from None


def with_decompression(shards, config: dict):
    """`shards` read as a float checkpoint where `config` says compressed-tensors compressed it; as it is
    otherwise."""
    return CompressedShards(shards, config) if quantization(config) is not None else shards
