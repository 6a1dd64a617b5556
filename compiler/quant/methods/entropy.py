"""`method entropy`: the range whose 128-level quantized histogram is closest in KL divergence to the histogram
(TensorRT's procedure, as onnxruntime's Entropy)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from compiler.ir.methods import CALIBRATION_METHODS, WithoutSettings
from compiler.quant import range_search


@CALIBRATION_METHODS.register
@dataclass(frozen=True, slots=True)
class Entropy(WithoutSettings):
    """The KL-minimizing threshold of the histogram."""

    name: ClassVar[str] = "entropy"
    summary: ClassVar[str] = "the threshold whose quantized histogram has the least KL divergence (TensorRT's)"
    settings: ClassVar[str] = ""
    histogram: ClassVar[bool] = True
    grid_search: ClassVar[bool] = False

    def range(self, observer, qtype, symmetric):
        """The KL search over the histogram (compiler/quant/range_search.py)."""
        return range_search.entropy_range(observer)
