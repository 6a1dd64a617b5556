"""The planner: a recipe resolved against its model → an ordered Plan with memory estimates.

No weights are read and neither torch nor onnxruntime is imported: a plan for a 7B model indexed
from its config.json takes well under a second.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from compiler.diagnostics import Diagnostics
from compiler.ir.printer import print_ir
from compiler.ir.types import MemoryMode, RecipeIR
from compiler.models.index import ModelFormat
from compiler.plan.estimates import all_estimates
from compiler.plan.fit import report_q301
from compiler.plan.lower import Context, Pass, lower
from compiler.plan.modes import ram_budget, select_mode
from compiler.plan.ops import Plan, Spans
from compiler.plan.target import CostModel
from compiler.plan.timing import REFERENCE, Rates, timed
from compiler.plan.workload import Workload, workload
from compiler.resolve.assignment import Assignment

__all__ = ["Plan", "build_plan"]


def build_plan(ir: RecipeIR, assignment: Assignment, detected_free: int, diags: Diagnostics,
               costs: CostModel, lowering: Sequence[Pass], ranks: int | None = None,
               rates: Rates = REFERENCE) -> Plan | None:
    """Choose the memory mode and lower the recipe to ops. Returns None (with Q301) when nothing fits.

    Args:
        detected_free: free host memory in bytes, used (× 0.85) when the recipe gives no `ram`.
        costs: the cost model of the recipe's backend (its spec's; see compiler.backends.registry).
        lowering: the backend's passes, which make its ops (its spec's).
        ranks: the torchrun ranks to plan for, instead of the recipe's `ranks` (its text is kept as written).
        rates: the machine's speed each op's time is estimated at (plan/timing.py).
    """
    written = ir
    if ranks is not None and ranks != ir.memory.ranks:
        ir = replace(ir, memory=replace(ir.memory, ranks=ranks))
    w = workload(ir, assignment)
    ram, source = ram_budget(ir.memory, detected_free)
    estimates, passes = all_estimates(w, w.chunk, ram, ir.memory.vram, costs)
    decision = select_mode(ir.memory.mode, estimates, ram, ir.memory.vram, source)
    if decision.mode is None:
        report_q301(ir, w, decision, diags, costs)
        return None
    passes = passes if decision.mode is MemoryMode.LOW_MEMORY else 1  # only low_memory splits the observers
    ctx = Context(ir, assignment, w, decision, estimates[decision.mode], passes, costs)
    notes = _notes(w, costs, decision.mode, decision.requested)
    lowered = timed(lower(ctx, lowering), w, rates, decision.mode, costs.seconds)
    return Plan(ir.name, ir.source_name, ir.model, ir.backend, len(assignment.layers),
                len(w.quantized_layers), decision, lowered, notes, spans_of(ir), print_ir(written),
                ir.memory.ranks, costs.start_seconds(rates))


def spans_of(ir: RecipeIR) -> Spans:
    """Where each decision the plan carries was written in the recipe."""
    cal, memory = ir.calibration, ir.memory
    return Spans(recipe=ir.span, model=ir.model_span, data=cal.data.span_of("data") or cal.span_of("data") or ir.span,
                 experts=cal.span_of("experts"), ram=memory.span_of("ram"), disk=memory.span_of("disk"),
                 mode=memory.span_of("mode"), transform=ir.transform.span if ir.transform else None,
                 emit=(ir.emit.span_of("path") if ir.emit else None) or ir.span,
                 verify=(ir.verify.span_of("bound") or ir.verify.span_of("metric") if ir.verify else None) or ir.span)


def _notes(w: Workload, costs: CostModel, mode: MemoryMode, requested: MemoryMode) -> tuple[str, ...]:
    notes = []
    effect = costs.mode_effect(w, mode) if requested is MemoryMode.AUTO else None
    if effect is not None:  # `auto` chose by the budget: a larger `ram` would write another model
        notes.append(effect)
    if not w.calibrate:
        notes.append("no calibration pass: every scheme is weight-only and data-free")
    if w.index.graph is not None and w.index.format is ModelFormat.HF:
        notes.append("activation estimates walk the graph of the folder's cached ONNX export (the graph the "
                     "compile runs)")
    return tuple(notes) + costs.notes(w, mode)
