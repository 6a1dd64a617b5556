"""Estimates for every mode at a chunk size; low_memory takes the fewest passes that fit."""

from __future__ import annotations

from compiler.ir.types import MemoryMode
from compiler.plan.decision import ModeEstimate
from compiler.plan.modes import AUTO_ORDER, within
from compiler.plan.target import CostModel
from compiler.plan.workload import Workload


def low_memory_passes(w: Workload, chunk: int, ram: int, costs: CostModel) -> int:
    """low_memory on a backend that splits its observers: the fewest passes over the data whose largest
    group fits `ram`."""
    hi = costs.observer_groups(w)
    if hi <= 1:
        return 1
    lo = 2
    if not within(costs.estimate(w, MemoryMode.LOW_MEMORY, chunk, hi).peak_ram, ram):
        return hi
    while lo < hi:
        mid = (lo + hi) // 2
        if within(costs.estimate(w, MemoryMode.LOW_MEMORY, chunk, mid).peak_ram, ram):
            hi = mid
        else:
            lo = mid + 1
    return lo


def all_estimates(w: Workload, chunk: int, ram: int, vram: tuple[int, ...],
                  costs: CostModel) -> tuple[dict[MemoryMode, ModeEstimate], int]:
    """Every mode's estimate, and the low_memory passes they assume."""
    passes = low_memory_passes(w, chunk, ram, costs)
    estimates = {}
    for mode in AUTO_ORDER:
        estimates[mode] = costs.estimate(w, mode, chunk, passes if mode is MemoryMode.LOW_MEMORY else 1, vram)
    return estimates, passes
