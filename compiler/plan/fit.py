"""Q301: a plan that cannot fit, reported before any work with the numbers and a concrete way out."""

from __future__ import annotations

from dataclasses import replace

from compiler.diagnostics import Diagnostics
from compiler.ir.types import MemoryMode, RecipeIR
from compiler.ir.values import human_bytes
from compiler.plan.activations import calibration_peak
from compiler.plan.decision import ModeDecision
from compiler.plan.estimates import all_estimates
from compiler.plan.modes import PLAN_MARGIN, needed_ram, select_mode, within
from compiler.plan.target import CostModel
from compiler.plan.workload import Workload


def largest_fitting_chunk(w: Workload, decision: ModeDecision, costs: CostModel) -> int | None:
    """The largest chunk below the current one with which the requested mode (or auto) fits."""
    def ok(chunk: int) -> bool:
        estimates, _ = all_estimates(w, chunk, decision.ram_budget, decision.vram_budget, costs)
        return select_mode(decision.requested, estimates, decision.ram_budget, decision.vram_budget).mode is not None

    lo, hi = 1, w.chunk - 1
    if hi < 1 or not ok(1):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid - 1)
    return lo


def report_q301(ir: RecipeIR, w: Workload, decision: ModeDecision, diags: Diagnostics, costs: CostModel) -> None:
    """Q301: nothing fits; the help names the smallest change that would."""
    worst = min((e for e, _ in decision.tried if e.feasible), key=lambda e: e.peak_ram, default=None)
    estimate = human_bytes(worst.peak_ram) if worst else "n/a"
    if worst and worst.peak_ram <= decision.ram_budget:  # over only with the margin the estimate's error needs
        estimate += f" ({human_bytes(needed_ram(worst.peak_ram))} with the plan's {PLAN_MARGIN:.0%} margin)"
    where = f"`mode {decision.requested.value}`" if decision.requested is not MemoryMode.AUTO else "any memory mode"
    budget = f"{human_bytes(decision.ram_budget)} ({'recipe' if decision.ram_source.is_limit else '85% of free memory'})"
    message = f"the plan does not fit in {where}: estimated {estimate} > budget {budget}"
    diags.error("Q301", message, _span(ir), "over budget", help=_suggestion(ir, w, decision, costs))


def _span(ir: RecipeIR):
    m = ir.memory
    return m.span_of("ram") or m.span_of("mode") or m.span_of("vram") or ir.calibration.span_of("chunk") or ir.span


def _suggestion(ir: RecipeIR, w: Workload, decision: ModeDecision, costs: CostModel) -> str:
    if w.calibrate and w.chunk > 1:
        chunk = largest_fitting_chunk(w, decision, costs)
        if chunk is not None:
            estimates, _ = all_estimates(w, chunk, decision.ram_budget, decision.vram_budget, costs)
            fitted = select_mode(decision.requested, estimates, decision.ram_budget, decision.vram_budget)
            peak = next(e.peak_ram for e, ok in fitted.tried if ok)
            return (f"with `chunk {chunk}` it fits ({fitted.mode.value if fitted.mode else '?'}, {human_bytes(peak)}): "
                    f"--set calibrate.chunk={chunk}")
    if decision.requested is not MemoryMode.OFFLOAD:
        offload = costs.estimate(w, MemoryMode.OFFLOAD, w.chunk)
        if within(offload.peak_ram, decision.ram_budget):
            return f"`mode offload` fits ({human_bytes(offload.peak_ram)}): --set memory.mode=offload"
    if not w.disk:
        on_disk = costs.estimate(replace(w, disk=True), MemoryMode.OFFLOAD, 1)
        if within(on_disk.peak_ram, decision.ram_budget):
            return (f'`mode offload` with block caches on disk and `chunk 1` fits ({human_bytes(on_disk.peak_ram)}): '
                    'add `disk "./.qrc-cache"` to `memory`')
    least = min((e.peak_ram for e, _ in decision.tried if e.feasible), default=0)
    room = f" to at least {human_bytes(needed_ram(least))} (the estimate and its margin)" if least else ""
    return (_culprit(replace(w, disk=True), costs) + f"; raise `ram` above {human_bytes(decision.ram_budget)}"
            + room)


def _culprit(w: Workload, costs: CostModel) -> str:
    """What is too large even at the smallest setting (offload, chunk 1, caches on disk)."""
    smallest = costs.estimate(w, MemoryMode.OFFLOAD, 1)
    part, size = max(smallest.parts, key=lambda p: p[1])
    text = f"even `mode offload` with `chunk 1` needs {human_bytes(smallest.peak_ram)}, most of it {part} ({human_bytes(size)})"
    graph = w.index.graph
    if graph and w.observed and "activations" in part:
        peak = calibration_peak(graph, w.observed, 1, w.seqlen, w.past)
        value = graph.value(peak.largest)
        sizes = graph.sizes(1, w.seqlen, w.past)
        dims = [d if isinstance(d, int) else ("batch" if d == graph.batch_symbol else sizes.get(d or "", w.seqlen))
                for d in ((value.dims or ()) if value is not None else ())]
        text += (f"; the largest tensor is {peak.largest} [{', '.join(map(str, dims))}], "
                 f"{human_bytes(peak.largest_bytes)} per sample at seqlen {w.seqlen}")
    return text
