"""Mixed precision against a model: the units the search assigns, their size under each choice, and the
choice under a bit budget once the units are scored (docs/recipe-language.md, `mixed_precision`).

A unit is a group instance (the Q/K/V of one block) or a lone layer, so a group never ends mixed. Only
layers whose rule gives one of the choices are searched; the others keep their scheme. Bits are storage
bits (values, scales, zero points) per weight, so "5 bits" compares honestly with a finer-grouped int4.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from compiler.diagnostics import Diagnostics
from compiler.ir.types import RecipeIR, Scheme
from compiler.resolve.assignment import Assignment
from compiler.resolve.sizes import quantized_bytes


@dataclass(frozen=True, slots=True)
class Unit:
    """A unit of the search: a group instance or a lone layer, with its bits under each choice."""
    name: str  # the group instance's name, or the layer's
    members: tuple[str, ...]  # layer names, in model order
    params: int
    bits: tuple[int, ...]  # storage bits of all members under each choice, in the order of `choices`


def choices_of(ir: RecipeIR) -> tuple[str, ...]:
    """The search's choices, cheapest first as written."""
    return tuple(dict.fromkeys(ir.mixed_precision.choices)) if ir.mixed_precision else ()


def search_units(ir: RecipeIR, assignment: Assignment) -> tuple[Unit, ...]:
    """The units to search: every group instance or lone layer whose members' rules all give a choice."""
    return units_for(tuple(ir.scheme(c) for c in choices_of(ir)), assignment)


def units_for(schemes: Sequence[Scheme], assignment: Assignment) -> tuple[Unit, ...]:
    """The units to search among `schemes` (the choices, in order): see search_units."""
    choices = tuple(s.name for s in schemes)
    if not choices:
        return ()
    members: dict[str, list] = {}
    for a in assignment.layers:
        members.setdefault(a.group or a.layer.name, []).append(a)
    units = []
    for name, found in members.items():
        if not all(a.rule is not None and a.rule.scheme in choices for a in found):
            continue
        units.append(Unit(name, tuple(a.layer.name for a in found), sum(a.layer.params for a in found),
                          tuple(sum(8 * quantized_bytes(a.layer, s) for a in found) for s in schemes)))
    return tuple(units)


def average_bits(units: Sequence[Unit], chosen: Mapping[str, int]) -> float:
    """Storage bits per weight of the whole searched set under `chosen`."""
    params = sum(u.params for u in units)
    return sum(u.bits[chosen[u.name]] for u in units) / params if params else 0.0


def cheapest(unit: Unit) -> int:
    """The index of the unit's cheapest choice."""
    return min(range(len(unit.bits)), key=lambda k: (unit.bits[k], k))


def widest(unit: Unit) -> int:
    """The index of the unit's widest choice."""
    return max(range(len(unit.bits)), key=lambda k: (unit.bits[k], -k))


def bit_limit(units: Sequence[Unit], budget: float) -> int:
    """The most storage bits the searched layers may take: never above budget × params."""
    return math.floor(Fraction(repr(budget)) * sum(u.params for u in units))


def choose(units: Sequence[Unit], losses: Mapping[str, Sequence[float]], budget: float) -> dict[str, int]:
    """Each unit's choice (an index into `choices`), never above the budget: a greedy multiple-choice
    knapsack. Greedy alone can strand bits when a large unit (an LM head) no longer fits after the
    small ones, so the units it left below their best choice are also tried first, each in its own
    run, and the lowest total loss wins (the plain greedy on ties). Deterministic."""
    limit = bit_limit(units, budget)
    best = _greedy(units, losses, limit, {u.name: cheapest(u) for u in units})
    stranded = [u for u in units if min(range(len(u.bits)), key=lambda k: (losses[u.name][k], k)) != best[u.name]]
    for unit in sorted(stranded, key=lambda u: -u.params)[:FORCED_TRIES]:
        start = {u.name: cheapest(u) for u in units}
        start[unit.name] = min(range(len(unit.bits)), key=lambda k: (losses[unit.name][k], k))
        if sum(u.bits[start[u.name]] for u in units) > limit:
            continue
        tried = _greedy(units, losses, limit, start)
        if _loss(tried, losses) < _loss(best, losses):
            best = tried
    return best


FORCED_TRIES = 8  # the largest stranded units tried first: each try is one more greedy run


def _loss(chosen: Mapping[str, int], losses: Mapping[str, Sequence[float]]) -> float:
    return sum(losses[name][k] for name, k in chosen.items())


def _greedy(units: Sequence[Unit], losses: Mapping[str, Sequence[float]], limit: int, start: dict[str, int]) -> dict[str, int]:
    """From `start`, repeatedly take the move with the largest loss decrease per extra bit that still
    fits, until none does."""
    chosen = dict(start)
    total = sum(u.bits[chosen[u.name]] for u in units)
    while (move := _best_move(units, losses, chosen, limit - total)) is not None:
        unit, k = move
        total += unit.bits[k] - unit.bits[chosen[unit.name]]
        chosen[unit.name] = k
    return chosen


def _best_move(units: Sequence[Unit], losses: Mapping[str, Sequence[float]], chosen: Mapping[str, int],
               room: float) -> tuple[Unit, int] | None:
    """The move that saves the most loss per extra bit within `room` extra bits; ties go to the earlier
    unit, then the narrower choice."""
    best, best_key = None, None
    for order, unit in enumerate(units):
        now, loss = chosen[unit.name], losses[unit.name]
        for k, bits in enumerate(unit.bits):
            extra, gain = bits - unit.bits[now], loss[now] - loss[k]
            if k == now or gain <= 0 or extra > room:
                continue
            key = (math.inf if extra <= 0 else gain / extra, -order, -k)
            if best_key is None or key > best_key:
                best, best_key = (unit, k), key
    return best


def frontier(units: Sequence[Unit], losses: Mapping[str, Sequence[float]]) -> list[tuple[float, float]]:
    """Predicted quality against size: (average bits, total loss) after each greedy move, from every unit
    at its cheapest choice until no move saves loss, with no budget. What the scores say a budget buys."""
    chosen = {u.name: cheapest(u) for u in units}
    points = [(average_bits(units, chosen), _loss(chosen, losses))]
    while (move := _best_move(units, losses, chosen, math.inf)) is not None:
        chosen[move[0].name] = move[1]
        points.append((average_bits(units, chosen), _loss(chosen, losses)))
    return points


def check_budget(ir: RecipeIR, assignment: Assignment, diags: Diagnostics) -> None:
    """Against the model: a search with nothing to search, a budget no assignment meets, or one that
    every unit's widest choice meets."""
    mp = ir.mixed_precision
    if mp is None or len(choices_of(ir)) < 2 or not mp.budget_bits:
        return
    units = search_units(ir, assignment)
    span = mp.span_of("budget") or mp.span_of("choices") or ir.span
    if not units:
        diags.warning("Q246", "mixed precision has no layer to search: no rule gives one of its choices",
                      mp.span_of("choices") or ir.span, "nothing searched",
                      help=f"send the layers to search to one of {', '.join(choices_of(ir))} in `quantize`")
        return
    low = average_bits(units, {u.name: cheapest(u) for u in units})
    high = average_bits(units, {u.name: widest(u) for u in units})
    if bit_limit(units, mp.budget_bits) < sum(u.bits[cheapest(u)] for u in units):
        diags.error("Q229", f"budget {mp.budget_bits:g} bits is below the cheapest assignment ({low:.3f} bits per "
                    "weight with scales and zero points)", span, "cannot be met",
                    help=f"give a budget between {low:.3f} and {high:.3f} bits for this model")
    elif mp.budget_bits >= high:
        diags.warning("Q243", f"budget {mp.budget_bits:g} bits allows the widest choice everywhere ({high:.3f} "
                      "bits per weight)", span, "nothing to trade",
                      help=f"lower the budget below {high:.3f} bits to make the search choose")
