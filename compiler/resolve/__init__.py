"""Recipe × model: which scheme each layer gets, by which rule, in which group instance (checks Q2xx)."""

from compiler.resolve.assignment import Assignment, LayerAssignment
from compiler.resolve.pipeline import resolve

__all__ = ["Assignment", "LayerAssignment", "resolve"]
