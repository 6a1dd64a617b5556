"""What a report says, as plain values: built from the plan (and, after a compile, the run's results),
then rendered by a template. No dates and no absolute paths, so a report of the same work reads the same."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from compiler.ir.printer import print_ir, recipe_hash, rule_text, scheme_parts
from compiler.ir.types import ActivationMode
from compiler.ir.values import human_bytes
from compiler.models.names import compress
from compiler.plan.ops import Plan, PlanOp, PropagateRanges
from compiler.plan.render import human_seconds
from compiler.plan.workload import workload
from compiler.report.chart import Series, line_chart
from compiler.resolve.assignment import Assignment
from compiler.resolve.smoothing import mapping_rows

MiB = 1 << 20
@dataclass(frozen=True, slots=True)
class Row:
    """One row of a report table."""
    cells: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Table:
    """A report table."""
    header: tuple[str, ...]
    rows: tuple[Row, ...]
    align: tuple[str, ...]  # "l" or "r" per column


@dataclass(frozen=True, slots=True)
class Report:
    """What a report says, as plain values (rendered by a template)."""
    title: str
    measured: bool  # a compile (False: a plan only)
    facts: tuple[tuple[str, str], ...]  # recipe, hash, model, backend, mode and why, …
    estimate: Table  # the planned peak's parts
    ops: Table
    layers: Table
    memory: tuple[tuple[str, str], ...]  # planned vs measured peak, samples
    timeline_svg: str  # "" for a plan
    timeline_samples: int
    verify: tuple[tuple[str, str], ...]
    costliest: Table | None  # when verification failed: the layers that add the most error
    schemes: Table  # every scheme the layers got, spelled out
    recipe_text: str  # the recipe as compiled, every default written out
    search: tuple[tuple[str, str], ...]  # what the mixed-precision search did ("" when none)
    search_units: Table | None
    search_curve: Table | None
    search_svg: str
    warnings: tuple[str, ...]
    transform: tuple[tuple[str, str], ...] = ()
    learned: tuple[tuple[str, str], ...] = ()  # what learned rounding cost and bought, measured
    verdict: tuple[str, ...] = ()  # what a reader must see first: a run past its memory plan, a failed verify  # what the outlier transform did (planned, and measured)
    mappings: Table | None = None  # which layers it touched
    runtimes: Table | None = None  # where the output runs (the runtime table `qrc plan` prints)


def _table(header: tuple[str, ...], rows, align: str) -> Table:
    return Table(header, tuple(Row(tuple(r)) for r in rows), tuple(align))


def shown_path(path: Path | str) -> str:
    """A path as the report shows it: relative to the working folder, or only its name."""
    path = Path(path)
    if not path.is_absolute():
        return path.as_posix()
    try:
        return path.relative_to(Path.cwd()).as_posix()
    except ValueError:
        return path.name


def build(planned, result=None) -> Report:
    """`planned`: the PlanResult of the recipe; `result`: the CompileResult of the run, if there was one."""
    ir, plan = planned.check.ir, planned.plan
    assignment = result.assignment if result is not None else planned.check.assignment
    facts = [("recipe", f"{ir.name} ({shown_path(plan.source)})"), ("recipe sha256", recipe_hash(print_ir(ir))),
             ("model", ir.model), ("backend", ir.backend.value),
             ("memory mode", f"{plan.decision.mode.value}: {plan.decision.reason}"),
             ("RAM budget", f"{human_bytes(plan.decision.ram_budget)} ({plan.decision.ram_source.value})"),
             ("layers", f"{plan.layers} ({plan.quantized_layers} quantized)")]
    if result is not None:
        facts.append(("output", shown_path(result.output)))
    chosen = next(e for e, _ in plan.decision.tried if e.mode is plan.decision.mode) if plan.decision.tried else None
    estimate = _table(("part", "bytes"), [(label, human_bytes(b)) for label, b in (chosen.parts if chosen else ())], "lr")
    ops = _ops(plan, result)
    warnings = tuple(f"{d.severity.value}[{d.code}]: {d.message}" for d in planned.diagnostics) + tuple(
        f"{d.severity.value}[{d.code}]: {d.message}" for d in (result.warnings if result is not None else ())
        if d.code != "Q447")  # the report opens with that one (`verdict`)
    return Report(
        title=f"qrc {'compile' if result is not None else 'plan'} report: {ir.name}",
        measured=result is not None, facts=tuple(facts), estimate=estimate, ops=ops,
        layers=_layers(ir, assignment, result, plan, planned.check.assignment), memory=_memory(plan, result),
        timeline_svg=_timeline(plan, result) if result is not None else "",
        timeline_samples=len(result.rss_samples) if result is not None else 0,
        verify=_verify(ir, result), costliest=_costliest(result), schemes=_schemes(assignment),
        recipe_text=print_ir(ir), search=_search(result), search_units=_search_units(result),
        search_curve=_search_curve(result), search_svg=_search_svg(result), warnings=warnings,
        transform=_transform(ir, assignment, result), mappings=_mappings(assignment), verdict=_verdict(result),
        learned=(("result", result.learned),) if result is not None and result.learned else (),
        runtimes=_runtimes(plan))


def _runtimes(plan: Plan) -> Table | None:
    """The runtime table: each runtime on each device, whether it runs the output, how, and what shows it."""
    if not plan.runtimes:
        return None
    return _table(("runtime", "device", "runs", "how", "shown by"),
                  [(c.runtime.label, c.device.value, "yes" if c.runs else "no", c.how, c.evidence.value)
                   for c in plan.runtimes], "lllll")


def _verdict(result) -> tuple[str, ...]:
    """The lines the report opens with: the run past its memory plan (Q447), verification that failed."""
    if result is None:
        return ()
    lines = [f"{d.severity.value}[{d.code}]: {d.message}" for d in result.warnings if d.code == "Q447"]
    if result.verify is not None and not result.verify_passed:
        lines.append("verification FAILED: see Verification below")
    return tuple(lines)


def _transform(ir, assignment: Assignment, result) -> tuple[tuple[str, str], ...]:
    """The transform's facts: a rotation says what it turns (it has no mappings), the others how many mappings."""
    t = ir.transform
    if t is None:
        return ()
    done = (("result", result.transform),) if result is not None and result.transform else ()
    if t.kind.rotates:
        online = ", ".join(r.value for r in t.online)
        turned = (("rotations", "R1 (residual stream), R2 (each head's values)" + (f"; online: {online}" if online else "")),
                  ("block", str(t.block) if t.block else "the whole width"))
        return (("method", t.kind.name),) + turned + done
    return (("method", t.kind.name), ("mappings", str(len(assignment.smoothing)))) + done


def _mappings(assignment: Assignment) -> Table | None:
    if not assignment.smoothing:
        return None
    return _table(("source", "kind", "targets", "found"), mapping_rows(assignment.smoothing), "llll")


def _range_sources(ir, assignment: Assignment, plan: Plan) -> dict[str, str]:
    """Each activation-quantized layer's input: observed, inherited from a passthrough producer, or dynamic."""
    sources = workload(ir, assignment).source_of
    propagated = plan.first(PropagateRanges) is not None  # the plan lets passthrough outputs inherit ranges
    out = {}
    for a in assignment.layers:
        act = a.scheme.activations if not a.scheme.is_none else None
        if act is None:
            continue
        if act.mode is ActivationMode.DYNAMIC:
            out[a.layer.name] = "dynamic"
        elif propagated and sources.get(a.layer.input, a.layer.input) != a.layer.input:
            out[a.layer.name] = f"inherited from {sources[a.layer.input]}"
        else:
            out[a.layer.name] = "observed"
    return out


def _number(value: float, digits: int = 4) -> str:
    return "∞" if math.isinf(value) else f"{value:.{digits}g}"


def _schemes(assignment: Assignment) -> Table:
    """Each scheme in use (a reader of `w4` sees group 128 and GPTQ), with how many layers have it."""
    used: dict[str, list] = {}
    for a in assignment.layers:
        if not a.scheme.is_none:
            used.setdefault(a.scheme.name, [a.scheme, 0])[1] += 1
    rows = [(name, *scheme_parts(scheme), str(count)) for name, (scheme, count) in used.items()]
    return _table(("scheme", "weights", "activations", "rounding", "layers"), rows, "llllr")


def _costliest(result, shown: int = 10) -> Table | None:
    """The layers whose quantization adds the most error (measured when verification failed)."""
    if result is None or not result.layer_errors:
        return None
    rows = [(name, f"{added:.4g}") for name, added in list(result.layer_errors.items())[:shown]]
    return _table(("layer", "relative error it adds"), rows, "lr")


def _layers(ir, assignment: Assignment, result, plan: Plan, before: Assignment) -> Table:
    """One row per layer; a layer the mixed-precision search moved says from which scheme."""
    sources = _range_sources(ir, assignment, plan)
    ruled = {a.layer.name: a.scheme.name for a in before.layers} if result is not None and result.search else {}
    rows = []
    for a in assignment.layers:
        rule = f"{rule_text(a.rule)} (line {a.rule.span.line})" if a.rule else "-"
        scheme = a.scheme.name + (f" (from {a.promoted_from})" if a.promoted_from else "") + \
            (f" (search: from {ruled[a.layer.name]})" if ruled.get(a.layer.name, a.scheme.name) != a.scheme.name else "")
        sqnr = ranges = "-"
        if result is not None:
            if a.layer.name in result.weight_sqnr:
                sqnr = _number(result.weight_sqnr[a.layer.name], 3)
            if a.layer.name in result.input_ranges:
                lo, hi = result.input_ranges[a.layer.name]
                ranges = f"[{_number(lo)}, {_number(hi)}]"
        row = (a.layer.name, a.layer.op, "x".join(map(str, a.layer.shape)), scheme, rule, a.group or "-",
               sources.get(a.layer.name, "-"))
        rows.append(row + ((sqnr, ranges) if result is not None else ()))
    header = ("layer", "op", "shape", "scheme", "rule", "group", "range source")
    if result is None:  # a plan: nothing measured yet
        return _table(header, rows, "lllllll")
    return _table(header + ("weight SQNR dB", "activation range"), rows, "lllllllrl")


def _ops(plan: Plan, result) -> Table:
    """The plan's ops with their planned peak and time; after a compile, each op's measured time beside."""
    if result is None:
        return _table(("#", "op", "×", "planned peak", "planned time", "what"),
                      [(str(i), op.kind.value, str(op.repeat), human_bytes(op.peak_bytes), human_seconds(op.seconds),
                        op.summary) for i, op in enumerate(plan.ops, start=1)], "rlrrrl")
    took = {id(op): seconds for op, seconds in result.op_seconds}
    return _table(("#", "op", "×", "planned peak", "planned time", "measured time", "what"),
                  [(str(i), op.kind.value, str(op.repeat), human_bytes(op.peak_bytes), human_seconds(op.seconds),
                    f"measured {human_seconds(took[id(op)])}" if id(op) in took else "not run", op.summary)
                   for i, op in enumerate(plan.ops, start=1)], "rlrrrrl")


def _memory(plan: Plan, result) -> tuple[tuple[str, str], ...]:
    out = [("planned peak", human_bytes(plan.peak_bytes))]
    if result is not None:
        planned = result.planned_peak
        ratio = result.peak_rss / planned if planned else 0
        basis = "" if planned == plan.peak_bytes else f" of {human_bytes(planned)}, the ops that did their work"
        together = ", with its child processes" if getattr(result, "peak_with_children", False) else ""
        out += [("measured peak RSS", f"{human_bytes(result.peak_rss)} ({ratio:.2f}× planned{basis}{together})"),
                *((f"rank {r} peak RSS", f"{human_bytes(b)} ({b / planned if planned else 0:.2f}× planned)")
                  for r, b in enumerate(result.rank_peaks)),
                ("RSS samples", f"{len(result.rss_samples)}, one every 20 ms (the peak also reads the kernel's "
                                "high-water mark)"),
                ("time", f"{human_seconds(result.wall_seconds)} measured vs {human_seconds(result.planned_seconds)} "
                         f"planned ({result.wall_seconds / result.planned_seconds if result.planned_seconds else 0:.2f}×), "
                         f"calibration {result.calibration_seconds:.2f} s")]
    else:
        out.append(("planned time", f"{human_seconds(plan.seconds)} on this machine ({human_seconds(plan.start_seconds)} "
                                    "to start, the rest per op)"))
    return tuple(out)


def planned_for(plan: Plan, op: PlanOp | None) -> int:
    """The planned peak while `op` ran (each RSS sample names the op running; before the first, the plan's)."""
    return plan.peak_bytes if op is None else op.peak_bytes


def _timeline(plan: Plan, result) -> str:
    samples = result.rss_samples
    measured = Series("measured RSS", tuple((t, rss / MiB) for t, rss, _ in samples))
    steps, last = [], object()
    for t, _, op in samples:
        if op is not last:
            steps.append((t, planned_for(plan, op) / MiB))
            last = op
    if samples:
        steps.append((samples[-1][0], steps[-1][1]))
    planned = Series("planned, this op", tuple(steps), step=True)
    return line_chart([measured, planned], "seconds since the compile started", "MiB", "memory timeline", y_floor=0)


def _verify(ir, result) -> tuple[tuple[str, str], ...]:
    if result is None or result.verify is None:
        return ()
    v = ir.verify
    verdict = "passed" if result.verify_passed else "FAILED"
    return ((f"{v.metric.value} ({v.bound.value} {v.threshold:g})", f"{result.verify.get(v.metric.value, float('nan')):.6g}: {verdict}"),
            *((name, f"{value:.6g}") for name, value in result.verify.items()),
            *((("measured on", result.verified_on),) if result.verified_on else ()))


def _search(result) -> tuple[tuple[str, str], ...]:
    s = result.search if result is not None else None
    if s is None:
        return ()
    return (("metric", s.metric.value), ("units", str(len(s.units))),
            ("average bits per weight", f"{s.average_bits:.3f} (budget {s.budget_bits:g}, scales included)"),
            ("predicted loss", f"{s.predicted_loss:.6g} ({s.metric.value}, Σ over units)"),
            ("scores", "from the cache" if s.from_cache else "computed, then cached"),
            *((f"→ {c}", f"{len(names)} layers: {', '.join(compress(names))}") for c, names in s.layers_by_choice().items()))


def _search_units(result) -> Table | None:
    s = result.search if result is not None else None
    if s is None:
        return None
    rows = [(u.unit, f"{u.params:,}", *(f"{x:.6g}" for x in u.losses), u.chosen, f"{u.bits:.3f}") for u in s.units]
    return _table(("unit", "params", *(f"loss as {c}" for c in s.choices), "chosen", "bits"), rows,
                  "lr" + "r" * len(s.choices) + "lr")


def _curve_points(s) -> list[tuple[float, float]]:
    """At most 16 points of the greedy path, always its ends."""
    points = list(s.curve)
    if len(points) <= 16:
        return points
    step = (len(points) - 1) / 15
    return [points[round(i * step)] for i in range(16)]


def _search_curve(result) -> Table | None:
    s = result.search if result is not None else None
    if s is None:
        return None
    return _table(("bits per weight", f"predicted loss ({s.metric.value})"),
                  [(f"{b:.3f}", f"{loss:.6g}") for b, loss in _curve_points(s)], "rr")


def _search_svg(result) -> str:
    s = result.search if result is not None else None
    if s is None:
        return ""
    return line_chart([Series("greedy path (scores)", tuple(s.curve)),
                       Series("chosen", ((s.average_bits, s.predicted_loss),), markers_only=True)],
                      "bits per weight (scales included)", f"predicted loss ({s.metric.value})", "quality against bits")
