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


def reciprocal_mismatches(scale: np.float32, count: int) -> np.ndarray:
    """`count` values (largest quotients first) that v · (1/scale) rounds to the other side of a half-integer
    than v / scale does, found next to each half-integer step of an int8 scale."""
    reciprocal = np.float32(1.0) / scale
    found = []
    for step in range(-126, 126):
        middle = np.float32(np.float32(step + 0.5) * scale)
        for ulps in range(-4, 5):
            v = np.float32(middle + ulps * np.spacing(middle))
            if np.rint(np.float32(v / scale)) != np.rint(np.float32(v * reciprocal)):
                found.append(v)
    return np.array(sorted(found, key=abs, reverse=True)[:count], np.float32)


def numpys_error(values: np.ndarray, scale: np.float32, lo: np.float32, hi: np.float32) -> float:
    """weights._Rules.squared_error's error of one symmetric group, summed as the search sums it."""
    d = np.clip(np.rint(values / scale), lo, hi) * scale - values
    return float(np.square(d).reshape(1, -1, 1).sum(axis=1, dtype=np.float64)[0, 0])


U = 2.0 ** -24  # float32's unit roundoff


def estimate_of(values: np.ndarray, scale: np.float32, lo: np.float32, hi: np.float32) -> float:
    """row_estimates' S for one symmetric group at one scale (every factor given the same scale)."""
    candidates = (mse_kernel.CANDIDATES, 1)
    estimates = np.empty(candidates, np.float32)
    mse_kernel.row_estimates(values, values.size, np.full(candidates, np.float32(1.0) / scale, np.float32),
                             np.zeros(candidates, np.float32), lo, hi, True, estimates)
    return float(estimates[0, 0])


def relative_slack(n: int) -> float:
    """error_bounds' ρ, as its docstring gives it."""
    lanes = mse_kernel.LANES
    return 2.0 * (n // lanes + lanes.bit_length() - 1 + n % lanes + 4) * U + n * 2.0 ** -52


def test_the_bounds_hold_where_the_reciprocal_rounds_differently():
    """A group whose every value the estimate rounds by the other neighbour (v · (1/s) against numpy's v / s):
    its estimate is off by more than the summation's slack alone allows, and the bounds still hold."""
    n, lo, hi = 96, np.float32(-128), np.float32(127)
    scale = np.float32(0.09277344)  # a bfloat16 scale with many such values
    values = reciprocal_mismatches(scale, n)
    assert values.size == n
    estimate = estimate_of(values, scale, lo, hi)
    exact = numpys_error(values, scale, lo, hi)
    lower, upper = mse_kernel.error_bounds(np.float32(estimate), scale, np.float32(0.0), lo, hi, n,
                                           np.abs(values).max())
    assert lower <= exact <= upper
    root = float(scale) * np.sqrt(estimate)
    assert abs(np.sqrt(exact) - root) > root * relative_slack(n)  # the quotients' width was needed


def test_a_row_whose_quotients_round_differently_gets_numpys_choice():
    """Per channel, a row whose full range gives the scale its values were picked for (127.5 · s is its largest
    value): every quotient of the widest factor is one the reciprocal rounds the other way, and the choice
    is still numpy's."""
    scale = np.float32(0.09277344)
    row = np.concatenate([reciprocal_mismatches(scale, 95), [np.float32(127.5) * scale]]).astype(np.float32)
    spec = WeightQuant(QType.INT8, Granularity.PER_CHANNEL, None, True)
    w = row.reshape(1, -1)
    compiled = fused_rtn.round_bits(w.view(np.uint32), spec, "bfloat16", rounding=Rounding.MSE)
    numpy_search = quantize_weight(w, spec, Rounding.MSE, 0, 1, Convention.TORCH, "bfloat16")
    full_range = quantize_weight(w, spec, Rounding.RTN, 0, 1, Convention.TORCH, "bfloat16")
    assert full_range.scale[0] == scale
    assert np.array_equal(compiled.scale, numpy_search.scale)
    assert np.array_equal(compiled.q, numpy_search.q)


def test_odd_lengths_and_groups_under_the_vector_width_equal_numpys_search():
    """Per-channel rows whose length leaves values past the last run of 16 (one at a time), and rows shorter
    than 16 (no run at all)."""
    for cols in (5, 17, 200, 1000):
        for symmetric in (True, False):
            spec = WeightQuant(QType.INT4, Granularity.PER_CHANNEL, None, symmetric)
            w = mixed_weight(9, cols, torch.float32, cols) if cols >= 64 else \
                torch.randn(9, cols, generator=torch.Generator().manual_seed(cols)) * 0.05
            compiled = fused_rtn.round_bits(w.numpy().view(np.uint32), spec, "float32", rounding=Rounding.MSE)
            numpy_search = quantize_weight(w.numpy(), spec, Rounding.MSE, 0, 1, Convention.TORCH, "float32")
            assert np.array_equal(compiled.q, numpy_search.q)
            assert np.array_equal(compiled.scale, numpy_search.scale)
            assert np.array_equal(compiled.zero_point, numpy_search.zero_point)


@pytest.mark.parametrize(("estimate", "scale", "peak"), [(np.inf, 0.01, 1.0), (np.nan, 0.01, 1.0),
                                                   (1.0, 2.0 ** -61, 1.0), (1.0, 2.0 ** 61, 1.0), (1.0, 0.01, np.inf)])
def test_an_estimate_without_a_bound_sends_the_group_to_exact_sums(estimate, scale, peak):
    """An estimate that overflowed or is NaN, a scale whose reciprocal is not normal, or a non-finite value:
    no bound, so every factor of that group is summed in numpy's order."""
    lower, upper = mse_kernel.error_bounds(np.float32(estimate), np.float32(scale), np.float32(0.0),
                                           np.float32(-8), np.float32(7), 128, np.float32(peak))
    assert (lower, upper) == (-np.inf, np.inf)


def test_the_bounds_hold_where_clipping_dominates_the_error():
    """Groups whose values mostly lie beyond a small scale's range: their errors are large against s², so the
    quotients' part of the bounds grows with the clipped values' error."""
    n, lo, hi = 128, np.float32(-8), np.float32(7)
    rng = np.random.default_rng(1)
    for _ in range(200):
        values = (rng.standard_normal(n) * np.exp(rng.standard_normal(n))).astype(np.float32)
        peak = np.abs(values).max()
        scale = np.float32(peak / 7.5 * 0.1)
        estimate = estimate_of(values, scale, lo, hi)
        exact = numpys_error(values, scale, lo, hi)
        lower, upper = mse_kernel.error_bounds(np.float32(estimate), scale, np.float32(0.0), lo, hi, n, peak)
        assert lower <= exact <= upper
