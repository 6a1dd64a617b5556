"""GPTQ's scratch memory while it rounds one layer, against the plan's term (compiler/plan/memory.py
gptq_scratch): the kernel's high-water mark above what existed before the call (the weight and its
Hessian), for layers of the shapes a 7B Llama's MLP has (scaled down to fit a small machine), with the recipe's
default scale search (`mse_scales`).

    python bench/gptq_memory.py

Each shape runs in its own process; W is the layer's float32 bytes, H its Hessian's (K² × 4).
"""

from __future__ import annotations

import subprocess
import sys

SHAPES = [(2048, 5632), (5632, 2048), (8192, 2048), (4096, 4096)]

CHILD = """
import re, sys, numpy as np, torch
from compiler.ir.types import Granularity, QType, WeightQuant
from compiler.plan.memory import gptq_scratch_bytes
from compiler.quant.gptq import gptq
from compiler.quant.weights import Convention
def hwm():
    return int(re.search(r"VmHWM:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) * 1024
out, k = int(sys.argv[1]), int(sys.argv[2])
rng = np.random.default_rng(0)
w = rng.normal(size=(out, k)).astype(np.float32)
x = rng.normal(size=(k + 64, k)).astype(np.float32)
h = (x.T @ x / len(x)).astype(np.float32)
del x
torch.linalg.cholesky_ex(torch.eye(4))
open("/proc/self/clear_refs", "w").write("5")
base = hwm()
gptq(w, h, WeightQuant(QType.INT4, Granularity.GROUP, 128, True), False, Convention.TORCH, mse_scales=True)
print(hwm() - base, gptq_scratch_bytes(k, out * k * 4))
"""


def main() -> None:
    print("| layer [out, in] | W MiB | H MiB | planned scratch MiB | measured MiB | measured / planned |")
    print("|---|---:|---:|---:|---:|---:|")
    for out, k in SHAPES:
        done = subprocess.run([sys.executable, "-c", CHILD, str(out), str(k)], capture_output=True, text=True, check=True)
        measured, planned = map(int, done.stdout.split())
        print(f"| [{out}, {k}] | {out * k * 4 / 2**20:,.0f} | {k * k * 4 / 2**20:,.0f} | {planned / 2**20:,.0f} | "
              f"{measured / 2**20:,.0f} | {measured / planned:.2f}× |", flush=True)


if __name__ == "__main__":
    main()
