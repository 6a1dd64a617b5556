"""Memory-mode selection: a pure function of the estimates and the budgets, recorded with its numbers."""

from __future__ import annotations

from compiler.ir.types import Memory, MemoryMode
from compiler.ir.values import human_bytes
from compiler.plan.decision import ModeDecision, ModeEstimate, RamSource

AUTO_ORDER = (MemoryMode.FULL, MemoryMode.MULTI_GPU, MemoryMode.LOW_MEMORY, MemoryMode.OFFLOAD)
DETECTED_FRACTION = 0.85  # of free memory, when the recipe gives no `ram`
# A budget holds a plan only with room for the estimate's error: the plan promises to under-estimate a run by at
# most this much (docs/memory.md), so a `ram` that `qrc plan` accepts is one the compile stays under (Q302 never
# stops a run that its plan said fits)
PLAN_MARGIN = 0.10


def needed_ram(peak: int) -> int:
    """The smallest `ram` that holds a plan whose estimated peak is `peak`: the estimate and its margin."""
    return -(-peak * round(PLAN_MARGIN * 100 + 100) // 100)


def within(peak: int, ram: int) -> bool:
    """Whether a budget of `ram` holds an estimated `peak` with the plan's margin."""
    return needed_ram(peak) <= ram


def ram_budget(memory: Memory, detected_free: int) -> tuple[int, RamSource]:
    """The RAM budget and where it came from (the recipe, or detected free memory)."""
    if memory.ram is not None:
        return memory.ram, RamSource.RECIPE
    return int(detected_free * DETECTED_FRACTION), RamSource.DETECTED


def fits(estimate: ModeEstimate, ram: int, vram: tuple[int, ...]) -> bool:
    """Whether an estimate fits the budgets."""
    if not estimate.feasible or not within(estimate.peak_ram, ram):
        return False
    return estimate.mode is not MemoryMode.MULTI_GPU or estimate.peak_vram <= sum(vram)


def select_mode(requested: MemoryMode, estimates: dict[MemoryMode, ModeEstimate], ram: int,
                vram: tuple[int, ...] = (), ram_source: RamSource = RamSource.RECIPE) -> ModeDecision:
    """`auto` takes the first of full → multi_gpu → low_memory → offload that fits; an explicit mode is
    taken only if it fits. `mode` is None when nothing fits (the caller reports Q301)."""
    order = AUTO_ORDER if requested is MemoryMode.AUTO else (requested,)
    tried = []
    for mode in order:
        estimate = estimates[mode]
        ok = fits(estimate, ram, vram)
        tried.append((estimate, ok))
        if ok:
            return ModeDecision(mode, requested, ram, ram_source, vram, tuple(tried), _reason(requested, tried, ram))
    return ModeDecision(None, requested, ram, ram_source, vram, tuple(tried), _reason(requested, tried, ram))


def describe(estimate: ModeEstimate, ok: bool, ram: int) -> str:
    """One line about a candidate mode: its peak against the budget."""
    if not estimate.feasible:
        return f"{estimate.mode.value}: not applicable ({estimate.note})"
    sign = "≤" if estimate.peak_ram <= ram else ">"
    gpu = f", GPUs {human_bytes(estimate.peak_vram)}" if estimate.peak_vram else ""
    tight = estimate.peak_ram <= ram and not within(estimate.peak_ram, ram)
    margin = f", but not with the estimate's {PLAN_MARGIN:.0%} margin ({human_bytes(needed_ram(estimate.peak_ram))})" \
        if tight else ""
    return (f"{estimate.mode.value}: {human_bytes(estimate.peak_ram)} {sign} {human_bytes(ram)}{gpu}{margin}"
            f" → {'fits' if ok else 'does not fit'}")


def _reason(requested: MemoryMode, tried, ram: int) -> str:
    chosen = [e for e, ok in tried if ok]
    if not chosen:
        return "nothing fits: " + "; ".join(describe(e, ok, ram) for e, ok in tried)
    mode = chosen[0].mode.value
    if requested is not MemoryMode.AUTO:
        return f"{mode} as the recipe asks; it fits"
    skipped = [describe(e, ok, ram) for e, ok in tried[:-1]]
    return (f"auto chose {mode}, the first mode that fits" + (" (" + "; ".join(skipped) + ")" if skipped else ""))
