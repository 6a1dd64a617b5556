"""GPTQ weight rounding (llm-compressor / AutoGPTQ's procedure, ALGORITHMS.md), in float32 numpy.

`H = (2/n)·Σ xᵀx` over the layer's input rows is accumulated by a streaming HessianObserver (mergeable:
sums). Quantizing: dead columns (diag(H) = 0) zeroed; optional act-order (argsort diag(H), descending);
`H += 0.01·mean(diag(H))·I`; the upper Cholesky factor of H⁻¹; columns in blocks of 128: quantize a
column, spread its error `(w - q)/Hinv[i,i]` over the rest of the block, then the block's errors over
the remaining columns. Scales come from the same conventions as RTN (per channel or per group)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from compiler.ir.types import Granularity, Rounding, WeightQuant
from compiler.quant import qparams
from compiler.quant.weights import Convention, QuantizedWeight, quantize_weight

DAMPENING = 0.01
BLOCK = 128


@dataclass
class HessianObserver:
    """2·Σ xᵀx and the row count, for inputs whose last axis has `features` values."""

    features: int
    sum: np.ndarray = field(init=False)
    rows: int = 0

    def __post_init__(self) -> None:
        self.sum = np.zeros((self.features, self.features), np.float64)

    def update(self, x: np.ndarray) -> None:
        rows = np.asarray(x, np.float64).reshape(-1, self.features)
        rows = rows[np.isfinite(rows).all(axis=1)]
        self.sum += 2.0 * rows.T @ rows
        self.rows += rows.shape[0]

    def merge(self, other: HessianObserver) -> None:
        self.sum += other.sum
        self.rows += other.rows

    def hessian(self) -> np.ndarray:
        return (self.sum / max(self.rows, 1)).astype(np.float32)


def gptq(w: np.ndarray, hessian: np.ndarray, spec: WeightQuant, act_order: bool = False,
         convention: Convention = Convention.ORT, scale_dtype=np.float32) -> QuantizedWeight:
    """Quantize `w` laid out [out, in] (torch Linear) with GPTQ. Returns a QuantizedWeight in that layout
    (channel axis 0, groups along axis 1)."""
    w = np.array(w, np.float32)
    h = np.array(hessian, np.float64)
    dead = np.diag(h) == 0
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    order = np.argsort(-np.diag(h), kind="stable") if act_order else np.arange(w.shape[1])
    w, h = w[:, order], h[np.ix_(order, order)]
    h += DAMPENING * np.mean(np.diag(h)) * np.eye(h.shape[0])
    hinv = np.linalg.cholesky(np.linalg.inv(h)).T  # upper factor of H⁻¹
    params = _params(w, spec, order, convention, scale_dtype)  # scales from the whole (float) weight, as RTN would choose them
    q = np.zeros_like(w)
    for start in range(0, w.shape[1], BLOCK):
        end = min(start + BLOCK, w.shape[1])
        errors = np.zeros((w.shape[0], end - start), np.float32)
        for i in range(start, end):
            column = w[:, i]
            q[:, i] = _fake_quantize(column, params, order[i])
            err = (column - q[:, i]) / hinv[i, i]
            w[:, i + 1:end] -= np.outer(err, hinv[i, i + 1:end]).astype(np.float32)
            errors[:, i - start] = err
        w[:, end:] -= (errors @ hinv[start:end, end:]).astype(np.float32)
    restored = np.empty_like(q)
    restored[:, order] = q
    return _requantize(restored, params)


@dataclass(frozen=True)
class _Params:
    reference: QuantizedWeight  # scales and zero points per (channel, group)
    spec: WeightQuant


def _params(w: np.ndarray, spec: WeightQuant, order: np.ndarray, convention: Convention, scale_dtype) -> _Params:
    original = np.empty_like(w)
    original[:, order] = w
    return _Params(quantize_weight(original, spec, Rounding.RTN, 0, 1, convention, scale_dtype), spec)


def _scale_zp(params: _Params, column: int) -> tuple[np.ndarray, np.ndarray]:
    ref = params.reference
    if params.spec.granularity is Granularity.GROUP:
        g = column // params.spec.group_size
        return ref.scale[:, g], ref.zero_point[:, g].astype(np.float32)
    if params.spec.granularity is Granularity.PER_CHANNEL:
        return ref.scale, ref.zero_point.astype(np.float32)
    return np.full(ref.q.shape[0], ref.scale), np.full(ref.q.shape[0], float(ref.zero_point))


def _limits(params: _Params) -> tuple[int, int]:
    return qparams.qrange(params.spec.qtype, False)


def _fake_quantize(column: np.ndarray, params: _Params, index: int) -> np.ndarray:
    scale, zp = _scale_zp(params, index)
    lo, hi = _limits(params)
    safe = np.where(scale != 0, scale, 1.0)
    q = np.clip(np.round(column / safe) + zp, lo, hi)
    return ((q - zp) * scale).astype(np.float32)


def _requantize(dequantized: np.ndarray, params: _Params) -> QuantizedWeight:
    """The integer values of the GPTQ-rounded weight, with the scales it was rounded to."""
    ref = params.reference
    lo, hi = _limits(params)
    columns = [np.clip(np.round(dequantized[:, i] / np.where(s != 0, s, 1.0)) + z, lo, hi)
               for i, (s, z) in ((i, _scale_zp(params, i)) for i in range(dequantized.shape[1]))]
    q = np.stack(columns, axis=1).astype(ref.q.dtype)
    return QuantizedWeight(q, ref.scale, ref.zero_point, ref.qtype, ref.axis, ref.block_size)
