"""GPTQ on ONNX weights: Hessians of MatMul/Gemm inputs gathered by the calibration's own streaming passes
(a HessianObserver per distinct input tensor beside the range observers: q/k/v, which read one tensor,
share one), then each weight rounded with compiler/quant/gptq.py and its Hessian freed as soon as the last
layer reading that tensor is rounded.

The Hessians come from the float model's inputs (every layer sees what the float model feeds it), as
onnxruntime's own GPTQ does; the torch backend's block-sequential variant feeds each block the outputs of
the already-quantized ones."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

import numpy as np
import onnx

from compiler.backends.onnx.rewrite import WeightJob, weight_axes
from compiler.ir.types import Rounding
from compiler.models.index import LayerKind
from compiler.quant.gptq import HessianObserver, SingularHessian, gptq
from compiler.quant.weights import QuantizedWeight

PREFIX = "hessian:"  # observer key of a tensor's Hessian, beside its range observer (keyed by the name itself)


def uses_gptq(job: WeightJob) -> bool:
    """Rounded with GPTQ: a `rounding gptq` scheme on a linear layer (model_checks refuses it elsewhere)."""
    return job.scheme.rounding is Rounding.GPTQ and job.layer.kind is LayerKind.LINEAR


def hessian_observers(inputs: dict[str, int]) -> dict[str, HessianObserver]:
    """Empty Hessian observers, keyed as calibration keeps them."""
    return {PREFIX + tensor: HessianObserver(features) for tensor, features in inputs.items()}


class GptqRounder:
    """Rounds GPTQ layers from the Hessians in `observers`, removing each Hessian once every layer reading its
    tensor is rounded. `dampened` collects the layers whose Hessian needed more dampening (∞: rtn)."""

    def __init__(self, jobs: dict[str, WeightJob], observers: dict):
        self.jobs, self.observers = jobs, observers
        self.remaining = Counter(j.layer.input for j in jobs.values() if uses_gptq(j))
        self.dampened: dict[str, float] = {}

    def ready(self, tensor: str) -> bool:
        """Whether `tensor`'s Hessian is held (gathered and not yet freed)."""
        return PREFIX + tensor in self.observers

    def round(self, weight: str, w: np.ndarray, node: onnx.NodeProto,
              fallback: Callable[[], QuantizedWeight]) -> QuantizedWeight:
        """One weight as stored in the graph, rounded with GPTQ; `fallback` (rtn) when no dampening makes its
        Hessian definite."""
        job = self.jobs[weight]
        tensor = job.layer.input
        hessian = self.observers[PREFIX + tensor].hessian()
        self.remaining[tensor] -= 1
        if self.remaining[tensor] <= 0:
            del self.observers[PREFIX + tensor]
        channel, _ = weight_axes(node)
        # gptq works on [out, in]; a MatMul's B is [in, out]
        rows = w if channel == 0 else w.T
        try:
            qw = gptq(rows, hessian, job.scheme.quantized_weights, job.scheme.act_order,
                      dampened=lambda used: self._dampened(job.layer.name, used), static_groups=job.scheme.static_groups,
                      mse_scales=job.scheme.mse_scales)
        except SingularHessian:
            self.dampened[job.layer.name] = math.inf
            return fallback()
        return qw if channel == 0 else transposed(qw)

    def skip(self, weight: str) -> None:
        """`weight` is rounded elsewhere (another of torchrun's ranks): its Hessian is freed here as if it were
        rounded, once no layer left to this rank reads its tensor."""
        tensor = self.jobs[weight].layer.input
        self.remaining[tensor] -= 1
        if self.remaining[tensor] <= 0:
            self.observers.pop(PREFIX + tensor, None)

    def _dampened(self, layer: str, used: float) -> None:
        self.dampened[layer] = used


def transposed(qw: QuantizedWeight) -> QuantizedWeight:
    """A QuantizedWeight of [out, in] in the [in, out] layout of a MatMul's B (its scales too)."""
    axis = None if qw.axis is None else 1 - qw.axis
    scale = qw.scale.T if qw.scale.ndim == 2 else qw.scale
    zero_point = qw.zero_point.T if qw.zero_point.ndim == 2 else qw.zero_point
    return QuantizedWeight(np.ascontiguousarray(qw.q.T), np.ascontiguousarray(scale), np.ascontiguousarray(zero_point),
                           qw.qtype, axis, qw.block_size)
