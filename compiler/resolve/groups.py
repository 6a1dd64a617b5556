"""Groups: layers that must share one scheme (Q/K/V of one attention block), one instance per block.

Applied after the rules. `promote` gives every member the widest member's scheme (Q211, a warning that
lists what moved); `error` refuses a mixed instance (Q210).
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, replace

from compiler.ir.patterns import alternations
from compiler.ir.types import Granularity, Group, GroupPolicy, RecipeIR, Scheme
from compiler.ir.values import Diagnostics
from compiler.models.names import compress
from compiler.resolve.assignment import Assignment
from compiler.resolve.model_checks import closest_names

# `group auto qkv`: the member spellings it knows, and fused projections (one member: nothing to align).
QKV_SPELLINGS = (("q_proj", "k_proj", "v_proj"), ("query", "key", "value"), ("Wq", "Wk", "Wv"), ("q", "k", "v"))
FUSED_QKV = ("qkv_proj", "query_key_value", "c_attn", "Wqkv", "qkv")


@dataclass(frozen=True, slots=True)
class Instance:
    """One instance of a group: the layers that must share a scheme."""
    name: str  # `model.layers.0.self_attn.{q,k,v}_proj`
    members: tuple[str, ...]  # layer names present, in member order
    missing: tuple[str, ...]  # member alternatives with no layer


def scheme_rank(scheme: Scheme) -> tuple:
    """Wider is larger: float > more weight bits > weight-only > finer granularity (smaller groups)."""
    if scheme.is_none:
        return (1, 0, 0, 0, 0)
    w = scheme.weights
    granularity = {Granularity.GROUP: 2, Granularity.PER_CHANNEL: 1, Granularity.PER_TENSOR: 0}[w.granularity]
    return (0, w.qtype.bits, scheme.activations is None, granularity, -(w.group_size or 0))


def pattern_instances(pattern: str, names: list[str]) -> list[Instance]:
    """The instances of a `{a,b}` pattern group over the layer names."""
    (start, end, members), = alternations(pattern)
    regex = []
    for i, ch in enumerate(pattern):
        if i < start or i >= end:
            regex.append({"*": "(.*)", "?": "(.)"}.get(ch, re.escape(ch)))
        elif i == start:
            regex.append("(?P<member>" + "|".join(re.escape(m) for m in members) + ")")
    compiled = re.compile("".join(regex))
    found: dict[tuple, dict[str, str]] = {}
    for name in names:
        match = compiled.fullmatch(name)
        if match:
            key = tuple(g for i, g in enumerate(match.groups()) if i + 1 != match.re.groupindex["member"])
            found.setdefault(key, {})[match.group("member")] = name
    return [_instance(_fill(pattern, start, end, key), members, got) for key, got in found.items()]


def _fill(pattern: str, start: int, end: int, key: tuple) -> str:
    """The instance's display name: the wildcards filled in, the `{…}` kept."""
    parts, captured = [], iter(key)
    for i, ch in enumerate(pattern):
        parts.append(next(captured) if ch in "*?" and not start <= i < end else ch)
    return "".join(parts)


def _instance(name: str, members, got: dict[str, str]) -> Instance:
    return Instance(name, tuple(got[m] for m in members if m in got), tuple(m for m in members if m not in got))


def auto_qkv_instances(names: list[str]) -> list[Instance]:
    """Q/K/V instances found by name (`group auto qkv`)."""
    by_parent: dict[tuple[str, int], dict[str, str]] = defaultdict(dict)
    for name in names:
        parent, _, last = name.rpartition(".")
        for index, spelling in enumerate(QKV_SPELLINGS):
            if last in spelling:
                by_parent[(parent, index)][last] = name
                break
    out = []
    for (parent, index), got in by_parent.items():
        spelling = QKV_SPELLINGS[index]
        if len(got) < 2 and index == len(QKV_SPELLINGS) - 1:
            continue  # a lone `q`/`k`/`v` is too weak a signal to call an attention block
        prefix = f"{parent}." if parent else ""
        out.append(_instance(f"{prefix}{{{','.join(spelling)}}}", spelling, got))
    return out


def has_fused_qkv(names: list[str]) -> bool:
    """Whether the model has a fused QKV projection instead of separate ones."""
    return any(name.rpartition(".")[2] in FUSED_QKV for name in names)


def apply_groups(ir: RecipeIR, assignment: Assignment, diags: Diagnostics) -> Assignment:
    """Give each group instance one scheme (by its policy); Q210/Q211 where it cannot."""
    by_name = {a.layer.name: a for a in assignment.layers}
    names = list(by_name)
    for group in ir.groups:
        instances = _instances(group, names, diags)
        _report_missing(group, instances, diags)
        moved = _align(group, instances, by_name, diags)
        if moved:
            _report_moves(group, moved, len(instances), diags)
    return replace(assignment, layers=tuple(by_name[n] for n in names))


def _instances(group: Group, names: list[str], diags: Diagnostics) -> list[Instance]:
    if group.pattern is not None:
        instances = pattern_instances(group.pattern, names)
        if not instances:
            diags.error("Q201", f'group pattern "{group.pattern}" matches no layer', group.span,
                        f"0 of {len(names)} layers", help="closest names: " + ", ".join(closest_names(group.pattern, names)))
        return instances
    instances = auto_qkv_instances(names)
    if not instances and not has_fused_qkv(names):
        diags.warning("Q245", "`group auto qkv` found no attention projections", group.span, "no q/k/v layers",
                      help="it looks for q/k/v_proj, query/key/value and Wq/Wk/Wv; write the pattern yourself: "
                      'group "*.attn.{q,k,v}"')
    return instances


def _report_missing(group: Group, instances: list[Instance], diags: Diagnostics) -> None:
    incomplete = [i for i in instances if i.missing]
    if incomplete:
        shown = "; ".join(f"{i.name} lacks {', '.join(i.missing)}" for i in incomplete[:3])
        more = f" (and {len(incomplete) - 3} more)" if len(incomplete) > 3 else ""
        diags.warning("Q244", f"{len(incomplete)} of {len(instances)} group instance(s) miss members: {shown}{more}",
                      group.span, "incomplete instances",
                      help="the members that exist are still aligned; check the pattern if a member is misspelled")


def _align(group: Group, instances: list[Instance], by_name, diags: Diagnostics):
    moved: list[tuple[str, str, str]] = []  # (layer, from, to)
    for instance in instances:
        members = [by_name[n] for n in instance.members]
        schemes = {a.scheme.name: a.scheme for a in members}
        for a in members:
            by_name[a.layer.name] = replace(a, group=instance.name)
        if len(schemes) < 2:
            continue
        if group.policy is GroupPolicy.ERROR:
            given = ", ".join(f"{a.layer.name.rpartition('.')[2]} → {a.scheme.name}" for a in members)
            diags.error("Q210", f"group instance {instance.name} would end with mixed schemes ({given})",
                        group.span, "mixed precision in a group",
                        help="give the members one scheme in `quantize`, or use `policy promote`")
            continue
        widest = max(schemes.values(), key=scheme_rank)
        for a in members:
            if a.scheme.name != widest.name:
                moved.append((a.layer.name, a.scheme.name, widest.name))
                by_name[a.layer.name] = replace(by_name[a.layer.name], scheme=widest, promoted_from=a.scheme.name)
    return moved


def _report_moves(group: Group, moved, instance_count: int, diags: Diagnostics) -> None:
    by_change: dict[tuple[str, str], list[str]] = defaultdict(list)
    for layer, old, new in moved:
        by_change[(old, new)].append(layer)
    parts = [f"{', '.join(compress(layers))}: {old} → {new}" for (old, new), layers in by_change.items()]
    diags.warning("Q211", f"group promoted {len(moved)} layer(s) to the widest member's scheme: {'; '.join(parts)}",
                  group.span, "promoted", help="members of a group share one scheme; write `policy error` to "
                  "make this an error, or assign the members one scheme in `quantize`")
