"""The compiled rounding loops (compiler/quant/round_kernels.py) against compressed-tensors' rtn written out in
numpy here: the same integers, scales and zero points bit for bit, on random weights and on the cases that
break fast paths (all-zero groups, ties at exactly .5, subnormal and huge values, one-row weights, NaN)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from compiler.ir.types import Granularity, QType, Rounding, WeightQuant
from compiler.quant import fused_rtn
from compiler.quant.weights import Convention, quantize_weight

RANGES = {QType.INT4: (-8, 7), QType.INT8: (-128, 127)}


def reference(w: torch.Tensor, qtype: QType, group: int, symmetric: bool, scale_dtype: torch.dtype):
    """compressed-tensors' calculate_qparams and quantize for groups along each row, in numpy, float32 math."""
    lo, hi = RANGES[qtype]
    groups = w.float().numpy().reshape(w.shape[0], -1, group)
    mn = np.minimum(groups.min(axis=2), np.float32(0))
    mx = np.maximum(groups.max(axis=2), np.float32(0))
    scale = (np.maximum(np.abs(mn), np.abs(mx)) / np.float32((hi - lo) / 2) if symmetric
             else (mx - mn) / np.float32(hi - lo)).astype(np.float32)
    tiny = np.float32(torch.finfo(scale_dtype).tiny)
    scale = np.where(scale > 0, scale, tiny)
    scale = torch.from_numpy(scale).to(scale_dtype).float().numpy()
    scale = np.where(scale > 0, scale, tiny)
    zp = np.zeros_like(scale) if symmetric else np.clip(np.round(np.float32(lo) - mn / scale), lo, hi)
    q = np.clip(np.round(groups / scale[..., None]) + zp[..., None], lo, hi)
    return q.reshape(w.shape).astype(np.int8), scale, zp.astype(np.int32)


def weights(rows: int, cols: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=generator) * torch.rand(rows, 1, generator=generator) * 0.05
    w[0, :32] = 0  # an all-zero group
    w[-1, 3] = 2.0  # an outlier
    w[-1, 40:44] = torch.tensor([1e-39, -1e-39, 1e18, -1e18])  # subnormals, and huge values (squares still finite)
    ties = torch.arange(-8, 8, dtype=torch.float32) + 0.5  # exactly half-way with a power-of-two scale
    w[rows // 2, 64:80] = ties * 2.0 ** -6
    w[rows // 2, 80:96] = 2.0 ** -6 * 7.5  # fixes that group's absmax at 7.5 · 2^-6: scale 2^-6
    return w.to(dtype)


CASES = [(qtype, group, symmetric, source, scales)
         for qtype in (QType.INT4, QType.INT8) for group in (32, 128, None) for symmetric in (True, False)
         for source in (torch.bfloat16, torch.float32) for scales in (torch.bfloat16, torch.float32)]


@pytest.mark.parametrize(("qtype", "group", "symmetric", "source", "scales"), CASES)
def test_fused_rtn_equals_compressed_tensors_rule(qtype, group, symmetric, source, scales):
    for rows, cols, seed in ((64, 256, 0), (1, 128, 1), (37, 384, 2)):
        w = weights(rows, cols, source, seed)
        spec = WeightQuant(qtype, Granularity.GROUP if group else Granularity.PER_CHANNEL, group, symmetric)
        bits = w.view(torch.int16 if source is torch.bfloat16 else torch.int32).numpy()
        bits = bits.view(np.uint16 if source is torch.bfloat16 else np.uint32)
        scale_dtype = str(scales).removeprefix("torch.")
        assert fused_rtn.applies(spec, Rounding.RTN, scale_dtype)
        fused = fused_rtn.round_bits(bits, spec, scale_dtype, measure=True)
        two_pass = quantize_weight(w.float().numpy(), spec, Rounding.RTN, 0, 1, Convention.TORCH, scale_dtype,
                                   measure=True)
        q, scale, zp = reference(w, qtype, group or cols, symmetric, scales)
        for rounded in (fused, two_pass):
            assert np.array_equal(rounded.q, q)
            assert np.array_equal(rounded.scale.reshape(scale.shape), scale)
            assert np.array_equal(rounded.zero_point.reshape(zp.shape), zp)
        dequantized = ((q.reshape(rows, -1, group or cols) - zp[..., None]) * scale[..., None]).reshape(rows, cols)
        original = w.float().numpy().astype(np.float64)
        signal, noise = float(np.sum(original ** 2)), float(np.sum((original - dequantized) ** 2))
        for rounded in (fused, two_pass):
            assert rounded.sums == pytest.approx((signal, noise), rel=1e-5)


def test_ties_round_half_to_even():
    w = weights(8, 128, torch.float32, 3)
    spec = WeightQuant(QType.INT4, Granularity.GROUP, 32, True)
    q = fused_rtn.round_bits(w.numpy().view(np.uint32), spec, "float32").q
    assert q[4, 64:80].tolist() == [-8, -6, -6, -4, -4, -2, -2, 0, 0, 2, 2, 4, 4, 6, 6, 7]


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nonfinite_weight_gives_nonfinite_sum(bad):
    """The callers refuse a weight by its Σ w² (Q409): a NaN or an infinity anywhere must make it non-finite."""
    w = weights(16, 256, torch.bfloat16, 4)
    w[9, 200] = bad
    spec = WeightQuant(QType.INT4, Granularity.GROUP, 128, True)
    bits = w.view(torch.int16).numpy().view(np.uint16)
    assert not np.isfinite(fused_rtn.round_bits(bits, spec, "bfloat16", measure=True).sums[0])
    with np.errstate(invalid="ignore", over="ignore"):  # round_weight's callers silence these the same way
        two_pass = quantize_weight(w.float().numpy(), spec, Rounding.RTN, 0, 1, Convention.TORCH, "bfloat16",
                                   measure=True)
    assert not np.isfinite(two_pass.sums[0])
