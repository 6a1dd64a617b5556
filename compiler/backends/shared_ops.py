"""Op handlers every backend runs the same way on the runner's values (compiler/backends/values.py)."""

from __future__ import annotations

from compiler.backends.products import Product
from compiler.backends.sensitivity import Scored, assign
from compiler.backends.values import OpValues
from compiler.plan.ops import AssignPrecision, Buffer


def assign_precision(op: AssignPrecision, v: OpValues) -> Product:
    """`assign_precision`: the search's choices from the scores, the assignment they give as the value the later
    ops read (`precision`), and what was chosen for the result."""
    scored = v.get(Buffer.SENSITIVITY, Scored)
    assignment, search = assign(op, scored.assignment, scored.scores)
    v.put(Buffer.PRECISION, assignment)
    return Product(assignment=assignment, search=search)
