"""Estimates for every mode at a chunk size; low_memory takes the fewest passes that fit."""

from __future__ import annotations

from compiler.ir.types import Backend, MemoryMode
from compiler.plan import memory
from compiler.plan.modes import AUTO_ORDER
from compiler.plan.ops import ModeEstimate
from compiler.plan.workload import Workload


def low_memory_passes(w: Workload, chunk: int, ram: int) -> int:
    """ONNX low_memory: the fewest passes over the data whose largest group fits `ram`."""
    if w.backend is not Backend.ONNX or len(w.observed) <= 1:
        return 1
    lo, hi = 2, len(w.observed)
    if memory.estimate(w, MemoryMode.LOW_MEMORY, chunk, hi).peak_ram > ram:
        return hi
    while lo < hi:
        mid = (lo + hi) // 2
        if memory.estimate(w, MemoryMode.LOW_MEMORY, chunk, mid).peak_ram <= ram:
            hi = mid
        else:
            lo = mid + 1
    return lo


def all_estimates(w: Workload, chunk: int, ram: int, vram: tuple[int, ...]) -> tuple[dict[MemoryMode, ModeEstimate], int]:
    passes = low_memory_passes(w, chunk, ram)
    estimates = {}
    for mode in AUTO_ORDER:
        estimates[mode] = memory.estimate(w, mode, chunk, passes if mode is MemoryMode.LOW_MEMORY else 1, vram)
    return estimates, passes
