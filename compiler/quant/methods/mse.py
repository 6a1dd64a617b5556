"""`method mse`: the clipping range whose quantize→dequantize has the least expected squared error over the
histogram, on the scheme's own integer grid."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from compiler.ir.methods import CALIBRATION_METHODS, WithoutSettings
from compiler.quant import range_search


@CALIBRATION_METHODS.register
@dataclass(frozen=True, slots=True)
class Mse(WithoutSettings):
    """A search of 256 thresholds against the integer grid."""

    name: ClassVar[str] = "mse"
    summary: ClassVar[str] = "the clipping range with the least squared error on the scheme's integer grid"
    settings: ClassVar[str] = ""
    histogram: ClassVar[bool] = True
    grid_search: ClassVar[bool] = True

    def range(self, observer, qtype, symmetric):
        """The squared-error search over the histogram (compiler/quant/range_search.py)."""
        return range_search.mse_range(observer, qtype, symmetric)
