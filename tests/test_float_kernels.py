"""The compiled floating-format loops (compiler/quant/float_kernels.py) against compressed-tensors' own
functions: float_formats.quantize_float rounds each weight through the loop and with `kernel=False` through
compressed-tensors' calculate_qparams and compressors, and every stored tensor must be the same bytes (same
names, order, dtypes and shapes), on random weights and on the cases that break fast paths: all-zero groups
and rows, -0 and tiny negatives (a signed zero code), subnormals, huge values, exact ties between codes,
edge tiles of FP8 blocks, one-row weights and non-finite values (which the loop hands back)."""

from __future__ import annotations

import math

import pytest
import torch

from compiler.backends.torch.float_formats import SharedGlobal, quantize_float
from compiler.backends.torch.quant_args import weight_args, weight_format
from compiler.ir.schemes import PRESETS
from compiler.quant import fused_float

SCHEMES = ("FP8_DYNAMIC", "FP8_BLOCK", "NVFP4A16", "MXFP4A16")
E4M3_TIES = [1.0625, 1.1875, 0.0029296875, -0.0048828125, 3.25, -13.0, 2.0 ** -10, 2.0 ** -10 * 3]  # halfway
E2M1_TIES = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5.0]


def weights(rows: int, cols: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Random rows at different scales, with the special values written into the first rows."""
    generator = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=generator) * torch.rand(rows, 1, generator=generator) * 0.05
    w[0, :32] = 0  # all-zero groups
    w[0, 32:48] = -0.0
    w[0, 48:64] = -1e-9  # rounds to a zero code that keeps its sign
    if rows > 1:
        w[1] = 0  # an all-zero row (and FP8 per-channel scale 0 → eps)
    if rows > 3:
        w[2, :8] = torch.tensor([1e-39, -1e-39, 3e-39, 1e-38, -2e-38, 5e-40, 0, 1e-39])  # subnormals
        w[3, :4] = torch.tensor([1e30, -1e30, 3e29, 1e-30])  # huge (Σ w² still finite in float64)
    if rows > 5:  # MXFP4: absmax 4 gives divisor 1, so the e2m1 ties are exact values; FP8: scale 448/448 = 1
        w[4, :32] = 0.0
        w[4, :len(E2M1_TIES) + 1] = torch.tensor([4.0] + E2M1_TIES)
        w[5, :] = 0.0
        w[5, :len(E4M3_TIES) + 1] = torch.tensor([448.0] + E4M3_TIES)
    return w.to(dtype)


def stored_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(torch.uint8) if tensor.element_size() == 1 else tensor


def both(w: torch.Tensor, name: str, scale_dtype: torch.dtype, shared_absmax=None):
    scheme = PRESETS[name]
    spec = scheme.quantized_weights
    shared = None if shared_absmax is None else SharedGlobal(shared_absmax, exact=False)
    args = (spec, weight_args(spec), weight_format(scheme), scale_dtype, shared)
    return quantize_float(w, *args, measure=True), quantize_float(w, *args, measure=True, kernel=False)


def assert_same(compiled, reference) -> None:
    assert list(compiled.stored) == list(reference.stored)
    for key, expected in reference.stored.items():
        got = compiled.stored[key]
        assert (got.dtype, got.shape) == (expected.dtype, expected.shape), key
        assert torch.equal(stored_bytes(got), stored_bytes(expected)), key
    assert compiled.sums == pytest.approx(reference.sums, rel=1e-5)


@pytest.mark.parametrize("name", SCHEMES)
@pytest.mark.parametrize("source", [torch.bfloat16, torch.float32])
def test_loop_stores_compressed_tensors_bytes(name, source):
    shapes = [(64, 256, 0), (1, 128, 1), (300, 320, 2), (129, 160, 3)]  # FP8 blocks: edge tiles of 44 and 1 rows
    for rows, cols, seed in shapes:
        w = weights(rows, cols, source, seed)
        spec = PRESETS[name].quantized_weights
        assert fused_float.applies(spec, str(source).removeprefix("torch."), (rows, cols))
        compiled, reference = both(w, name, source)
        assert_same(compiled, reference)


def test_nvfp4_shared_global_scale():
    """Fused siblings' common range sets NVFP4's global scale: the loop rounds under the one it is given."""
    w = weights(64, 256, torch.bfloat16, 4)
    compiled, reference = both(w, "NVFP4A16", torch.bfloat16, shared_absmax=float(w.abs().max()) * 3)
    assert_same(compiled, reference)


@pytest.mark.parametrize("name", SCHEMES)
@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_weight_goes_to_compressed_tensors(name, bad):
    """A NaN or an infinity is not rounded by the loop: compressed-tensors rounds it, and its Σ w² is not
    finite (what the compile refuses the weight by, Q409)."""
    w = weights(32, 128, torch.bfloat16, 5)
    w[7, 9] = bad
    spec = PRESETS[name].quantized_weights
    bits = w.view(torch.int16).numpy().view("uint16")
    assert fused_float.round_bits(bits, spec, "bfloat16", 100.0) is None
    compiled, reference = both(w, name, torch.bfloat16)
    assert not math.isfinite(compiled.sums[0])
    assert [stored_bytes(t).shape for t in compiled.stored.values()] == [
        stored_bytes(t).shape for t in reference.stored.values()]


def test_which_weights_the_loop_takes():
    fp8, nvfp4 = PRESETS["FP8_DYNAMIC"].quantized_weights, PRESETS["NVFP4A16"].quantized_weights
    assert fused_float.applies(fp8, "bfloat16", (64, 100))
    assert not fused_float.applies(fp8, "float16", (64, 128))  # a float16 model's scales: compressed-tensors
    assert not fused_float.applies(nvfp4, "bfloat16", (64, 120))  # rows not whole groups of 16
    assert not fused_float.applies(fp8, "bfloat16", (4, 64, 128))  # not a 2-D weight
