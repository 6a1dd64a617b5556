"""`method layerwise_percentile { candidates [...]  metric mae|mse }`: each tensor takes the candidate percentile
whose range has the least expected error, scored from the histogram alone (Quark's default:
Σ h_b·|c_b − x̂(c_b)| / Σ h_b over the bin centres c_b)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from compiler.ir.methods import CALIBRATION_METHODS, method_options
from compiler.ir.values import format_number
from compiler.quant import qparams
from compiler.quant.methods.numbers import percentile_of
from compiler.syntax import ast

DEFAULT_CANDIDATES = (99.99, 99.999, 99.99999)


class ScoreMetric(enum.Enum):
    """How a candidate range is scored."""
    MAE = "mae"
    MSE = "mse"


@CALIBRATION_METHODS.register
@dataclass(frozen=True, slots=True)
class LayerwisePercentile:
    """The best of several percentiles, per tensor."""

    name: ClassVar[str] = "layerwise_percentile"
    summary: ClassVar[str] = "per tensor, the candidate percentile with the least error on its own histogram"
    settings: ClassVar[str] = "{ candidates [P, …]  metric mae|mse }"
    histogram: ClassVar[bool] = True
    grid_search: ClassVar[bool] = True
    candidates: tuple[float, ...] = DEFAULT_CANDIDATES
    metric: ScoreMetric = ScoreMetric.MAE

    @classmethod
    def configure(cls, decl, diags):
        """`candidates [P, …]` (each in (0, 100], Q209) and `metric mae|mse`."""
        found = method_options(decl, ("candidates", "metric"), diags)
        candidates = DEFAULT_CANDIDATES
        if "candidates" in found:
            numbers = _numbers(found["candidates"], diags)
            candidates = tuple(p for p in (percentile_of(n, diags) for n in numbers) if p is not None)
        metric = ScoreMetric.MAE
        if "metric" in found:
            metric = _metric(found["metric"], diags)
        return cls(candidates, metric)

    def text(self) -> str:
        """`method layerwise_percentile { candidates […]  metric M }`."""
        cands = ", ".join(format_number(p) for p in self.candidates)
        return f"method {self.name} {{ candidates [{cands}]  metric {self.metric.value} }}"

    def detail(self) -> str:
        """The candidates and the metric."""
        return "candidates " + ", ".join(f"{c:g}" for c in self.candidates) + f" scored by {self.metric.value}"

    def range(self, observer, qtype, symmetric):
        """The best candidate's range."""
        return best_percentile(observer, self.candidates, self.metric, qtype, symmetric)[1]


def best_percentile(observer, candidates, metric: ScoreMetric, qtype, symmetric: bool):
    """(chosen percentile, its range): the candidate with the lowest expected error; ties → the first."""
    if observer.counts is None or not observer.finite:
        return None, None
    edges = observer.edges()
    centres = (edges[:-1] + edges[1:]) / 2
    weights = observer.counts / observer.counts.sum()
    best: tuple[float, float | None, tuple[float, float] | None] = (np.inf, None, None)
    for p in candidates:
        found = observer.percentile_range(p)
        assert found is not None  # the observer saw finite values (checked above)
        lo, hi = found
        scale, zp = qparams.scale_zero_point(np.array(lo), np.array(hi), qtype, symmetric)
        q = qparams.quantize(centres, scale, zp, qtype, symmetric)
        err = np.abs(qparams.dequantize(q, scale, zp) - centres)
        score = float(np.sum(weights * (err if metric is ScoreMetric.MAE else err * err)))
        if score < best[0]:
            best = (score, p, (lo, hi))
    return best[1], best[2]


def _numbers(setting: ast.Setting, diags) -> tuple[ast.Number, ...]:
    value = setting.value
    if isinstance(value, tuple) and all(isinstance(v, ast.Number) for v in value):
        return value
    diags.error("Q104", "expected a list of percentiles after `candidates`", setting.span, "unexpected here",
                help="write `candidates [99.9, 99.99, 99.999]`")
    return ()


def _metric(setting: ast.Setting, diags) -> ScoreMetric:
    value = setting.value
    word = getattr(value, "value", None)
    if isinstance(value, ast.Name) and word in ("mae", "mse"):
        return ScoreMetric(word)
    span = getattr(value, "span", setting.span)
    diags.error("Q107", f"unknown keyword `{word}`" if isinstance(value, ast.Name) else "expected `mae` or `mse`",
                span, "not a keyword here", help="expected one of `mae` or `mse`")
    return ScoreMetric.MAE
