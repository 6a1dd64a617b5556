"""What this machine's CPU computes natively, from Linux's /proc/cpuinfo (no torch or onnxruntime import: plans read
it too). Both backends ask: onnxruntime's integer kernels (onnx/host_cpu.py: VNNI) and torch's bfloat16 products
(torch/learned.py, the plan's time of learned rounding)."""

from __future__ import annotations

import functools
from pathlib import Path

from compiler.plan.timing import BFloat16Products

CPUINFO = Path("/proc/cpuinfo")


def cpu_flags(cpuinfo: Path = CPUINFO) -> list[str] | None:
    """The flags of the first processor `cpuinfo` lists; None where it cannot be read or names none."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return next((line.partition(":")[2].split() for line in text.splitlines() if line.startswith("flags")), None)


def bfloat16_products(cpuinfo: Path | None = None) -> BFloat16Products:
    """How this CPU multiplies bfloat16 (`cpuinfo`: CPUINFO where not given): AMX tiles, AVX-512 BF16 dot
    products, or not in hardware (what the plan's time of learned rounding asks: the two hardware kinds differ
    about twofold)."""
    return _products(cpuinfo or CPUINFO)


@functools.cache
def _products(cpuinfo: Path) -> BFloat16Products:
    flags = cpu_flags(cpuinfo) or ()
    if "amx_bf16" in flags:
        return BFloat16Products.AMX
    return BFloat16Products.AVX512_BF16 if "avx512_bf16" in flags else BFloat16Products.CONVERTED


@functools.cache
def native_bfloat16() -> bool:
    """Whether the CPU multiplies bfloat16 in hardware (False where its flags cannot be read: not Linux, not x86)."""
    return bfloat16_products() is not BFloat16Products.CONVERTED
