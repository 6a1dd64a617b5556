"""Numerics against onnxruntime's own functions, and the streaming observers' guarantees."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.ir.types import Granularity, QType, Rounding, WeightQuant
from compiler.quant import qparams
from compiler.quant.observers import HistogramObserver, MinMaxObserver
from compiler.quant.pack_int32 import pack_int4
from compiler.quant.weights import quantize_weight, round_weight, sqnr_db

RNG = np.random.RandomState(7)


@pytest.mark.parametrize("qtype, symmetric", [(QType.INT8, True), (QType.INT8, False), (QType.UINT8, False),
                                               (QType.UINT8, True)])
def test_per_channel_int8_matches_onnxruntime(qtype, symmetric):
    from onnx import TensorProto
    from onnxruntime.quantization.quant_utils import quantize_data

    onnx_type = {QType.INT8: TensorProto.INT8, QType.UINT8: TensorProto.UINT8}[qtype]
    w = (RNG.standard_normal((96, 24)) * RNG.uniform(0.1, 3, (1, 24))).astype(np.float32)
    mine = quantize_weight(w, WeightQuant(qtype, Granularity.PER_CHANNEL, None, symmetric), Rounding.RTN, 1, 0)
    for c in range(w.shape[1]):
        zp, scale, q = quantize_data(w[:, c], onnx_type, symmetric)  # (zero point, scale, values)
        assert mine.scale[c] == np.float32(scale) and mine.zero_point[c] == int(zp)
        assert np.array_equal(mine.q[:, c], q)


@pytest.mark.parametrize("symmetric", [True, False])
def test_int4_blocks_match_onnxruntime_matmul_nbits_quantizer(symmetric):
    from onnxruntime.capi._pybind_state import quantize_matmul_4bits

    k, n, block = 256, 48, 32
    w = (RNG.standard_normal((k, n)) * RNG.uniform(0.1, 3, (1, n))).astype(np.float32)
    w[0:2, 0], w[32:34, 1] = (-2.5, 2.5), (2.5, -2.5)  # blocks whose min is minus their max: MLAS takes the first
    packed = np.zeros((n, k // block, block // 2), np.uint8)
    zps = np.zeros((n, (k // block + 1) // 2), np.uint8)
    scales = np.zeros((n, k // block), np.float32)
    quantize_matmul_4bits(packed, w, scales, zps, block, n, k, symmetric)
    spec = WeightQuant(QType.UINT4, Granularity.GROUP, block, symmetric)
    mine = quantize_weight(w, spec, Rounding.RTN, 1, 0)
    sliced = round_weight(w, spec, Rounding.RTN, 1, 0, slice_bytes=k * 8 * 4)  # slices of 4 channels on every core
    assert all(np.array_equal(a, b) for a, b in ((mine.q, sliced.q), (mine.scale, sliced.scale),
                                                 (mine.zero_point, sliced.zero_point)))
    assert np.array_equal(mine.scale.T, scales)
    assert np.array_equal(pack_int4(mine.q.T.reshape(n, k // block, block)), packed)
    if not symmetric:
        assert np.array_equal(pack_int4(mine.zero_point.T), zps)


def test_int4_blocks_match_mlas_on_ties_and_exact_halves():
    """Blocks holding -x and x (MLAS keeps -x as the largest magnitude), values on exact halves of a step
    (MLAS's roundf goes away from zero, not to even) and all-negative blocks, symmetric and not, rounded in
    slices on every core: byte for byte what onnxruntime's quantize_matmul_4bits writes."""
    from onnxruntime.capi._pybind_state import quantize_matmul_4bits

    k, n, block = 64, 8, 32
    rng = np.random.default_rng(3)
    for trial in range(40):
        w = rng.standard_normal((k, n)) * rng.uniform(0.1, 3)
        w = np.round(w * 4) / 4 if trial % 2 else w  # quarters: many values land on exact halves of a step
        for c in range(n):
            top = rng.choice(32, 2, replace=False) + 32 * rng.integers(0, 2)
            w[top, c] = (4.0, -4.0) if rng.random() < 0.5 else (-4.0, 4.0)
        w[:32, 0] = -np.abs(w[:32, 0])
        w = w.astype(np.float32)
        for symmetric in (True, False):
            packed = np.zeros((n, k // block, block // 2), np.uint8)
            zps = np.zeros((n, (k // block + 1) // 2), np.uint8)
            scales = np.zeros((n, k // block), np.float32)
            quantize_matmul_4bits(packed, w, scales, zps, block, n, k, symmetric)
            mine = round_weight(w, WeightQuant(QType.UINT4, Granularity.GROUP, block, symmetric), Rounding.RTN, 1, 0,
                                slice_bytes=k * 2 * 4)
            assert np.array_equal(mine.scale.T, scales)
            assert np.array_equal(pack_int4(mine.q.T.reshape(n, k // block, block)), packed)
            if not symmetric:
                assert np.array_equal(pack_int4(mine.zero_point.T.astype(np.uint8)), zps)


@pytest.mark.parametrize("layout", ["onnx", "torch"])
def test_sqnr_measured_while_rounding_equals_float64_reference(layout):
    w = RNG.standard_normal((192, 96)).astype(np.float32)
    channel, inputs = (1, 0) if layout == "onnx" else (0, 1)
    spec = WeightQuant(QType.INT4, Granularity.GROUP, 32, True)
    measured = round_weight(w, spec, Rounding.RTN, channel, inputs, slice_bytes=16 << 10, measure=True)
    assert measured.sums is not None
    error = w.astype(np.float64) - measured.dequantize().astype(np.float64)
    reference = 10 * np.log10((w.astype(np.float64) ** 2).sum() / (error ** 2).sum())
    assert sqnr_db(w, measured) == pytest.approx(reference, abs=1e-6)
    unmeasured = round_weight(w, spec, Rounding.RTN, channel, inputs)
    assert unmeasured.sums is None and sqnr_db(w, unmeasured) == pytest.approx(reference, abs=1e-6)


def test_pack_int4_fast_path_equals_nibblewise():
    values = RNG.randint(0, 256, (6, 4, 32)).astype(np.uint8)
    expected = (values[..., 0::2] & 0x0F) | ((values[..., 1::2] & 0x0F) << 4)
    assert np.array_equal(pack_int4(values), expected.astype(np.uint8))
    assert np.array_equal(pack_int4(values.astype(np.int16)), expected.astype(np.uint8))  # the general path


def test_scale_zero_point_conventions():
    scale, zp = qparams.scale_zero_point(np.array([0.0]), np.array([0.0]), QType.UINT8, False)
    assert (scale[0], zp[0]) == (1.0, 0)  # degenerate range
    scale, zp = qparams.scale_zero_point(np.array([0.5]), np.array([2.0]), QType.UINT8, False)
    assert zp[0] == 0 and scale[0] == np.float32(2.0 / 255)  # 0 is always in the range
    _, zp = qparams.scale_zero_point(np.array([-1.0]), np.array([3.0]), QType.UINT8, True)
    assert zp[0] == 128


def test_mse_clipping_never_worse_than_rtn():
    w = RNG.standard_normal((128, 32)).astype(np.float32)
    w[3, :] *= 12  # outliers make clipping worthwhile
    spec = WeightQuant(QType.INT4, Granularity.GROUP, 32, True)
    rtn = quantize_weight(w, spec, Rounding.RTN, 1, 0).dequantize()
    mse = quantize_weight(w, spec, Rounding.MSE, 1, 0).dequantize()
    rtn_err = ((rtn - w) ** 2).reshape(4, 32, 32).sum(axis=1)
    mse_err = ((mse - w) ** 2).reshape(4, 32, 32).sum(axis=1)
    assert np.all(mse_err <= rtn_err + 1e-6) and mse_err.sum() < rtn_err.sum()


def test_importance_weighted_search_lowers_the_output_error_in_slices_on_every_core():
    """`rounding imatrix` on integer groups (torch layout [out, in]): the clipping search weighted by each input
    column's mean square gives a lower output error than the unweighted one on inputs drawn like the
    calibration's (a few loud columns), and rounding in slices of output channels on every core gives the same
    integers and scales as rounding the weight whole."""
    rng = np.random.default_rng(11)
    w = rng.standard_normal((64, 256)).astype(np.float32)
    w[:, ::37] *= 6  # large weights in a few columns: clipping them is cheap unless their inputs are loud
    loudness = np.full(256, 0.05, np.float32)
    loudness[::37] = 4.0
    x = rng.standard_normal((512, 256)).astype(np.float32) * loudness
    spec = WeightQuant(QType.INT4, Granularity.GROUP, 32, True)
    importance = (x.astype(np.float64) ** 2).mean(axis=0)
    plain = quantize_weight(w, spec, Rounding.MSE, 0, 1)
    weighted = quantize_weight(w, spec, Rounding.MSE, 0, 1, importance=importance)
    sliced = round_weight(w, spec, Rounding.MSE, 0, 1, slice_bytes=16 * 256 * 4, importance=importance)
    assert np.array_equal(weighted.q, sliced.q) and np.array_equal(weighted.scale, sliced.scale)

    def output_error(q) -> float:
        return float(((x @ (q.dequantize() - w).T) ** 2).mean())

    assert output_error(weighted) < 0.8 * output_error(plain), (output_error(weighted), output_error(plain))


def _chunks(seed: int = 11):
    # a generator of its own: the module's RNG would give each test data that depends on which tests ran before it
    # on its xdist worker
    rng = np.random.default_rng(seed)
    data = [rng.standard_normal(4000).astype(np.float32) * (1 + i) for i in range(6)]
    data[2][17] = -np.inf
    data[4][:5] = np.nan
    return data


def test_minmax_streaming_equals_batch_and_excludes_nonfinite():
    chunks = _chunks()
    stream = MinMaxObserver()
    for c in chunks:
        stream.update(c)
    everything = np.concatenate(chunks)
    finite = everything[np.isfinite(everything)]
    assert stream.range() == (float(finite.min()), float(finite.max()))
    assert stream.nonfinite == 6


@pytest.mark.parametrize("seed", range(8))
def test_histogram_streaming_merging_and_percentile(seed):
    chunks = _chunks(seed)
    stream = HistogramObserver(2048)
    for c in chunks:
        stream.update(c)
    batch = HistogramObserver(2048)
    batch.update(np.concatenate(chunks))
    assert np.array_equal(stream.counts, batch.counts) and stream.exponent == batch.exponent
    first, second = HistogramObserver(2048), HistogramObserver(2048)
    for c in chunks[:3]:
        first.update(c)
    for c in chunks[3:]:
        second.update(c)
    second.merge(first)
    assert np.array_equal(second.counts, stream.counts) and second.minmax == stream.minmax
    finite = np.concatenate(chunks)
    finite = np.abs(finite[np.isfinite(finite)])
    bin_width = stream.threshold * 2 / stream.bins
    for p in (99.0, 99.9, 99.99):
        lo, hi = stream.percentile_range(p)
        exact = np.percentile(finite, p, method="inverted_cdf")
        # ±edge, each side clamped to the data's min/max: a side left unclamped is the edge, within a bin of the
        # exact percentile (where both are clamped, the larger magnitude lies between the two)
        edge = max(-lo, hi)
        assert abs(edge - exact) <= bin_width, (p, lo, hi, exact)
        assert lo in (-edge, stream.minmax.min) and hi in (edge, stream.minmax.max), (p, lo, hi)


def test_only_nonfinite_gives_no_range():
    obs = HistogramObserver(64)
    obs.update(np.full(10, -np.inf, np.float32))
    assert obs.percentile_range(99.9) is None and obs.nonfinite == 10
