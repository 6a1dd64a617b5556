"""Bytes of a layer's weight before and after a scheme (quantized values plus scales and zero points)."""

from __future__ import annotations

import math

from compiler.ir.types import Granularity, QType, Scheme
from compiler.models.index import Layer, LayerKind

SCALE_BYTES = 4  # float32 scales


def scale_count(layer: Layer, scheme: Scheme) -> int:
    """Number of scales the scheme gives the layer."""
    w = scheme.quantized_weights
    if w.granularity is Granularity.PER_TENSOR:
        return 1
    if w.granularity is Granularity.PER_CHANNEL:
        return layer.out_features
    if w.granularity is Granularity.BLOCK:
        rows_per, columns_per = w.block_shape
        return math.ceil(layer.out_features / rows_per) * math.ceil(layer.in_features / columns_per)
    # groups run along the input features (along the embedding dim for Embedding rows)
    length, rows = (layer.out_features, layer.in_features) if layer.kind is LayerKind.EMBEDDING else (layer.in_features, layer.out_features)
    return rows * math.ceil(length / w.group)


def quantized_bytes(layer: Layer, scheme: Scheme) -> int:
    """Bytes of the layer's weight after quantization (values, scales, zero points)."""
    if scheme.is_none:
        return layer.bytes
    w = scheme.quantized_weights
    scales = scale_count(layer, scheme)
    zero_points = 0 if w.symmetric else math.ceil(scales * w.qtype.bits / 8)
    scale_bytes = w.qtype.scale_bytes or SCALE_BYTES  # NVFP4's FP8 and MX's e8m0 block scales: one byte each
    global_scale = SCALE_BYTES if w.qtype is QType.NVFP4 else 0  # NVFP4's per-tensor global scale
    return math.ceil(layer.params * w.qtype.bits / 8) + scales * scale_bytes + zero_points + global_scale
