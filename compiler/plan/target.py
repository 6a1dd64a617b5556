"""What the planner asks of the backend it plans for: its cost model and how it executes. Each backend
answers in its own light spec module (compiler/backends/*/spec.py), which the front end passes in; the
planner never imports a backend, so the layers keep one direction."""

from __future__ import annotations

import enum
from typing import Protocol

from compiler.ir.types import Backend, EmitFormat, MemoryMode
from compiler.plan.decision import ModeEstimate
from compiler.plan.ops import PlanOp
from compiler.plan.timing import Rates
from compiler.plan.workload import Workload


class PhaseName(enum.Enum):
    """The phases a cost model estimates separately (a mode's peak is the largest)."""

    EXPORT = "export"
    SCORE = "score"
    CALIBRATE = "calibrate"
    QUANTIZE = "quantize"
    EMIT = "emit"
    VERIFY = "verify"


class CostModel(Protocol):
    """A backend's memory model: the peak of each mode and phase (its lowering is its spec's)."""

    @property
    def backend(self) -> Backend:
        """The backend this cost model describes."""
        ...

    def runtime(self, w: Workload) -> int:
        """Interpreter, libraries and session set-up, resident throughout (what a run of `w` imports)."""
        ...

    @property
    def default_format(self) -> EmitFormat:
        """The format it emits when the recipe names none."""
        ...

    def observer_groups(self, w: Workload) -> int:
        """The most groups low_memory may split the observed tensors into (one pass over the data each); 1 where
        the backend observes block by block instead."""
        ...

    def notes(self, w: Workload, mode: MemoryMode) -> tuple[str, ...]:
        """What the plan should say about how this backend estimated the workload, and about a run in `mode`
        (whether a killed one resumes)."""
        ...

    def mode_effect(self, w: Workload, mode: MemoryMode) -> str | None:
        """How running in `mode` changes the output (not only the memory), said where `auto` picked the mode; None
        when every mode writes the same model."""
        ...

    def estimate(self, w: Workload, mode: MemoryMode, chunk: int, passes: int = 1,
                 gpus: tuple[int, ...] = ()) -> ModeEstimate:
        """The peak of a mode: the largest of its phases."""
        ...

    def phase(self, w: Workload, mode: MemoryMode, chunk: int, passes: int, phase: PhaseName) -> int:
        """The estimated peak resident bytes of one phase."""
        ...

    def seconds(self, op: PlanOp, w: Workload, rates: Rates, mode: MemoryMode) -> float:
        """One op's estimated wall time at `rates`, all its repeats together (plan/timing.py counts the work)."""
        ...

    def start_seconds(self, rates: Rates) -> float:
        """What a compile's process does before its first op: interpreter, imports, check and plan."""
        ...
