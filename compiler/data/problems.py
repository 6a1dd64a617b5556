"""What is wrong with a recipe's data, found at check time: one typed value per problem, which the front end
places at the recipe key it is about."""

from __future__ import annotations

from dataclasses import dataclass

from compiler.diagnostics import Diagnostic, error
from compiler.ir.types import Located
from compiler.source import Span


@dataclass(frozen=True)
class DataProblem:
    """A data problem: its code, what is wrong, what to do, what the caret under the recipe text says, and
    the key of the `data` item it is about (`data` itself when it is about the source as a whole)."""
    code: str
    message: str
    help: str
    label: str
    key: str = "data"

    def at(self, source: Located, fallback: Span) -> Diagnostic:
        """The problem as an error at its key's span in `source` (the `data` item), else at `fallback`."""
        return error(self.code, self.message, source.span_of(self.key) or fallback, self.label, help=self.help)
