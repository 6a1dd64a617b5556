"""`qrc inspect`: one row per layer (scheme, winning rule, group) and totals per scheme, as text/JSON/rich."""

from __future__ import annotations

import json
from dataclasses import dataclass

from compiler.ir.values import human_bytes
from compiler.models.index import ModelIndex
from compiler.resolve.assignment import Assignment
from compiler.resolve.sizes import quantized_bytes
from compiler.resolve.smoothing import mapping_rows


@dataclass(frozen=True, slots=True)
class Row:
    """One row of `qrc inspect`: a layer, its op and shape, and what the recipe gives it."""
    name: str
    op: str
    shape: str
    params: int
    scheme: str
    rule: str
    group: str


@dataclass(frozen=True, slots=True)
class Total:
    """Layers, parameters and bytes before/after of one scheme."""
    scheme: str
    layers: int
    params: int
    bytes_before: int
    bytes_after: int


def rows(index: ModelIndex, assignment: Assignment | None) -> list[Row]:
    """One row per layer (scheme, rule and group when a recipe was resolved)."""
    if assignment is None:
        return [Row(x.name, f"{x.kind.value}/{x.op}", "x".join(map(str, x.shape)), x.params, "", "", "") for x in index.layers]
    out = []
    for a in assignment.layers:
        x = a.layer
        scheme = a.scheme.name + (f" (from {a.promoted_from})" if a.promoted_from else "")
        rule = f"{a.rule.span.source.name}:{a.rule.span.line}" if a.rule else "-"
        out.append(Row(x.name, f"{x.kind.value}/{x.op}", "x".join(map(str, x.shape)), x.params, scheme, rule, a.group or "-"))
    return out


def totals(assignment: Assignment) -> list[Total]:
    """Totals per scheme, in order of first appearance."""
    acc: dict[str, list[int]] = {}
    for a in assignment.layers:
        t = acc.setdefault(a.scheme.name, [0, 0, 0, 0])
        t[0] += 1
        t[1] += a.layer.params
        t[2] += a.layer.bytes
        t[3] += quantized_bytes(a.layer, a.scheme)
    return [Total(name, *values) for name, values in acc.items()]


def to_text(index: ModelIndex, assignment: Assignment | None) -> str:
    """A plain, aligned table: the canonical form used by goldens."""
    table = rows(index, assignment)
    header = ("layer", "op", "shape", "params") + (("scheme", "rule", "group") if assignment else ())
    cells: list[tuple[str, ...]] = [header] + [(r.name, r.op, r.shape, str(r.params)) + ((r.scheme, r.rule, r.group) if assignment else ())
                        for r in table]
    lines = [_aligned(cells)]
    lines.append(f"\n{index.ref}: {len(index.layers)} layers, {sum(x.params for x in index.layers)} layer params, "
                 f"weights {human_bytes(index.total_bytes)} ({index.total_bytes} bytes)")
    if assignment:
        summary: list[tuple[str, ...]] = [("scheme", "layers", "params", "before", "after")]
        for t in totals(assignment):
            summary.append((t.scheme, str(t.layers), str(t.params), human_bytes(t.bytes_before), human_bytes(t.bytes_after)))
        lines.append("\n" + _aligned(summary))
    if assignment and assignment.smoothing:  # which layers the recipe's outlier transform touches
        mapped: list[tuple[str, ...]] = [("transform source", "kind", "targets (scaled input columns)", "found")]
        lines.append("\n" + _aligned(mapped + list(mapping_rows(assignment.smoothing))))
    return "\n".join(lines) + "\n"


def _aligned(cells: list[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells)


def to_json(index: ModelIndex, assignment: Assignment | None) -> str:
    """The index (and assignment) as JSON."""
    data = {
        "model": index.ref, "format": index.format.value, "family": index.family, "total_bytes": index.total_bytes,
        "inputs": [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape)} for t in index.inputs],
        "outputs": [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape)} for t in index.outputs],
        "layers": [{k: getattr(r, k) for k in Row.__slots__} for r in rows(index, assignment)],
    }
    if assignment:
        data["totals"] = [{k: getattr(t, k) for k in Total.__slots__} for t in totals(assignment)]
    if assignment and assignment.smoothing:
        data["transform"] = [{"source": m.source, "kind": m.kind.value, "targets": list(m.targets),
                              "inferred": m.inferred} for m in assignment.smoothing]
    return json.dumps(data, indent=2) + "\n"


def to_rich(index: ModelIndex, assignment: Assignment | None):
    """The index (and assignment) as a rich table."""
    from rich.console import Group
    from rich.table import Table

    under = ""
    if assignment and any(a.rule for a in assignment.layers):
        under = f" under {next(a.rule for a in assignment.layers if a.rule).span.source.name}"
    table = Table(title=f"{index.ref}{under} — {len(index.layers)} layers, weights {human_bytes(index.total_bytes)}")
    for col in ("layer", "op", "shape", "params") + (("scheme", "rule", "group") if assignment else ()):
        table.add_column(col, justify="right" if col == "params" else "left", overflow="fold",
                         no_wrap=col in ("op", "rule", "shape", "params"))
    for r in rows(index, assignment):
        rule = "line " + r.rule.rpartition(":")[2] if r.rule != "-" else "-"
        op = r.op.rpartition("/")[2]  # the kind is implied by the op on narrow terminals
        table.add_row(r.name, op, r.shape, str(r.params), *((r.scheme, rule, r.group) if assignment else ()))
    if not assignment:
        return table
    summary = Table(title="per scheme")
    for col in ("scheme", "layers", "params", "before", "after"):
        summary.add_column(col, justify="left" if col == "scheme" else "right")
    for t in totals(assignment):
        summary.add_row(t.scheme, str(t.layers), f"{t.params:,}", human_bytes(t.bytes_before), human_bytes(t.bytes_after))
    if not assignment.smoothing:
        return Group(table, summary)
    mapped = Table(title="transform mappings (source output ÷ s, target input columns × s)")
    for col in ("source", "kind", "targets", "found"):
        mapped.add_column(col, overflow="fold")
    for row in mapping_rows(assignment.smoothing):
        mapped.add_row(*row)
    return Group(table, summary, mapped)
