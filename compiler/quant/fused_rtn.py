"""compressed-tensors' rtn straight from a weight's float bits: slices of rows on every core, each group's
range, scale, integers and error taken in one pass (round_kernels.round_groups), or its scale chosen by the
mse search first (mse_kernel.mse_groups). The torch backend's rtn and mse of a bfloat16 or float32 weight,
the whole of data-free rounding's arithmetic; weights.quantize_weight is the same rule in numpy (the
reference the kernels are tested against) and rounds everything else."""

from __future__ import annotations

import numpy as np

from compiler.ir.types import Granularity, Rounding, WeightQuant
from compiler.quant import qparams
from compiler.quant.parallel import parallel_map
from compiler.quant.weights import QuantizedWeight

TASK_WEIGHTS = 1 << 20  # weights one call rounds: ~0.6 ms of rtn (~2 ms of mse: smaller tasks measured 0.6–1.0 s
# slower on a 5.9 GiB checkpoint, in their dispatch) against ~20 µs of Python around it
SCALE_DTYPES = ("float32", "bfloat16")  # what the kernel rounds scales to (a float16 model's: weights.py)


def applies(spec: WeightQuant, rounding: Rounding, scale_dtype: str) -> bool:
    """Whether `round_bits` rounds this scheme: rtn or mse (without importance weights) of integers in groups
    or per channel, scales stored in float32 or bfloat16 (the torch convention's other cases round in
    weights.py)."""
    return (rounding in (Rounding.RTN, Rounding.MSE) and not spec.qtype.is_float and not spec.qtype.is_kquant
            and spec.granularity in (Granularity.GROUP, Granularity.PER_CHANNEL) and scale_dtype in SCALE_DTYPES)


def round_bits(bits: np.ndarray, spec: WeightQuant, scale_dtype: str, measure: bool = False,
               rounding: Rounding = Rounding.RTN) -> QuantizedWeight:
    """An [out, in] weight given as its float bits (uint16: bfloat16, uint32: float32) rounded with the torch
    convention (qparams.torch_scale_zero_point of its range, or of the range shrunk by the mse search, then
    round half to even and clip to the type's full range), as weights.round_weight(…, Convention.TORCH)
    returns it: the integers [out, in], scales and zero points [out, in / group] (per channel: [out]).
    `measure`: with the sums of the weight's SQNR."""
    from compiler.quant import round_kernels  # numba: only where weights are rounded (not check/plan)

    rows, cols = bits.shape
    group = spec.group if spec.granularity is Granularity.GROUP else cols
    q: np.ndarray = np.empty((rows, cols), qparams.np_type(spec.qtype))
    scale = np.empty((rows, cols // group), np.float32)
    zp = np.empty((rows, cols // group), np.float32)
    lo, hi = (np.float32(v) for v in qparams.full_range(spec.qtype))
    kernel = round_kernels.round_groups
    if rounding is Rounding.MSE:  # its own module: rtn's runs do not import it (0.17 s)
        from compiler.quant import mse_kernel
        kernel = mse_kernel.mse_groups
    step = max(1, TASK_WEIGHTS // max(cols, 1))

    def one(first: int) -> tuple[float, float]:
        part = slice(first, first + step)
        return kernel(bits[part], group, lo, hi, spec.symmetric, scale_dtype == "bfloat16", q[part], scale[part],
                      zp[part])

    sums = parallel_map(one, range(0, rows, step))
    totals = (sum(s for s, _ in sums), sum(e for _, e in sums)) if measure else None
    if spec.granularity is Granularity.GROUP:
        return QuantizedWeight(q, scale, zp.astype(np.int32), spec.qtype, 1, group, totals)
    return QuantizedWeight(q, scale.reshape(-1), zp.reshape(-1).astype(np.int32), spec.qtype, 0, None, totals)
