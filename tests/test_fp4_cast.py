"""NVFP4 of weights already on a power-of-two FP4 grid (an MXFP4 source): the exact cast keeps every float, on
both of NVFP4's rounding paths (compressed-tensors' and the compiled file-to-file loop it takes over from), and
leaves every other weight to the usual rule. A whole MXFP4 folder: tests/test_compressed_source.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("compressed_tensors")

from compiler.backends.torch.float_formats import SharedGlobal, quantize_float  # noqa: E402
from compiler.backends.torch.fp4_cast import exact_cast  # noqa: E402
from compiler.backends.torch.quant_args import weight_args, weight_format  # noqa: E402
from compiler.ir.schemes import PRESETS  # noqa: E402

GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _mxfp4_like(rows: int = 48, cols: int = 128, low: int = -12, high: int = 2, seed: int = 0) -> torch.Tensor:
    """FP4 values times one power of two per block of 32 columns, some blocks all zero (an MXFP4 weight)."""
    generator = torch.Generator().manual_seed(seed)
    codes = GRID[torch.randint(0, 8, (rows, cols), generator=generator)]
    codes = codes * torch.where(torch.rand(rows, cols, generator=generator) < 0.5, -1.0, 1.0)
    exponents = torch.randint(low, high + 1, (rows, cols // 32), generator=generator).float()
    weight = codes * torch.ldexp(torch.ones(1), exponents.repeat_interleave(32, dim=1))
    weight[3, :32] = 0.0
    return weight


def _nvfp4(weight: torch.Tensor, shared: SharedGlobal | None = None, measure: bool = False):
    scheme = PRESETS["NVFP4A16"]
    spec = scheme.quantized_weights
    return quantize_float(weight, spec, weight_args(spec), weight_format(scheme), torch.bfloat16, shared, measure)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_weight_on_an_mxfp4_grid_rounds_to_nvfp4_with_no_error(dtype):
    """Every float kept (what compressed-tensors decompresses), the global scale a power of two; the compiled
    loop's path (`measure`, file to file) measures no error either."""
    weight = _mxfp4_like().to(dtype)
    rounded = _nvfp4(weight)
    assert torch.equal(rounded.dequantized, weight.float())
    assert float(torch.log2(rounded.stored["weight_global_scale"])).is_integer()
    assert _nvfp4(weight, measure=True).sums[1] == 0.0


def test_other_weights_round_as_before():
    """A weight off the grid (one value off it) rounds by its ranges; and one on it whose fused siblings are not
    (shared, not exact) rounds with them under their global scale, not cast alone."""
    weight = _mxfp4_like()
    off = weight.clone()
    off[40, 100] = 0.3 * float(off[40, 100].abs().clamp(min=1e-3))
    assert exact_cast(off) is None
    assert not torch.equal(_nvfp4(off).dequantized, off)
    together = _nvfp4(weight, SharedGlobal(float(weight.abs().max()) * 1.3, exact=False))
    assert not torch.equal(together.dequantized, weight)


def test_block_scales_beyond_e4m3s_reach_are_not_cast():
    """Blocks 2^20 apart: under any global power of two one of their scales leaves e4m3's exact powers (2^-9 to
    2^8); the shared range of siblings counts too (a sibling's larger values push the small ones out)."""
    assert exact_cast(_mxfp4_like(low=-20, high=2)) is None
    narrow = _mxfp4_like(low=-8, high=2)
    assert exact_cast(narrow) is not None
    assert exact_cast(narrow, absmax=float(narrow.abs().max()) * 2.0**12) is None


def test_with_a_unit_global_scale_each_block_keeps_its_power_of_two_where_e4m3_holds_it():
    """A runtime that reads no global scale (llama.cpp's gpt-oss experts): the global scale is 1, every block whose
    power of two is 2^-9 or more keeps its floats exactly, and a block below takes 2^-9, its values rounded to it
    (not flushed to zero, as the block's own range would round them)."""
    weight = _mxfp4_like(low=-12, high=2)
    got = _nvfp4(weight, SharedGlobal(448.0 * 6.0, True, unit=True))
    assert float(got.stored["weight_global_scale"]) == 1.0
    exponents = torch.floor(torch.log2(weight.abs().reshape(48, -1, 32).amax(-1).clamp(min=2.0 ** -100))) - 2
    inside = (exponents >= -9).repeat_interleave(32, dim=1)
    assert torch.equal(got.dequantized[inside], weight[inside])
    below = ~inside & (weight != 0)
    assert below.any() and bool((got.dequantized[below] != 0).any())
    assert float((got.dequantized[below] - weight[below]).abs().max()) <= 2.0 ** -10 + 1e-12


def test_with_a_unit_global_scale_small_blocks_round_under_e4m3s_smallest_scale_not_to_zero():
    """Off any grid, a unit global scale leaves each block's range to its e4m3 scale: a block whose range over 6 is
    below e4m3's smallest (2^-9) rounds under 2^-9 instead of being zeroed (weights of std 0.001 all became 0)."""
    weight = torch.randn(32, 128, generator=torch.Generator().manual_seed(1)) * 0.001
    got = _nvfp4(weight, SharedGlobal(448.0 * 6.0, False, unit=True))
    assert float(got.stored["weight_global_scale"]) == 1.0
    error = float((got.dequantized - weight).norm() / weight.norm())
    assert error < 0.35 and bool((got.dequantized != 0).any()), error


def test_with_a_unit_global_scale_rounding_mse_still_searches_the_block_scales():
    """`rounding mse` under a unit global scale searches each block's scale as under any other (the floor kept),
    and ends with less squared error than round to nearest."""
    import numpy as np

    weight = torch.randn(32, 128, generator=torch.Generator().manual_seed(2)) * 0.02
    shared = SharedGlobal(448.0 * 6.0, False, unit=True)
    scheme = PRESETS["NVFP4A16"]
    spec = scheme.quantized_weights
    searched = quantize_float(weight, spec, weight_args(spec), weight_format(scheme), torch.bfloat16, shared,
                              importance=np.ones(128, np.float32))
    plain = _nvfp4(weight, shared)
    assert float(searched.stored["weight_global_scale"]) == 1.0
    assert float((searched.dequantized - weight).pow(2).sum()) < float((plain.dequantized - weight).pow(2).sum())
