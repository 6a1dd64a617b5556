"""A plan in its three forms: canonical text (goldens, logs), JSON, and a rich view for people."""

from __future__ import annotations

import json

from compiler.ir.runtimes import table_lines
from compiler.ir.values import human_bytes
from compiler.models.names import compress
from compiler.plan.modes import describe
from compiler.plan.ops import Plan, PlanOp


def _bytes(n: int) -> str:
    return f"{n} B ({human_bytes(n)})"


def human_seconds(seconds: float) -> str:
    """`0.4 s`, `12 s`, `3 min 20 s`, `2 h 05 min`: a time as a person reads it."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes} min {int(seconds % 60):02d} s"
    return f"{minutes // 60} h {minutes % 60:02d} min"


def _layers(names: tuple[str, ...], limit: int = 4) -> str:
    shown = compress(names)
    more = f", … {len(shown) - limit} more" if len(shown) > limit else ""
    return ", ".join(shown[:limit]) + more


def header_lines(plan: Plan) -> list[str]:
    """The plan's header: model, backend, budget, mode, peak and its parts."""
    d = plan.decision
    chosen = next(e for e, ok in d.tried if ok)
    source = d.ram_source.described
    lines = [
        f"plan {plan.recipe}  ({plan.source})",
        f"model    {plan.model}  ({plan.layers} layers, {plan.quantized_layers} quantized)",
        f"backend  {plan.backend.value}",
        f"budget   ram {_bytes(d.ram_budget)}, {source}"
        + (f"; vram {' + '.join(human_bytes(v) for v in d.vram_budget)}" if d.vram_budget else ""),
        f"mode     {plan.mode.value}: {d.reason}",
        f"peak     {_bytes(plan.peak_bytes)} estimated",
        f"time     {human_seconds(plan.seconds)} estimated on this machine ({human_seconds(plan.start_seconds)} to "
        "start, the rest per op below)",
        "estimate " + " + ".join(f"{name} {human_bytes(b)}" for name, b in chosen.parts if b),
    ]
    if plan.ranks > 1:
        lines.append(f"ranks    {plan.ranks} torchrun processes: each runs its share of the sample chunks (chunk i on "
                     f"rank i mod {plan.ranks}) and rounds its share of each block's layers; the peaks and budgets "
                     "above are each rank's")
    runs = table_lines(plan.runtimes)
    runs = [("runs in  " if i == 0 else "         ") + line for i, line in enumerate(runs)]
    return lines + [f"note     {n}" for n in plan.notes] + runs


def op_lines(index: int, op: PlanOp) -> list[str]:
    """The lines of one op in the listing."""
    repeat = f" ×{op.repeat}" if op.repeat > 1 else ""
    lines = [f"{index:>2}. {op.kind.value}{repeat}  peak {_bytes(op.peak_bytes)}  time {human_seconds(op.seconds)}",
             f"      {op.summary}"]
    params = "  ".join(f"{k}={v}" for k, v in op.params)
    if params:
        lines.append(f"      {params}")
    if op.layers:
        lines.append(f"      layers: {_layers(op.layers)}")
    lines.append(f"      in: {', '.join(b.value for b in op.inputs)}  →  out: {', '.join(b.value for b in op.outputs)}")
    return lines


def to_text(plan: Plan) -> str:
    """The canonical text of a plan (goldens, logs)."""
    lines = header_lines(plan) + ["", "ops"]
    for i, op in enumerate(plan.ops, start=1):
        lines += op_lines(i, op)
    return "\n".join(lines) + "\n"


def to_json(plan: Plan) -> str:
    """The plan as JSON."""
    d = plan.decision
    compressed: dict[tuple[str, ...], list[str]] = {}  # ops often name the same layers (36,473 of them for Qwen3-235B)
    data = {
        "recipe": plan.recipe, "source": plan.source, "model": plan.model, "backend": plan.backend.value,
        "layers": plan.layers, "quantized_layers": plan.quantized_layers, "peak_bytes": plan.peak_bytes,
        "seconds": round(plan.seconds, 3), "start_seconds": round(plan.start_seconds, 3),
        **({"ranks": plan.ranks} if plan.ranks > 1 else {}),
        "memory": {"mode": plan.mode.value, "requested": d.requested.value, "ram_budget": d.ram_budget,
                   "ram_source": d.ram_source.value, "vram_budget": list(d.vram_budget), "reason": d.reason,
                   "tried": [{"mode": e.mode.value, "peak_ram": e.peak_ram, "peak_vram": e.peak_vram,
                              "feasible": e.feasible, "fits": ok, "parts": dict(e.parts)} for e, ok in d.tried]},
        "ops": [{"op": op.kind.value, "repeat": op.repeat, "peak_bytes": op.peak_bytes,
                 "seconds": round(op.seconds, 3), "summary": op.summary,
                 "params": dict(op.params), "inputs": [b.value for b in op.inputs], "outputs": [b.value for b in op.outputs],
                 "layers": compressed.get(op.layers) or compressed.setdefault(op.layers, compress(op.layers))}
                for op in plan.ops],
        "notes": list(plan.notes),
        "runtimes": [{"runtime": c.runtime.value, "device": c.device.value, "runs": c.runs, "how": c.how,
                      "evidence": c.evidence.value} for c in plan.runtimes],
    }
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def to_rich(plan: Plan):
    """The plan as rich renderables (`qrc plan`)."""
    from rich.console import Group, JustifyMethod
    from rich.table import Table
    from rich.text import Text

    head = Text("\n".join(header_lines(plan)))
    table = Table(title="ops, in execution order")
    columns: tuple[tuple[str, JustifyMethod], ...] = (("#", "right"), ("op", "left"), ("×", "right"), ("peak", "right"),
                                                     ("time", "right"), ("what", "left"))
    for col, justify in columns:
        table.add_column(col, justify=justify, no_wrap=col in ("op", "peak", "time"))
    for i, op in enumerate(plan.ops, start=1):
        what = op.summary + (f"\n[dim]{_layers(op.layers)}[/]" if op.layers else "")
        table.add_row(str(i), op.kind.value, str(op.repeat), human_bytes(op.peak_bytes), human_seconds(op.seconds), what)
    tried = Text("\n".join(describe(e, ok, plan.decision.ram_budget) for e, ok in plan.decision.tried))
    return Group(head, Text(""), table, Text("modes considered:", style="bold"), tried)
