"""A backend as the rest of qrc sees it, without importing it: what it can compile (checked by `qrc
check`), its cost model (asked by the planner), its formats and output kind, and the lazy path to its
executor (imported by `qrc compile` only). Specs import neither torch nor onnxruntime."""

from __future__ import annotations

import enum
import importlib
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

from compiler.backends.release import collections_paused
from compiler.diagnostics import Diagnostics
from compiler.ir.runtimes import RuntimeCell
from compiler.ir.types import Backend, BackendFacts, EmitFormat, RecipeIR
from compiler.plan.lower import Pass
from compiler.plan.ops import Plan
from compiler.plan.target import CostModel
from compiler.resolve.assignment import Assignment


def as_checked(ir: RecipeIR, assignment: Assignment) -> Assignment:
    """The default `planned`: the plan is built on the assignment `qrc check` resolved."""
    return assignment


def no_recipe_checks(ir: RecipeIR, diags: Diagnostics) -> None:
    """The default `check_recipe`: nothing beyond the format check every backend gets."""


def no_runtimes(ir: RecipeIR, assignment: Assignment) -> tuple[RuntimeCell, ...]:
    """The default `runtimes`: a backend that says nothing of where its outputs run."""
    return ()


def nothing_to_prepare(plan: Plan, writes: bool) -> AbstractContextManager[None]:
    """The default `prepare`: nothing starts before the backend is imported."""
    return nullcontext()


class OutputKind(enum.Enum):
    """What a backend writes at the destination."""

    FILE = "a file"
    FOLDER = "a folder"


@dataclass(frozen=True)
class BackendSpec:
    """One backend's light description (see the module docstring)."""

    backend: Backend
    facts: BackendFacts  # what the recipe's elaboration and checks need to know of this backend
    formats: Callable[[], tuple[EmitFormat, ...]]  # what it writes now (a plug-in may register more), default first
    output: OutputKind
    output_help: str  # what to give as the output path
    costs: CostModel
    lowering: tuple[Pass, ...]  # the passes that lower a recipe to this backend's ops, in order
    check: Callable[[RecipeIR, Assignment, Diagnostics], None]  # capability checks against the resolved model
    check_recipe: Callable[[RecipeIR, Diagnostics], None]  # capability checks of the recipe alone (no model)
    executor: str  # "module:function" of `execute(ir, assignment, plan, output, progress) -> CompileResult`
    # the assignment the plan is built on, when the backend runs another form of the model than the one
    # checked (the ONNX backend: an HF folder's cached export); reads no weights
    planned: Callable[[RecipeIR, Assignment], Assignment] = as_checked
    # formats written as one file where `output` is a folder (GGUF)
    file_formats: Callable[[], tuple[EmitFormat, ...]] = tuple
    # entered around a compile of `plan` before the executor is imported (`writes`: this rank writes the output),
    # to start what can run beside that import (the torch backend's check process: torch/check_process.py)
    prepare: Callable[[Plan, bool], AbstractContextManager[None]] = nothing_to_prepare
    # where the output runs: each runtime on each device (compiler/ir/runtimes.py), from the recipe and the model
    runtimes: Callable[[RecipeIR, Assignment], tuple[RuntimeCell, ...]] = no_runtimes

    def check_text(self, ir: RecipeIR, diags: Diagnostics) -> None:
        """What this backend refuses in the recipe alone: an `emit` format it does not write (Q220), else a path
        without the extension its runtime looks for (Q233), then the backend's own checks (`check_recipe`)."""
        if ir.emit is not None and ir.emit.format not in self.formats():
            span = ir.emit.span_of("format") or ir.emit.span_of("path")
            valid = ", ".join(f.name for f in self.formats())
            diags.error("Q220", f"`format {ir.emit.format.name}` cannot be emitted by backend {self.backend.value}",
                        span, "wrong format for the backend", help=f"backend {self.backend.value} emits: {valid}")
        elif ir.emit is not None and ir.emit.path and ir.emit.format.suffix is not None:
            suffix = ir.emit.format.suffix
            if not ir.emit.path.endswith(suffix):
                diags.warning("Q233", f'emit path "{ir.emit.path}" does not end in `{suffix}`', ir.emit.span_of("path"),
                              "unexpected extension", help=f"runtimes look for `{suffix}` files")
        self.check_recipe(ir, diags)

    def output_for(self, fmt: EmitFormat | None) -> OutputKind:
        """What the backend writes at the destination for `fmt`."""
        return OutputKind.FILE if fmt in self.file_formats() else self.output

    def load_executor(self) -> Callable:
        """Import the backend (torch or onnxruntime) and return its execute function. The imports run with
        the cyclic collector paused (release.collections_paused): torch's import makes objects that live as long
        as the run, and the collections its allocations set off took 0.7-0.9 s of the 4 s before a data-free
        compile's first weight is rounded."""
        module, _, name = self.executor.partition(":")
        with collections_paused():
            return getattr(importlib.import_module(module), name)
