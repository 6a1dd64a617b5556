"""`method percentile [P]`: the range that keeps P percent of the absolute values (onnxruntime's Percentile)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from compiler.ir.methods import CALIBRATION_METHODS, method_options
from compiler.ir.values import format_number
from compiler.quant.methods.numbers import percentile_of

DEFAULT_PERCENTILE = 99.999


@CALIBRATION_METHODS.register
@dataclass(frozen=True, slots=True)
class Percentile:
    """Clip at a percentile of |x| from the histogram."""

    name: ClassVar[str] = "percentile"
    summary: ClassVar[str] = f"clip at a percentile of |x| (default {DEFAULT_PERCENTILE})"
    settings: ClassVar[str] = "[P]"
    histogram: ClassVar[bool] = True
    grid_search: ClassVar[bool] = False
    percentile: float = DEFAULT_PERCENTILE

    @classmethod
    def configure(cls, decl, diags):
        """`method percentile 99.99`: the number is optional; outside (0, 100] is Q209."""
        method_options(decl, (), diags, takes_number=True)
        given = percentile_of(decl.argument, diags) if decl is not None and decl.argument is not None else None
        return cls(given or DEFAULT_PERCENTILE)

    def text(self) -> str:
        """`method percentile P`."""
        return f"method {self.name} {format_number(self.percentile)}"

    def detail(self) -> str:
        """`percentile P`."""
        return f"percentile {self.percentile:g}"

    def range(self, observer, qtype, symmetric):
        """The histogram's range at the percentile."""
        return observer.percentile_range(self.percentile)
