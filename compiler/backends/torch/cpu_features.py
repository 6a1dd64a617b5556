"""What this machine's CPU computes natively, from Linux's /proc/cpuinfo (no torch import: the plan reads it too)."""

from __future__ import annotations

import functools
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
# flags of x86 CPUs that multiply bfloat16 in hardware (AVX-512 BF16, AMX); without them torch's bfloat16 matrix
# products are converted to float32 and back, slower than float32 alone
BFLOAT16_FLAGS = ("avx512_bf16", "amx_bf16")


@functools.cache
def native_bfloat16() -> bool:
    """Whether the CPU multiplies bfloat16 in hardware (False where its flags cannot be read: not Linux, not x86)."""
    try:
        text = CPUINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    flags = next((line.partition(":")[2].split() for line in text.splitlines() if line.startswith("flags")), [])
    return any(f in flags for f in BFLOAT16_FLAGS)
