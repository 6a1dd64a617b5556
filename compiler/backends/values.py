"""The values ops hand each other while a plan runs. The runner (program.py) holds one value per buffer
(compiler.plan.ops.Buffer) and gives each op's handler a view of them: it reads only what its op declares in
`inputs` and produces only what the op declares in `outputs`. A handler that reads anything else is a
planner/backend mismatch, stopped where it happens, so an op's `in:`/`out:` lines in `qrc plan` are what it
really uses, and a run state keeps services only (the values live here, not on it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from compiler.ir.types import MemoryMode
from compiler.plan.ops import Buffer, PlanOp

T = TypeVar("T")


@dataclass(frozen=True)
class ChosenMemory:
    """The `memory_mode` buffer's value, as every backend has it: the mode the run uses and `memory { disk }` (a
    backend's own value adds what it decided beside them)."""

    mode: MemoryMode
    disk: Path | None = None

    @property
    def offload(self) -> bool:
        """The offload mode: weights (torch) or graph segments (ONNX) one block at a time, read as each runs."""
        return self.mode is MemoryMode.OFFLOAD


class UndeclaredBuffer(AssertionError):
    """A handler read or produced a buffer its op does not declare (a planner/backend mismatch)."""


class Values:
    """Every buffer's value so far, and which buffers each op's handler read (`reads`, in plan order)."""

    def __init__(self, initial: Mapping[Buffer, object]):
        self._held: dict[Buffer, object] = dict(initial)
        self.reads: list[tuple[PlanOp, Buffer]] = []

    def for_op(self, op: PlanOp) -> OpValues:
        """The view `op`'s handler gets."""
        return OpValues(op, self._held, self.reads)

    def held(self, buffer: Buffer, kind: type[T]) -> T | None:
        """A buffer's value for the run's own bookkeeping (commit, close: what to release), None where no op
        produced it; never for a handler."""
        value = self._held.get(buffer)
        return value if isinstance(value, kind) else None


class OpValues:
    """One op's view of the values: its declared inputs to read, its declared outputs to produce."""

    def __init__(self, op: PlanOp, held: dict[Buffer, object], reads: list[tuple[PlanOp, Buffer]]):
        self.op, self._held, self._reads = op, held, reads

    def declares(self, buffer: Buffer) -> bool:
        """Whether the op reads `buffer` (an input a plan has only in some shapes: the searched precision)."""
        return buffer in self.op.inputs

    def get(self, buffer: Buffer, kind: type[T]) -> T:
        """The value of an input the op declares, of the type its producer put there."""
        if buffer not in self.op.inputs:
            raise UndeclaredBuffer(f"{self.op.kind.value} reads `{buffer.value}`, which it does not declare "
                                   f"(its inputs: {', '.join(b.value for b in self.op.inputs)})")
        if buffer not in self._held:
            raise UndeclaredBuffer(f"{self.op.kind.value} reads `{buffer.value}` before any op produced it")
        value = self._held[buffer]
        if not isinstance(value, kind):
            raise UndeclaredBuffer(f"`{buffer.value}` holds a {type(value).__name__}, not the {kind.__name__} "
                                   f"{self.op.kind.value} reads")
        self._reads.append((self.op, buffer))
        return value

    def put(self, buffer: Buffer, value: object) -> None:
        """Produce an output the op declares."""
        if buffer not in self.op.outputs:
            raise UndeclaredBuffer(f"{self.op.kind.value} produces `{buffer.value}`, which it does not declare "
                                   f"(its outputs: {', '.join(b.value for b in self.op.outputs) or 'none'})")
        self._held[buffer] = value
