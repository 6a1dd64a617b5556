"""compressed-tensors folders as source models: what llm-compressor, AutoRound and qrc write (W4A16 `pack-quantized`,
W8A8 `int-quantized`, FP8 `float-quantized`, NVFP4/MXFP4 `nvfp4-`/`mxfp4-pack-quantized`), recompiled to any
output qrc writes.

A quantized Linear is stored as its compressed tensors (`weight_packed` or an int8/FP8 `weight`, `weight_scale`,
maybe `weight_zero_point`, `weight_global_scale`, `weight_shape`) beside activation scales (`input_scale`, …). qrc
indexes each as one float `weight` of the layer's shape, from the headers and the config's groups alone (no bytes
read: `check` and `plan` stay free of weight reads), and the torch backend decompresses it when it is read with
compressed-tensors' own decompressor (torch/compressed_source.py). The companions are not tensors of the model:
the output has its own."""

from __future__ import annotations

import re
from dataclasses import dataclass

from compiler.models.index import Headers

# tensors of a compressed layer besides its weight, and activation and KV-cache scales: none is the model's own
COMPANIONS = ("weight_scale", "weight_zero_point", "weight_global_scale", "weight_shape", "weight_g_idx",
              "input_scale", "input_zero_point", "input_global_scale", "output_scale", "output_zero_point",
              "k_scale", "v_scale")
_QUANTIZED_DTYPES = ("I8", "U8", "F8_E4M3", "F8_E5M2", "I32")
FP4_FORMATS = ("nvfp4-pack-quantized", "mxfp4-pack-quantized")  # two e2m1 values to a byte


@dataclass(frozen=True, slots=True)
class CompressedLayer:
    """One compressed Linear of the source: its tensors' prefix, the config group naming it and that group's
    format, and the float weight's shape."""

    prefix: str  # `model.layers.0.mlp.down_proj`
    group: str  # the config group's name
    format: str  # compressed-tensors' format name (`pack-quantized`, …)
    shape: tuple[int, int]


def quantization(config: dict | None) -> dict | None:
    """The config's compressed-tensors quantization_config, or None for any other model."""
    quant = (config or {}).get("quantization_config")
    if isinstance(quant, dict) and quant.get("quant_method") == "compressed-tensors" and quant.get("config_groups"):
        return quant
    return None


def compressed_layers(headers: Headers, config: dict | None) -> dict[str, CompressedLayer]:
    """`….weight` name → its compressed layer, for each Linear the config's groups quantized in a compressed-tensors
    source ({} for any other model). A layer no group names is left out (its tensors stay as they are: the index
    then finds no weight for it and says so)."""
    quant = quantization(config)
    if quant is None:
        return {}
    groups = quant["config_groups"]
    ignore = [t for t in quant.get("ignore") or [] if isinstance(t, str)]
    out: dict[str, CompressedLayer] = {}
    for name, (dtype, shape) in headers.items():
        prefix, _, leaf = name.rpartition(".")
        if leaf not in ("weight_packed", "weight") or (leaf == "weight" and dtype not in _QUANTIZED_DTYPES):
            continue
        if f"{prefix}.weight_scale" not in headers or any(_matches(prefix, t) for t in ignore):
            continue
        group = _group_of(prefix, groups)
        if group is None:
            continue
        fmt = groups[group].get("format") or quant.get("format") or "pack-quantized"
        weights = groups[group].get("weights") or {}
        out[f"{prefix}.weight"] = CompressedLayer(prefix, group, fmt, _float_shape(leaf, shape, weights, fmt))
    return out


def as_dequantized(headers: Headers, config: dict | None, dtype: str) -> Headers:
    """The header facts as qrc works with them: each compressed layer one `weight` in `dtype` (the model's float
    dtype), its companions and the folder's activation scales left out; any other model as it is."""
    layers = compressed_layers(headers, config)
    if not layers:
        return headers
    stored = {f"{layer.prefix}.weight_packed": weight for weight, layer in layers.items()} | {w: w for w in layers}
    out: Headers = {}
    for name, (dt, shape) in headers.items():
        weight = stored.get(name)
        if weight is not None:
            out[weight] = (dtype, layers[weight].shape)
        elif name.rpartition(".")[2] not in COMPANIONS:
            out[name] = (dt, shape)
    return out


def fp4_weights(layers: dict[str, CompressedLayer], formats: tuple[str, ...] = FP4_FORMATS) -> tuple[str, ...]:
    """The `….weight` names of the compressed layers (compressed_layers) stored in an FP4 format (NVFP4, MXFP4; or
    in `formats`), whose decompression costs more than the integer formats' (the plan's time)."""
    return tuple(name for name, layer in layers.items() if layer.format in formats)


def _float_shape(leaf: str, shape: tuple[int, ...], weights: dict, fmt: str) -> tuple[int, int]:
    """The [out, in] of a compressed weight from its stored shape: a packed one holds 32/bits values per int32
    (pack-quantized) or two 4-bit values per byte (the FP4 formats); any other is stored whole."""
    rows, cols = shape[0], shape[-1]
    if leaf == "weight_packed" and fmt in FP4_FORMATS:
        return rows, cols * 2
    if leaf == "weight_packed":
        return rows, cols * 32 // int(weights.get("num_bits") or 4)
    return rows, cols


def _group_of(prefix: str, groups: dict) -> str | None:
    """The config group whose targets name this layer: a name or `re:` pattern first, else the class target
    `Linear` (compressed-tensors' matching; every compressed weight of a folder is a Linear's)."""
    by_class = None
    for name, group in groups.items():
        for target in group.get("targets") or []:
            if not isinstance(target, str):
                continue
            if target == "Linear":
                by_class = by_class or name
            elif _matches(prefix, target):
                return name
    return by_class


def _matches(name: str, target: str) -> bool:
    """compressed-tensors' rule for one target: `re:` a regex matched from the name's start, else the name."""
    if target.startswith("re:"):
        return re.match(target[3:], name) is not None
    return target == name
