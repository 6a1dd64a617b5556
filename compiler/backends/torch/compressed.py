"""The compressed-tensors layout of a quantized Linear (what vLLM and transformers read):

- 4-bit weights, `pack-quantized`: `weight_packed` int32 [out, ⌈in·bits/32⌉], `weight_scale` [out, groups]
  (per channel: [out, 1]), `weight_shape` int64 [2], and for asymmetric schemes `weight_zero_point`
  int32 packed along the output axis.
- 8-bit weights, `int-quantized`: `weight` int8, `weight_scale`, `weight_zero_point` int8 when asymmetric.
- static activations: `input_scale` [1] (and `input_zero_point` int8 [1] when asymmetric).

Scales are stored in the checkpoint's float dtype. Every tensor's name, dtype and shape is known before
any weight is read, which lets the writer lay out the files first and fill them block by block."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from compiler.ir.types import ActivationMode, Granularity, Rounding, Scheme
from compiler.models.index import Layer
from compiler.quant.pack_int32 import pack_to_int32
from compiler.quant.weights import QuantizedWeight

PACKED, INT = "pack-quantized", "int-quantized"
_STRATEGY = {Granularity.PER_TENSOR: "tensor", Granularity.PER_CHANNEL: "channel", Granularity.GROUP: "group",
             Granularity.PER_TOKEN: "token"}


@dataclass(frozen=True)
class TensorSpec:
    """A tensor of the output: name, dtype and shape, known before any is written."""
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        """Its size in bytes."""
        return math.prod(self.shape) * torch.empty((), dtype=self.dtype).element_size()


def weight_format(scheme: Scheme) -> str:
    """The compressed-tensors format name of a scheme's weights."""
    return PACKED if scheme.weights.qtype.bits < 8 else INT


def static_input(scheme: Scheme) -> bool:
    """Whether the scheme quantizes its inputs with a static (calibrated) scale."""
    act = scheme.activations
    return act is not None and act.mode is ActivationMode.STATIC


def layer_specs(layer: Layer, scheme: Scheme, float_dtype: torch.dtype) -> list[TensorSpec]:
    """The tensors that replace `<layer>.weight`."""
    w = scheme.weights
    out, inp = layer.out_features, layer.in_features
    scale_cols = {Granularity.GROUP: inp // (w.group_size or inp), Granularity.PER_CHANNEL: 1}.get(w.granularity)
    scale_shape = (out, scale_cols) if scale_cols else (1,)
    n = layer.name
    specs = [TensorSpec(f"{n}.weight_scale", float_dtype, scale_shape)]
    if weight_format(scheme) == PACKED:
        specs += [TensorSpec(f"{n}.weight_packed", torch.int32, (out, math.ceil(inp * w.qtype.bits / 32))),
                  TensorSpec(f"{n}.weight_shape", torch.int64, (2,))]
        if not w.symmetric:
            specs.append(TensorSpec(f"{n}.weight_zero_point", torch.int32,
                                    (math.ceil(out * w.qtype.bits / 32), scale_shape[-1]) if scale_cols else (1,)))
    else:
        specs.append(TensorSpec(f"{n}.weight", torch.int8, (out, inp)))
        if not w.symmetric:
            specs.append(TensorSpec(f"{n}.weight_zero_point", torch.int8, scale_shape))
    if static_input(scheme):
        specs.append(TensorSpec(f"{n}.input_scale", float_dtype, (1,)))
        if not scheme.activations.symmetric:
            specs.append(TensorSpec(f"{n}.input_zero_point", torch.int8, (1,)))
    return specs


def layer_tensors(layer: Layer, scheme: Scheme, q: QuantizedWeight, input_qparams: tuple[float, int] | None,
                  float_dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The stored form of one quantized Linear (`q` in the torch layout [out, in], torch convention)."""
    w, n = scheme.weights, layer.name
    scale = np.asarray(q.scale, np.float32)
    scale = scale.reshape(scale.shape[0], -1) if scale.ndim else scale.reshape(1)
    tensors = {f"{n}.weight_scale": torch.from_numpy(scale.copy()).to(float_dtype)}
    zp = np.asarray(q.zero_point).reshape(scale.shape)
    if weight_format(scheme) == PACKED:
        tensors[f"{n}.weight_packed"] = torch.from_numpy(pack_to_int32(q.q, w.qtype.bits))
        tensors[f"{n}.weight_shape"] = torch.tensor([layer.out_features, layer.in_features], dtype=torch.int64)
        if not w.symmetric:
            packed = pack_to_int32(zp.T, w.qtype.bits).T if zp.ndim == 2 else zp.astype(np.int32)
            tensors[f"{n}.weight_zero_point"] = torch.from_numpy(np.ascontiguousarray(packed))
    else:
        tensors[f"{n}.weight"] = torch.from_numpy(np.asarray(q.q, np.int8).copy())
        if not w.symmetric:
            tensors[f"{n}.weight_zero_point"] = torch.from_numpy(zp.astype(np.int8))
    if input_qparams is not None:
        s, z = input_qparams
        tensors[f"{n}.input_scale"] = torch.tensor([s], dtype=torch.float32).to(float_dtype)
        if not scheme.activations.symmetric:
            tensors[f"{n}.input_zero_point"] = torch.tensor([z], dtype=torch.int8)
    return tensors


def _args(bits: int, symmetric: bool, granularity: Granularity, group: int | None, dynamic: bool = False,
          observer: str = "minmax") -> dict:
    args = {"num_bits": bits, "type": "int", "symmetric": symmetric, "strategy": _STRATEGY[granularity],
            "dynamic": dynamic, "observer": None if dynamic else observer}
    if granularity is Granularity.GROUP:
        args["group_size"] = group
    return args


def quantization_config(quantized: list[tuple[Layer, Scheme]], ignored: list[str]) -> dict:
    """config.json's `quantization_config`: one config group per scheme, targeting its layers by name."""
    groups: dict[str, dict] = {}
    for layer, scheme in quantized:
        group = groups.get(scheme.name)
        if group is None:
            w, a = scheme.weights, scheme.activations
            group = groups[scheme.name] = {
                "targets": [], "format": weight_format(scheme),
                "weights": _args(w.qtype.bits, w.symmetric, w.granularity, w.group_size,
                                 observer="mse" if scheme.rounding is Rounding.MSE else "minmax"),
                "input_activations": None if a is None else _args(a.qtype.bits, a.symmetric, a.granularity, None,
                                                                  a.mode is ActivationMode.DYNAMIC),
                "output_activations": None}
        group["targets"].append(layer.name)
    formats = sorted({g["format"] for g in groups.values()})
    return {"quant_method": "compressed-tensors", "format": formats[0] if len(formats) == 1 else "mixed-precision",
            "quantization_status": "compressed", "config_groups": dict(sorted(groups.items())),
            "ignore": sorted(ignored), "kv_cache_scheme": None}
