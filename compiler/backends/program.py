"""Executing a plan: each op's handler, in the plan's order. A backend registers one handler per op type;
an op without a handler is a planner/backend mismatch, reported before any work starts."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from compiler.backends.rss import RssSampler
from compiler.plan.ops import Plan, PlanOp

Handler = Callable[[PlanOp], None]


def missing_handlers(plan: Plan, handlers: Mapping[type, Handler]) -> list[str]:
    """The op kinds of `plan` that no handler executes."""
    return sorted({op.kind.value for op in plan.ops if type(op) not in handlers})


def run_program(plan: Plan, handlers: Mapping[type, Handler], rss: RssSampler, executed: list[PlanOp]) -> None:
    """Run every op of `plan` in order. While an op runs the RSS sampler's phase is that op, so the measured
    timeline lines up with each op's planned peak; `executed` gets each op once its handler returned."""
    missing = missing_handlers(plan, handlers)
    if missing:
        raise AssertionError(f"the {plan.backend.value} backend has no handler for {', '.join(missing)}")
    for op in plan.ops:
        rss.phase = op
        handlers[type(op)](op)
        executed.append(op)
