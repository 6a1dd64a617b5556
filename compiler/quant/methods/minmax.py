"""`method minmax`: the running minimum and maximum of every value seen (llm-compressor's static_minmax)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from compiler.ir.methods import CALIBRATION_METHODS, WithoutSettings


@CALIBRATION_METHODS.register
@dataclass(frozen=True, slots=True)
class MinMax(WithoutSettings):
    """The exact range of what calibration saw: no histogram is kept."""

    name: ClassVar[str] = "minmax"
    summary: ClassVar[str] = "the running min and max of every value seen (no histogram)"
    settings: ClassVar[str] = ""
    histogram: ClassVar[bool] = False
    grid_search: ClassVar[bool] = False

    def range(self, observer, qtype, symmetric):
        """The observer's running range (a histogram observer keeps one beside its bins)."""
        return observer.range()
