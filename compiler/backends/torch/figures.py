"""The report's per-layer figures of the torch backend: a weight's SQNR after rounding, and the range a static
input is quantized to."""

from __future__ import annotations

import math

import torch

from compiler.backends.torch.layers import ROW_SLICE_BYTES
from compiler.ir.types import ActivationQuant, QType
from compiler.quant import qparams
from compiler.quant.qparams import FP8_MAX


def weight_sqnr(original: torch.Tensor, dequantized: torch.Tensor) -> float:
    """10·log10(‖W‖² / ‖W − Q(W)‖²) in dB (inf when the rounding is exact), a slice of rows at a time (in
    float64: the scratch stays a slice's)."""
    signal = noise = 0.0
    step = max(1, ROW_SLICE_BYTES // max(1, original.shape[-1] * 8))
    for first in range(0, original.shape[0], step):
        rows = original[first:first + step].double()
        signal += float(rows.pow(2).sum())
        noise += float((rows - dequantized[first:first + step].double()).pow(2).sum())
    return 10 * math.log10(max(signal, 1e-300) / noise) if noise else math.inf


def input_range(activations: ActivationQuant, qparams_of_input: tuple[float, int]) -> tuple[float, float]:
    """The float range a static input's (scale, zero point) covers (NVFP4: its global scale, 448·6 / absmax)."""
    scale, zp = qparams_of_input
    if activations.qtype is QType.NVFP4:
        return -FP8_MAX * 6 / scale, FP8_MAX * 6 / scale
    lo, hi = qparams.qrange(activations.qtype, False)
    return (lo - zp) * scale, (hi - zp) * scale
