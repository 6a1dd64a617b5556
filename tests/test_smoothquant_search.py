"""SmoothQuant's searched strength (`transform smoothquant { alpha search }`): the error it estimates for each
candidate is the error rounding the weights and the inputs really makes, and it keeps the strength of least
error; compiles on both backends say what each mapping kept."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.ir.types import ActivationMode, ActivationQuant, Granularity, QType, Rounding, Scheme, WeightQuant
from compiler.quant.smoothing import ChannelStats, estimated_error, searched_smoothquant_scales, smoothquant_scales
from compiler.quant.weights import Convention, quantize_weight

WEIGHTS = WeightQuant(QType.INT8, Granularity.PER_CHANNEL, None, True)
STATIC = ActivationQuant(QType.INT8, Granularity.PER_TENSOR, False, ActivationMode.STATIC)
PER_TOKEN = ActivationQuant(QType.INT8, Granularity.PER_TOKEN, True, ActivationMode.DYNAMIC)
W8A8_STATIC = Scheme("static", WEIGHTS, STATIC, Rounding.RTN)
W8A16 = Scheme("weights only", WEIGHTS, None, Rounding.RTN)


def _rtn(w: np.ndarray, spec: WeightQuant) -> np.ndarray:
    return quantize_weight(w, spec, Rounding.RTN, 0, 1, Convention.TORCH).dequantize()


def _inputs(rows: int = 4096, channels: int = 96, seed: int = 0) -> np.ndarray:
    """Activations with a few outlier channels and a few tokens far larger than the rest (a real model's first
    token), the two things a static range per tensor suffers from."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, channels)).astype(np.float32)
    x[:, [3, 40, 77]] *= 25.0
    x[::512] *= 6.0
    return x


def _rounded_inputs(x: np.ndarray, act: ActivationQuant) -> np.ndarray:
    """x rounded as the runtime rounds it: uint8 with a zero point over the whole tensor's range (static), or
    int8 symmetric per row (dynamic)."""
    if act.mode is ActivationMode.STATIC:
        low, high = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
        scale = (high - low) / 255
        zero = np.round(-low / scale)
        return (np.clip(np.round(x / scale) + zero, 0, 255) - zero) * scale
    scale = np.abs(x).max(axis=1, keepdims=True) / 127
    return np.clip(np.round(x / scale), -127, 127) * scale


def _measured(x: np.ndarray, w: np.ndarray, s: np.ndarray, act: ActivationQuant) -> float:
    """The squared output error per token of the layer with both its weight and its inputs rounded."""
    exact = x @ w.T
    quantized = _rounded_inputs(x / s, act) @ _rtn(w * s, WEIGHTS).T
    return float(np.square(exact - quantized, dtype=np.float64).sum() / len(x))


def _stats(x: np.ndarray) -> ChannelStats:
    stats = ChannelStats.empty(x.shape[1], True, True)
    for chunk in np.array_split(x, 8):
        stats.update(chunk)
    return stats


@pytest.mark.parametrize("act", [STATIC, PER_TOKEN], ids=["static", "per-token"])
def test_the_estimate_is_the_measured_error(act):
    """Weight and input rounding estimated from the statistics (XᵀX, the signed extremes, a sample of rows)
    within 15% of the error the rounded layer makes on the same rows, at every strength."""
    x = _inputs()
    w = np.random.default_rng(1).standard_normal((64, x.shape[1])).astype(np.float32)
    stats = _stats(x)
    gram = stats.gram / stats.rows
    for alpha in (0.0, 0.3, 0.6, 0.9, 1.0):
        s = smoothquant_scales(stats, [w], alpha)
        estimate = estimated_error(stats, gram, [(w, WEIGHTS, act)], s, _rtn)
        measured = _measured(x, w, s, act)
        assert estimate == pytest.approx(measured, rel=0.15), (alpha, estimate, measured)


def test_the_search_keeps_the_strength_of_least_error():
    """Static inputs: the strength kept makes the least measured error of the grid's and the identity's (within
    5%), and the search says how much of the identity's estimated error it removed."""
    x = _inputs()
    w = np.random.default_rng(2).standard_normal((64, x.shape[1])).astype(np.float32)
    stats = _stats(x)
    scales, alpha, gain = searched_smoothquant_scales(stats, [w], [W8A8_STATIC], 10, _rtn)
    assert alpha is not None and gain > 0.5
    errors = {a / 10: _measured(x, w, smoothquant_scales(stats, [w], a / 10), STATIC) for a in range(11)}
    errors[None] = _measured(x, w, np.ones(x.shape[1], np.float32), STATIC)
    assert _measured(x, w, scales, STATIC) <= 1.05 * min(errors.values()), (alpha, errors)


def test_weight_only_targets_search_the_weights_alone():
    """Unquantized inputs add nothing: the search weighs only the weights' rounding error, which scaling by the
    inputs' range makes no smaller here, so it keeps the identity or a weak strength."""
    x = _inputs()
    w = np.random.default_rng(4).standard_normal((64, x.shape[1])).astype(np.float32)
    _, alpha, gain = searched_smoothquant_scales(_stats(x), [w], [W8A16], 10, _rtn)
    assert gain >= 0.0
    assert alpha is None or alpha <= 0.5


def test_samples_and_extremes_merge_across_ranks():
    """torchrun's ranks each gather their own rows; merged, the extremes are the whole stream's and the sample
    stays within its bound."""
    x = _inputs()
    halves = [_stats(part) for part in np.array_split(x, 2)]
    halves[0].merge(halves[1])
    whole = _stats(x)
    assert np.array_equal(halves[0].high, whole.high) and np.array_equal(halves[0].low, whole.low)
    assert halves[0].sample is not None and 0 < len(halves[0].sample) <= 512


def test_the_plan_counts_the_search(tmp_path):
    """`qrc plan`: a searched strength gathers XᵀX and a sample of rows (more memory than a fixed strength's
    maxima) and rounds each mapping's targets grid + 2 times (more time); its op says so."""
    from compiler import plan_file

    def planned(transform: str):
        recipe = tmp_path / "r.recipe"
        recipe.write_text(f"""recipe r {{
    model "builtin:tiny-llama"
    backend torch
    {transform}
    quantize {{ type Linear -> W8A8_STATIC  "lm_head" -> none }}
    calibrate {{ data synthetic {{ samples 8 }} }}
    memory {{ mode full }}
    emit "{tmp_path / 'out'}"
}}
""")
        plan = plan_file(recipe, detected_free=16 << 30).plan
        assert plan is not None
        return next(op for op in plan.ops if op.summary.startswith("smoothquant"))

    fixed = planned("transform smoothquant { alpha 0.8 }")
    searched = planned("transform smoothquant { alpha search }")
    assert "|x| maxima, alpha 0.8" in fixed.summary
    assert "mean |x| and XᵀX, search 11 strengths" in searched.summary
    assert searched.peak_bytes > fixed.peak_bytes and searched.seconds > fixed.seconds
