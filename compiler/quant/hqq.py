"""`rounding hqq`: each block's zero point optimised by half-quadratic splitting (Badri and Shaji, "Half-Quadratic
Quantization of Large Machine Learning Models"), data-free; the scale stays the block's min-max one.

The rounded weight is W_q = round(W / s + z) and its error d = W − (W_q − z)·s. HQQ splits the error into a sparse
part e, the shrinkage of d under an Lp penalty (p < 1: the few large errors a block has are allowed, not averaged
into the zero point), and solves for the zero point that fits the rest:

    e = sign(d) · relu(|d| − |d|^(p−1) / β),   z ← mean(W_q − (W − e) / s),   β ← κ·β

with p = 0.7, β = 10 and κ = 1.01 (the paper's and onnxruntime's HQQ defaults). Written with d, the update is
z ← z − mean(d − e) / s, and d − e is d itself wherever |d|^(2−p) ≤ 1/β: only the few larger errors need a power.

The zero point this finds lies between the integers: it is only worth its cost where the output keeps it as a
float (MatMulNBits takes zero points in the scales' type; compressed-tensors, DequantizeLinear and GGUF hold
integers, where a rounded zero point gives back what rtn gave on the real SmolLM2). So the rounding says
`float_zero_points`, and the schemes and backends refuse it where the zero point would be rounded (Q277).

Each block keeps the zero point of least mean absolute error over the iterations (onnxruntime's stops the whole
tensor at the first iteration that does not improve its mean error; per block, the choice does not depend on how
the weight is sliced across cores)."""

from __future__ import annotations

import numpy as np

from compiler.ir.kinds import Rounding
from compiler.plugins import ROUNDINGS
from compiler.quant import qparams
from compiler.quant.weights import ScaleChoice

LP = 0.7  # the penalty's exponent p
BETA = 10.0  # β at the first iteration
KAPPA = 1.01  # β's growth per iteration
# iterations (each block keeps its best): on the real SmolLM2 (int4 in blocks of 64, validation windows of the
# calibration half: bench/hqq_iterations.py) 5 gave the lowest KL against float (0.214, 10 and 20: 0.216; rtn 0.323)
# at 1.6 s for every layer on two cores against 4.2 s for 20
ITERATIONS = 5


def hqq_params(choice: ScaleChoice) -> tuple[np.ndarray, np.ndarray]:
    """Each block's (scale, float zero point) of an [A, L, B] view, [A, B]: the min-max scale in the scale's
    stored type, and the zero point HQQ finds for it (float32; the output stores it in the scales' type)."""
    rows, rules = choice.rows, choice.rules
    low_level, high_level = rules.levels()
    low, high = rows.min(axis=1), rows.max(axis=1)
    width = high - low
    scale = np.where(width > 0, width / np.float32(high_level - low_level), np.float32(1.0))  # flat: any scale
    scale = qparams.stored_signed(scale, rules.scale_dtype)
    zero = np.round(np.float32(low_level) - low / scale).astype(np.float32)
    return scale, _optimised(rows, rules, scale, zero)


def _optimised(rows: np.ndarray, rules, scale: np.ndarray, zero: np.ndarray) -> np.ndarray:
    """The zero point of least mean absolute error each block reached in ITERATIONS half-quadratic steps."""
    s = scale[:, None].astype(np.float32)
    z = zero[:, None].copy()
    best_error = np.full(zero.shape, np.inf, np.float64)
    best = zero.copy()
    error = np.empty(rows.shape, np.float32)
    beta = BETA
    for _ in range(ITERATIONS):
        rules.round_into(rows, s, z, error)  # W_q
        error -= z
        error *= s
        np.subtract(rows, error, out=error)  # d = W − dequantized
        absolute = np.abs(error).sum(axis=1, dtype=np.float64)  # the mean absolute error times the block size
        better = absolute < best_error
        best_error = np.where(better, absolute, best_error)
        best = np.where(better, z[:, 0], best)
        _held_back(error, beta)  # d − e
        z -= error.mean(axis=1, keepdims=True, dtype=np.float64).astype(np.float32) / s
        beta *= KAPPA
    return best


def _held_back(d: np.ndarray, beta: float) -> np.ndarray:
    """d − shrink(d), in place: d where |d|^(2−p) ≤ 1/β, else sign(d)·|d|^(p−1)/β (what the Lp shrinkage keeps
    out of the sparse part)."""
    threshold = np.float32(beta ** (-1.0 / (2.0 - LP)))
    large = np.abs(d) > threshold
    if large.any():
        big = d[large]
        d[large] = np.sign(big) * np.power(np.abs(big), np.float32(LP - 1.0)) / np.float32(beta)
    return d


Rounding.HQQ = ROUNDINGS.register(Rounding(
    "hqq", "each block's zero point optimised by half-quadratic splitting (HQQ), data-free; float zero points",
    scales=hqq_params, float_zero_points=True))
