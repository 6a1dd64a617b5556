"""The compiled mse search (compiler/quant/mse_kernel.py) against numpy's (weights.quantize_weight with
Rounding.MSE, torch convention): the same integers, scales and zero points bit for bit. The choice between two
shrink factors can hang on the last bit of their float64 errors, so the order the kernel sums in is held
against numpy's own sum on data where the order shows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from compiler.ir.types import Granularity, QType, Rounding, WeightQuant
from compiler.quant import fused_rtn, mse_kernel
from compiler.quant.weights import Convention, quantize_weight

ROWS = 4  # rows of each length
LENGTHS = (1, 5, 7, 8, 9, 15, 16, 96, 127, 128, 129, 136, 200, 256, 1000, 3072, 8191, 8192, 8193, 8448, 20000)


def spread_squares(rows: int, n: int, seed: int) -> np.ndarray:
    """float32 squares whose magnitudes span many binades, so float64 sums in different orders differ."""
    rng = np.random.default_rng(seed)
    values = rng.standard_normal((rows, n)) * np.exp(rng.standard_normal((rows, n)) * 4)
    return np.square(values.astype(np.float32))


@pytest.mark.parametrize("n", LENGTHS)
def test_sums_are_numpys_float64_sums_bit_for_bit(n):
    rows = spread_squares(ROWS, n, n)
    expected = rows.reshape(ROWS, n, 1).sum(axis=1, dtype=np.float64)[:, 0]  # as the search sums
    assert [mse_kernel.numpy_order_sum(rows, row) for row in range(ROWS)] == expected.tolist()


def test_the_data_tells_summation_orders_apart():
    """Sequential float64 sums of the same data differ from numpy's in most long rows: the test above would
    catch a kernel that summed in any simpler order."""
    differing = 0
    for n in (200, 3072, 8448, 20000):
        rows = spread_squares(ROWS, n, n)
        expected = rows.reshape(ROWS, n, 1).sum(axis=1, dtype=np.float64)[:, 0]
        sequential = [float(np.cumsum(row.astype(np.float64))[-1]) for row in rows]
        differing += sum(a != b for a, b in zip(sequential, expected.tolist(), strict=True))
    assert differing >= 8


def mixed_weight(rows: int, cols: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Random rows at varied scales, plus the groups that break fast paths: all zero, one outlier, subnormal
    and huge values, and values on a coarse grid (several shrink factors then tie exactly)."""
    generator = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=generator) * torch.rand(rows, 1, generator=generator) * 0.05
    w[0, :32] = 0
    w[-1, 3] = 2.0
    w[-1, 40:44] = torch.tensor([1e-39, -1e-39, 1e18, -1e18])
    grid = torch.randint(-3, 4, (max(1, rows // 2), cols), generator=generator).float() * 2.0 ** -6
    w[:max(1, rows // 2)] = torch.where(torch.arange(cols) % 64 < 32, grid, w[:max(1, rows // 2)])
    return w.to(dtype)


CASES = [(qtype, group, symmetric, source, scales)
         for qtype in (QType.INT4, QType.INT8) for group in (32, 128, None) for symmetric in (True, False)
         for source in (torch.bfloat16, torch.float32) for scales in ("bfloat16", "float32")]


@pytest.mark.parametrize(("qtype", "group", "symmetric", "source", "scales"), CASES)
def test_compiled_mse_equals_numpys_search(qtype, group, symmetric, source, scales):
    spec = WeightQuant(qtype, Granularity.GROUP if group else Granularity.PER_CHANNEL, group, symmetric)
    assert fused_rtn.applies(spec, Rounding.MSE, scales)
    for rows, cols, seed in ((64, 256, 0), (1, 128, 1), (37, 384, 2)):
        w = mixed_weight(rows, cols, source, seed)
        bits = w.view(torch.int16 if source is torch.bfloat16 else torch.int32).numpy()
        bits = bits.view(np.uint16 if source is torch.bfloat16 else np.uint32)
        compiled = fused_rtn.round_bits(bits, spec, scales, True, Rounding.MSE)
        numpy_search = quantize_weight(w.float().numpy(), spec, Rounding.MSE, 0, 1, Convention.TORCH, scales,
                                       measure=True)
        assert np.array_equal(compiled.q, numpy_search.q)
        assert np.array_equal(compiled.scale, numpy_search.scale)
        assert np.array_equal(compiled.zero_point, numpy_search.zero_point)
        assert compiled.sums == pytest.approx(numpy_search.sums, rel=1e-5)
        if rows > 1 and qtype is QType.INT4:  # (int8's step is too fine for shrinking to pay on these rows)
            full_range = quantize_weight(w.float().numpy(), spec, Rounding.RTN, 0, 1, Convention.TORCH, scales)
            assert not np.array_equal(compiled.scale, full_range.scale)  # the search did shrink some ranges


def test_long_rows_per_channel_equal_numpys_search():
    """Per channel over rows longer than numpy's casting buffer (8192): the error sums are split there."""
    spec = WeightQuant(QType.INT8, Granularity.PER_CHANNEL, None, True)
    w = mixed_weight(6, 8448 + 64, torch.bfloat16, 4)
    bits = w.view(torch.int16).numpy().view(np.uint16)
    compiled = fused_rtn.round_bits(bits, spec, "bfloat16", rounding=Rounding.MSE)
    numpy_search = quantize_weight(w.float().numpy(), spec, Rounding.MSE, 0, 1, Convention.TORCH, "bfloat16")
    assert np.array_equal(compiled.q, numpy_search.q)
    assert np.array_equal(compiled.scale, numpy_search.scale)


TIES = [  # groups (× 2^-6) where shrink factors 1.0 and 0.95 give exactly the same error (found by search)
    (True, "bfloat16", [0, 1, 0, 0, -5, 11, 0, -12, 0, -5, 0, 0, 0, -6, 0, 0, 0, -3, 0, 13, 0, 0, 0, 0, 0, 3, 0, 0, 8,
                        0, 0, -8]),
    (False, "float32", [29, 0, 0, 0, 0, 29, 9, 0, 0, 0, 0, 0, 0, 0, 30] + [0] * 17),
    (False, "bfloat16", [-5, 5, 0, 0, 0, 0, -2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, -2, 0, 0, 3, 0, 0, -2, 0, 2, 0, 1,
                         0]),
]


@pytest.mark.parametrize(("symmetric", "scales", "group"), TIES)
def test_an_exact_tie_keeps_the_wider_range(symmetric, scales, group):
    spec = WeightQuant(QType.INT4, Granularity.GROUP, 32, symmetric)
    w = torch.tensor([group], dtype=torch.float32) * 2.0 ** -6
    compiled = fused_rtn.round_bits(w.numpy().view(np.uint32), spec, scales, rounding=Rounding.MSE)
    numpy_search = quantize_weight(w.numpy(), spec, Rounding.MSE, 0, 1, Convention.TORCH, scales)
    full_range = quantize_weight(w.numpy(), spec, Rounding.RTN, 0, 1, Convention.TORCH, scales)
    assert np.array_equal(numpy_search.scale, full_range.scale)
    assert np.array_equal(compiled.scale, full_range.scale)
    assert np.array_equal(compiled.q, numpy_search.q)


NEAR_TIES = [  # groups whose two best shrink factors' float64 errors differ in the last digits only (found by
    # search): a float32 sum can order them either way, so the kernel must sum these as numpy does
    (True, [-0.04296875, -0.107421875, -0.044921875, -0.01171875, -0.025390625, 0.0859375, -0.021484375, -0.009765625,
            -0.1015625, -0.05078125, -0.08984375, -0.0390625, -0.064453125, 0.04296875, 0.001952406601049006,
            0.07421875, 0.087890625, -0.078125, -0.095703125, 0.052734375, -0.1015625, -0.009765625, -0.10546875,
            0.068359375, 0.091796875, -0.052734375, -0.072265625, 0.107421875, 0.060546875, 0.005859375, 0.0546875,
            -0.048828125]),
    (False, [0.01953125, 0.015625, -0.01953125, -0.01953125, -0.001953125, -0.00390625, 0.0, 0.0078125, 0.0078125,
             -0.015625, 0.01171875, -0.005859375, 0.025390625, -0.02734375, -0.009765625, -0.0234375, 0.017578125,
             0.0, 0.0078125, 0.02734375, -0.02734375, -0.005859375, 0.03125, 0.03125, 0.005859375, 0.0078125,
             0.017578125, 0.03125, 0.029296875, 0.025390625, -0.02734375, -0.02734375]),
]


@pytest.mark.parametrize(("symmetric", "group"), NEAR_TIES)
def test_a_near_tie_is_decided_by_numpys_sums(symmetric, group):
    spec = WeightQuant(QType.INT4, Granularity.GROUP, 32, symmetric)
    w = np.array([group], np.float32)
    compiled = fused_rtn.round_bits(w.view(np.uint32), spec, "float32", rounding=Rounding.MSE)
    numpy_search = quantize_weight(w, spec, Rounding.MSE, 0, 1, Convention.TORCH, "float32")
    assert np.array_equal(compiled.scale, numpy_search.scale)
    assert np.array_equal(compiled.q, numpy_search.q)


def test_candidates_within_the_estimates_error_are_all_summed_exactly():
    """A float32 estimate is within n·2⁻²⁴ of its exact sum: candidates closer than that to the lowest could be
    the lowest, and must all be summed in numpy's order; those further off cannot, and need not be."""
    n, tolerance = 128, 128 * 2.0 ** -24
    estimates = np.array([1.0 + 2 * tolerance, 1.0, 1.0 + tolerance, 1.0 + 5 * tolerance, np.inf, 2.0])
    contenders = np.empty(estimates.shape[0], np.int64)
    found = mse_kernel.contenders_of(estimates, n, contenders)
    assert contenders[:found].tolist() == [0, 1, 2]
    every = np.full(4, np.inf)
    assert mse_kernel.contenders_of(every, n, contenders) == 4  # all overflowed: every one summed exactly
    for nan in ([1.0, np.nan], [np.nan, 1.0]):  # NaN: the caller sums every candidate (numpy skips NaN errors)
        assert mse_kernel.contenders_of(np.array(nan), n, contenders) == 0
