"""The planner's memory decision: each mode's estimated peak, where the RAM budget came from, and the mode chosen
with every candidate it tried (plan/modes.py makes it; a Plan carries it)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from compiler.ir.types import MemoryMode


@dataclass(frozen=True, slots=True)
class ModeEstimate:
    """The estimated peak of one memory mode, and the parts it is made of."""

    mode: MemoryMode
    peak_ram: int
    parts: tuple[tuple[str, int], ...]
    peak_vram: int = 0
    feasible: bool = True  # False: the mode does not apply (multi_gpu without GPUs, …)
    note: str = ""


class RamSource(enum.Enum):
    """Where the RAM budget came from: the recipe's `ram` (a promise the run is held to: past it, the run
    stops with Q302) or the free memory detected when there is none (a guide the plan fits, not a limit)."""
    RECIPE = "recipe"
    DETECTED = "detected"

    @property
    def is_limit(self) -> bool:
        """Whether the run is held to the budget (stopped past it)."""
        return self is RamSource.RECIPE

    @property
    def described(self) -> str:
        """Where the budget came from, for people."""
        return "from the recipe" if self is RamSource.RECIPE else "85% of free memory, detected"


@dataclass(frozen=True, slots=True)
class ModeDecision:
    """The memory mode the planner chose, and every candidate it tried with its estimate."""

    mode: MemoryMode | None  # None: nothing fits (Q301)
    requested: MemoryMode
    ram_budget: int
    ram_source: RamSource
    vram_budget: tuple[int, ...]
    tried: tuple[tuple[ModeEstimate, bool], ...]  # each candidate and whether it fit
    reason: str
