"""Executing a plan: each op's handler, in the plan's order. A backend registers one handler per op type;
an op without a handler is a planner/backend mismatch, reported before any work starts. The values the ops
hand each other are held here (values.py), starting with the recipe resolved against the model; each
handler gets a view of its op's declared inputs and outputs."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

from compiler.backends.products import Product
from compiler.backends.ranks import all_gathered, from_environment
from compiler.backends.release import freeze_long_lived, thaw
from compiler.backends.result import CompileResult
from compiler.backends.rss import RssSampler
from compiler.backends.values import OpValues, Values
from compiler.plan.ops import Buffer, LoadModel, Plan, PlanOp
from compiler.resolve.assignment import Assignment

Handler = Callable[[PlanOp, OpValues], Product | None]  # what the op reports for the result (None: nothing)


class Run(Protocol):
    """A backend's state for one compile: its op handlers, and `close` (which also removes what the run
    staged and did not commit)."""

    def handlers(self) -> Mapping[type, Handler]:
        """One handler per op type of the plans this backend runs."""
        ...

    def drain(self) -> Product:
        """What the run's shared machinery (the rounder, the streams) reported while the last op ran."""
        ...

    def commit(self, values: Values) -> list[Path]:
        """The staged output (among `values`) into place; the files at the destination."""
        ...

    def close(self, values: Values) -> None:
        """Free what the run and its values hold; leave nothing uncommitted at the destination."""
        ...


def execute_plan(plan: Plan, assignment: Assignment, output: Path, progress,
                 make_run: Callable[[Callable, float], Run]) -> CompileResult:
    """Run `plan` op by op with the run `make_run(progress, start)` builds, under an RSS sampler that
    enforces the recipe's `ram`; the result holds what was measured, also when verification fails.

    The output goes into place last, once every op ran and every check (the `ram` budget after each op, the
    load and run checks of the emitted model) passed: a failure before then leaves nothing at the destination,
    and nothing after it can fail but the verdict of verification (Q501), which leaves the model in place."""
    result = CompileResult(output, [], plan, assignment=assignment)
    start, rss = time.perf_counter(), sampler_for(plan)
    rss.span = plan.spans.ram
    run = make_run(guarded(progress, rss), start)
    values = Values({Buffer.RECIPE: assignment})  # the recipe, resolved against the model
    result.reads = values.reads
    try:
        with rss:
            try:
                run_program(plan, run, rss, result, values)
                result.rank_peaks = rank_peaks(rss.peak)
                result.files = run.commit(values)
            finally:
                thaw()
                run.close(values)
    finally:  # also when verification fails: the report shows what was measured
        result.peak_rss, result.rss_samples = rss.peak, rss.samples
        result.peak_with_children = rss.with_children
        result.total_seconds = time.perf_counter() - start
    if result.verify_failure is not None:
        from compiler.backends import BackendError

        raise BackendError(result.verify_failure, result)
    return result


def rank_peaks(peak: int) -> tuple[int, ...]:
    """Under torchrun, every rank's measured peak (the summary and report show a row per rank); () alone."""
    ranks = from_environment()
    return tuple(all_gathered(ranks, peak)) if ranks.world > 1 else ()


def missing_handlers(plan: Plan, handlers: Mapping[type, Handler]) -> list[str]:
    """The op kinds of `plan` that no handler executes."""
    return sorted({op.kind.value for op in plan.ops if type(op) not in handlers})


def run_program(plan: Plan, run: Run, rss: RssSampler, result: CompileResult, values: Values) -> None:
    """Run every op of `plan` in order, each handler on its op's view of `values`, and assemble the result
    from what each reports. While an op runs the RSS sampler's phase is that op, so the measured timeline
    lines up with each op's planned peak; `result.executed` gets each op once its handler returned."""
    handlers = run.handlers()
    missing = missing_handlers(plan, handlers)
    if missing:
        raise AssertionError(f"the {plan.backend.value} backend has no handler for {', '.join(missing)}")
    for op in plan.ops:
        rss.phase = op
        began = time.perf_counter()
        try:
            result.absorb(op, handlers[type(op)](op, values.for_op(op)))
        finally:  # what the machinery reported counts also when the op failed (the report shows it)
            result.absorb(op, run.drain())
            result.op_seconds.append((op, time.perf_counter() - began))
        rss.check_now()
        result.executed.append(op)
        if isinstance(op, LoadModel):
            freeze_long_lived()  # the imports and the skeleton: later collections skip them


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
    return RssSampler(limit=d.ram_budget if d.ram_source.is_limit else None)
