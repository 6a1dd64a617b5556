"""Rules applied to a model: the last matching rule wins; unmatched layers stay float (`none`).

Groups are applied after the rules (compiler/resolve/groups.py); problems go to diagnostics.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from compiler.ir.schemes import NONE
from compiler.ir.types import RecipeIR, Rule, Scheme
from compiler.ir.values import Diagnostics
from compiler.models.index import Layer, ModelIndex
from compiler.resolve.selectors import matcher


@dataclass(frozen=True, slots=True)
class LayerAssignment:
    """One layer's scheme, the rule that gave it, and its group."""
    layer: Layer
    scheme: Scheme
    rule: Rule | None  # the winning rule; None when no rule matched (the layer stays float)
    group: str | None = None  # the group instance, e.g. `model.layers.0.self_attn.{q,k,v}_proj`
    promoted_from: str | None = None  # the scheme the rule gave, when a group promoted it


@dataclass(frozen=True, slots=True)
class Assignment:
    """For every layer of the model, in model order: its scheme, the rule that chose it, its group."""

    model: ModelIndex
    layers: tuple[LayerAssignment, ...]
    smoothing: tuple = ()  # the outlier transform's SmoothingMapping's (compiler/resolve/smoothing.py)

    def of(self, name: str) -> LayerAssignment:
        """The assignment of the layer named `name`."""
        return next(a for a in self.layers if a.layer.name == name)


def rule_matches(rule: Rule, layers: tuple[Layer, ...]) -> list[list[Layer]]:
    """For each selector of the rule, the layers it matches."""
    return [[layer for layer in layers if matcher(sel)(layer)] for sel in rule.selectors]


def resolve(ir: RecipeIR, index: ModelIndex, diags: Diagnostics, precision: Mapping[str, str] | None = None) -> Assignment:
    """Assign a scheme to every layer, run the model-dependent checks, then apply the groups.

    `precision` (layer → scheme name) is what a mixed-precision search chose; it replaces the rules'
    schemes before the groups, whose members it always moves together."""
    from compiler.resolve import groups, mixed, model_checks, smoothing

    known = {s.name: s for s in ir.schemes}
    winners: dict[str, Rule] = {}
    for rule in ir.rules:
        if rule.scheme != NONE.name and rule.scheme not in known:
            continue  # undefined scheme: already reported (Q203)
        for matched in rule_matches(rule, index.layers):
            for layer in matched:
                winners[layer.name] = rule
    layers = tuple(LayerAssignment(layer, ir.scheme(winners[layer.name].scheme) if layer.name in winners else NONE,
                                   winners.get(layer.name)) for layer in index.layers)
    if precision:
        layers = tuple(replace(a, scheme=ir.scheme(precision[a.layer.name])) if a.layer.name in precision else a
                       for a in layers)
    assignment = Assignment(index, layers)
    model_checks.run(ir, assignment, diags)
    grouped = groups.apply_groups(ir, assignment, diags)
    if precision is None:
        mixed.check_budget(ir, grouped, diags)
    if ir.transform is not None:
        final = {a.layer.name: a.scheme for a in grouped.layers}
        grouped = replace(grouped, smoothing=smoothing.resolve_smoothing(ir, index, final, diags))
    return grouped
