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
        rss.check()
        executed.append(op)


def guarded(progress, rss: RssSampler):
    """The progress callbacks, each step also checking the RAM budget (so a long op stops promptly)."""
    def stage(name: str, total: int):
        advance = progress(name, total)

        def step() -> None:
            advance()
            rss.check()
        return step
    return stage


def sampler_for(plan: Plan) -> RssSampler:
    """An RSS sampler whose limit is the recipe's `ram` (a detected budget is advice, not a limit)."""
    d = plan.decision
    return RssSampler(limit=d.ram_budget if d.ram_source == "recipe" else None)
