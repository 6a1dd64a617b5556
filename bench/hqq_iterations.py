"""How many half-quadratic steps `rounding hqq` takes (compiler/quant/hqq.py ITERATIONS), chosen on the real
SmolLM2-135M without looking at the held-out text: every Linear but the head rounded by qrc's own code as the ONNX
backend rounds it (int4 in blocks of 64 with a float zero point each, MLAS's convention, the weight laid out
[in, out] as a MatMul reads it), dequantized back into the transformers model and measured on
bench/real_validation.py's validation windows (the calibration half of Python's language reference, after the
tokens any calibration reads). Beside each count: rtn with integer zero points, and hqq with its zero points
rounded to integers (what an output holding integers would keep: Q277's reason).

    python bench/hqq_iterations.py [--iterations 1 2 5 10 20] [--windows 8]

Prints one line per variant: perplexity (mean ± std over the windows), KL and top-1 against float, and the
seconds qrc's rounding took over all the layers (this machine's cores)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import real_quality  # noqa: E402
import real_validation  # noqa: E402


def rounded(weight, rounding, integer_zero: bool = False):
    """The [out, in] torch weight rounded as the ONNX backend rounds its [in, out] MatMul weight, dequantized."""
    import numpy as np
    import torch

    from compiler.ir.types import Granularity, QType, WeightQuant
    from compiler.quant.weights import QuantizedWeight, round_weight

    spec = WeightQuant(QType.INT4, Granularity.GROUP, 64, False)
    qw = round_weight(weight.detach().numpy().T.copy(), spec, rounding, 1, 0)
    if integer_zero:  # the same rounding with its zero points rounded, the weight rounded again to them
        zero = np.round(qw.zero_point)
        scale = np.repeat(qw.scale, 64, axis=0)
        low, high = -8, 7
        values = np.clip(np.round(weight.detach().numpy().T / scale + np.repeat(zero, 64, axis=0)), low, high)
        qw = QuantizedWeight(values.astype(np.int8), qw.scale, zero.astype(np.int32), qw.qtype, qw.axis, 64)
    return torch.from_numpy(qw.dequantize().T.copy())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, nargs="*", default=[1, 2, 5, 10, 20])
    parser.add_argument("--windows", type=int, default=8)
    args = parser.parse_args()

    import torch

    import compiler.quant.hqq as hqq
    from compiler.ir.kinds import Rounding

    model, logits, windows = real_validation.float_on_validation(args.windows)
    linears = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"}
    original = {n: m.weight.detach().clone() for n, m in linears.items()}
    variants = [("rtn", Rounding.RTN, None, False)]
    variants += [(f"hqq {n}", Rounding.HQQ, n, False) for n in args.iterations]
    variants += [(f"hqq {max(args.iterations)}, zero points rounded", Rounding.HQQ, max(args.iterations), True)]
    for name, rounding, iterations, integer_zero in variants:
        if iterations is not None:
            hqq.ITERATIONS = iterations
        start = time.perf_counter()
        weights = {n: rounded(w, rounding, integer_zero) for n, w in original.items()}
        seconds = time.perf_counter() - start
        for n, m in linears.items():
            m.weight.data = weights[n]
        print(f"{name} ({seconds:.1f} s): {real_quality.measure(model, logits, windows)}", flush=True)


if __name__ == "__main__":
    main()
