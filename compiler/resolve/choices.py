"""Every assignment a compile might run: the recipe's, and with each mixed-precision choice applied to
every searched layer. Capability checks run over all of them before any scoring."""

from __future__ import annotations

from compiler.diagnostics import Diagnostics
from compiler.ir.types import RecipeIR
from compiler.resolve import mixed
from compiler.resolve.assignment import Assignment
from compiler.resolve.pipeline import resolve


def each_choice(ir: RecipeIR, assignment: Assignment) -> list[Assignment]:
    """The assignment, and with every searched layer at each choice: what a backend must be able to
    compile, checked before any scoring."""
    units = mixed.search_units(ir, assignment)
    if not units:
        return [assignment]
    return [assignment] + [resolve(ir, assignment.model, Diagnostics(), {n: choice for u in units for n in u.members})
                           for choice in mixed.choices_of(ir)]
