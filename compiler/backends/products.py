"""What a handler reports for the compile's result: each op's handler returns a frozen Product, and the run's
shared machinery (the rounder, the streams) reports what it found while the op ran through the run's `drain`;
compiler/backends/program.py assembles the CompileResult from them. No handler writes into the result."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from compiler.backends.sensitivity import SearchResult
from compiler.diagnostics import Diagnostic
from compiler.resolve.assignment import Assignment


@dataclass(frozen=True, slots=True)
class Verification:
    """The verdict of the verify op: the figures, whether the recipe's bound held, and on what they were measured."""

    figures: tuple[tuple[str, float], ...]
    passed: bool
    measured_on: str
    layer_errors: tuple[tuple[str, float], ...] = ()  # when it failed: the error each layer adds, worst first
    failure: Diagnostic | None = None  # Q501, raised once the model is in place


@dataclass(frozen=True, slots=True)
class Product:
    """What one op reports; fields left empty add nothing to the result."""

    warnings: tuple[Diagnostic, ...] = ()
    notes: tuple[str, ...] = ()  # what the run decided that the plan could not know (GPU placement)
    assignment: Assignment | None = None  # what is compiled from this op on (after an export, a search)
    search: SearchResult | None = None
    transform: str | None = None  # what the outlier transform did
    learned: str | None = None  # what learned rounding cost and bought
    calibration_seconds: float | None = None  # since the compile started, when rounding began
    weight_sqnr: tuple[tuple[str, float], ...] = ()  # layer → weight SQNR in dB
    input_ranges: tuple[tuple[str, tuple[float, float]], ...] = ()  # layer → its input's quantized range
    files: tuple[Path, ...] = ()  # the staged output
    from_cache: bool = False  # the op ran without its work (an export found in the cache)
    verification: Verification | None = None


@dataclass
class Pending:
    """What a run's shared machinery reports between two ops (the rounder's figures, the streams' warnings):
    collected here, handed over as a Product after each op (`take`)."""

    warnings: list[Diagnostic] = field(default_factory=list)
    weight_sqnr: dict[str, float] = field(default_factory=dict)
    input_ranges: dict[str, tuple[float, float]] = field(default_factory=dict)
    transform: str | None = None  # what the transform did, once it ran (before the op's own statistics)

    def take(self) -> Product:
        """Everything collected since the last take, as one Product; the collection starts empty again."""
        product = Product(warnings=tuple(self.warnings), weight_sqnr=tuple(self.weight_sqnr.items()),
                          input_ranges=tuple(self.input_ranges.items()), transform=self.transform)
        self.warnings, self.weight_sqnr, self.input_ranges, self.transform = [], {}, {}, None
        return product
