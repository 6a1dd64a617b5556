"""Groups: layers that must share one scheme (Q/K/V of one attention block), one instance per block.

Applied after the rules. `promote` gives every member the widest member's scheme (Q211, a warning that
lists what moved); `error` refuses a mixed instance (Q210).
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, replace

from compiler.diagnostics import Diagnostics
from compiler.ir.patterns import alternations
from compiler.ir.types import AutoGroup, Granularity, Group, GroupPolicy, RecipeIR, Scheme
from compiler.models.names import compress
from compiler.resolve.assignment import Assignment
from compiler.resolve.model_checks import closest_names

# `group auto qkv`: the member spellings it knows, and fused projections (one member: nothing to align).
QKV_SPELLINGS = (("q_proj", "k_proj", "v_proj"), ("query", "key", "value"), ("Wq", "Wk", "Wv"), ("q", "k", "v"))
FUSED_QKV = ("qkv_proj", "query_key_value", "c_attn", "Wqkv", "qkv")
# `group auto gate_up`: an MLP's (or one MoE expert's) gate and up projections, which serving stacks fuse
# into one GEMM (vLLM's merged column-parallel layer); fused already: one member.
GATE_UP_SPELLINGS = (("gate_proj", "up_proj"), ("w1", "w3"), ("wi_0", "wi_1"))
FUSED_GATE_UP = ("gate_up_proj", "w13", "fc1_gate_up")


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
    w = scheme.quantized_weights
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
    return _sibling_instances(names, QKV_SPELLINGS, weak=(len(QKV_SPELLINGS) - 1,))


def auto_gate_up_instances(names: list[str]) -> list[Instance]:
    """Gate/up instances found by name (`group auto gate_up`): one per MLP and one per MoE expert."""
    return _sibling_instances(names, GATE_UP_SPELLINGS, weak=tuple(range(len(GATE_UP_SPELLINGS))))


def _sibling_instances(names: list[str], spellings, weak: tuple[int, ...]) -> list[Instance]:
    """Layers under one parent whose last names are members of one spelling. A spelling in `weak`
    (short names such as `q` or `w1`) needs two members present to count."""
    by_parent: dict[tuple[str, int], dict[str, str]] = defaultdict(dict)
    first: dict[str, int] = {}  # a member name → the first spelling that has it (a dictionary: 45,033 layers)
    for index, spelling in enumerate(spellings):
        for member in spelling:
            first.setdefault(member, index)
    for name in names:
        parent, _, last = name.rpartition(".")
        if last in first:
            by_parent[(parent, first[last])][last] = name
    out = []
    for (parent, index), got in by_parent.items():
        spelling = spellings[index]
        if len(got) < 2 and index in weak:
            continue  # a lone `q` or `w1` is too weak a signal
        prefix = f"{parent}." if parent else ""
        out.append(_instance(f"{prefix}{{{','.join(spelling)}}}", spelling, got))
    return out


def has_fused_qkv(names: list[str]) -> bool:
    """Whether the model has a fused QKV projection instead of separate ones."""
    return any(name.rpartition(".")[2] in FUSED_QKV for name in names)


def has_fused_gate_up(names: list[str]) -> bool:
    """Whether the model has fused gate/up projections instead of separate ones."""
    return any(name.rpartition(".")[2] in FUSED_GATE_UP for name in names)


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
    finders = _AUTO_FINDERS[group.auto]
    instances = [i for find, _ in finders for i in find(names)]
    if not instances and not any(fused(names) for _, fused in finders):
        written, what, label, looks = _AUTO_WORDS[group.auto]
        diags.warning("Q245", f"`group {written}` found no {what}", group.span, label,
                      help=f"it looks for {looks}; write the pattern yourself: " + 'group "*.attn.{q,k,v}"')
    return instances


# what `group auto …` finds, and how it tells the projections are fused already (nothing to align)
_AUTO_FINDERS = {
    AutoGroup.QKV: ((auto_qkv_instances, has_fused_qkv),),
    AutoGroup.GATE_UP: ((auto_gate_up_instances, has_fused_gate_up),),
    AutoGroup.ALL: ((auto_qkv_instances, has_fused_qkv), (auto_gate_up_instances, has_fused_gate_up)),
}
# `group auto …` as written, what it looks for, the label and the spellings it knows (Q245)
_AUTO_WORDS = {
    AutoGroup.QKV: ("auto qkv", "attention projections", "no q/k/v layers", "q/k/v_proj, query/key/value and Wq/Wk/Wv"),
    AutoGroup.GATE_UP: ("auto gate_up", "gate/up projections", "no gate/up layers", "gate_proj/up_proj, w1/w3 and wi_0/wi_1"),
    AutoGroup.ALL: ("auto", "attention or gate/up projections", "nothing to align",
                    "q/k/v_proj, query/key/value, Wq/Wk/Wv, gate_proj/up_proj, w1/w3 and wi_0/wi_1"),
}


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
