"""Rules applied to a model: the last matching rule wins; unmatched layers stay float (`none`).

Then the model-dependent checks, the groups (compiler/resolve/groups.py), the bit budget and the outlier
transform's mappings; problems go to diagnostics. The steps import the assignment types, and this module
imports the steps, so the package has no import circle.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from functools import partial

from compiler.diagnostics import Diagnostics
from compiler.ir.types import NONE, RecipeIR, Rule
from compiler.models.index import ModelIndex
from compiler.resolve import groups, mixed, model_checks, smoothing
from compiler.resolve.assignment import Assignment, LayerAssignment, rule_matches


def resolve(ir: RecipeIR, index: ModelIndex, diags: Diagnostics, precision: Mapping[str, str] | None = None) -> Assignment:
    """Assign a scheme to every layer, run the model-dependent checks, then apply the groups.

    `precision` (layer → scheme name) is what a mixed-precision search chose; it replaces the rules'
    schemes before the groups, whose members it always moves together."""
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


def resolver(ir: RecipeIR):
    """The recipe's resolution as a procedure of a model and a search's choices (layer → scheme name): what a
    plan op carries when it must resolve again while running (against an exported graph, with the chosen
    precision) without holding the recipe. Its diagnostics were reported when the plan was made."""
    return partial(_resolve_again, ir)


def _resolve_again(ir: RecipeIR, index: ModelIndex, precision: Mapping[str, str]) -> Assignment:
    return resolve(ir, index, Diagnostics(), dict(precision) or None)
