"""The compressed-tensors layout of a quantized Linear (what vLLM and transformers read):

- integer weights without activations (W4A16, W8A16), `pack-quantized`: `weight_packed` int32
  [out, ⌈in·bits/32⌉], `weight_scale` [out, groups] (per channel: [out, 1]), `weight_shape` int64 [2], and
  for asymmetric schemes `weight_zero_point` int32 packed along the output axis. int8 weight-only is packed
  too: vLLM refuses `int-quantized` without input activations unless the weights are float.
- integer weights with integer activations (W8A8), `int-quantized`: `weight` int8, `weight_scale`,
  `weight_zero_point` int8 when asymmetric.
- static activations: `input_scale` [1] (and `input_zero_point` int8 [1] when asymmetric).
- floating formats (float_formats.py rounds and stores them with compressed-tensors' own compressors):
  FP8 `weight` float8_e4m3fn with `weight_scale` per tensor [1], channel [out, 1] or block [⌈out/r⌉, ⌈in/c⌉]
  (`float-quantized` with activations, `naive-quantized` without); NVFP4 `weight_packed` uint8 [out, in/2],
  `weight_scale` float8_e4m3fn [out, in/16] and `weight_global_scale` float32 [1]; MXFP4 `weight_packed` with
  e8m0 `weight_scale` uint8 [out, in/32]; MXFP8 `weight` float8_e4m3fn with e8m0 scales.

Scales are stored in the checkpoint's float dtype. Every tensor's name, dtype and shape is known before
any weight is read, which lets the writer lay out the files first and fill them block by block."""

from __future__ import annotations

import math
from typing import TypeAlias

import numpy as np
import torch

from compiler.backends.emitter import Spec
from compiler.backends.torch.float_formats import FloatQuantized
from compiler.backends.torch.quant_args import PACKED, input_args, static_input, weight_args, weight_format
from compiler.ir.types import Granularity, QType, Scheme
from compiler.models.index import Layer
from compiler.quant.pack_int32 import pack_to_int32
from compiler.quant.weights import QuantizedWeight

TensorSpec: TypeAlias = Spec[torch.dtype]  # a tensor of the output, known before any is written


def nbytes(spec: TensorSpec) -> int:
    """A tensor's size in bytes."""
    return math.prod(spec.shape) * torch.empty((), dtype=spec.dtype).element_size()


def layer_specs(layer: Layer, scheme: Scheme, float_dtype: torch.dtype) -> list[TensorSpec]:
    """The tensors that replace `<layer>.weight`."""
    w = scheme.quantized_weights
    out, inp = layer.out_features, layer.in_features
    if w.qtype.is_float:
        return _float_specs(layer, scheme, float_dtype) + _input_specs(layer, scheme, float_dtype)
    scale_cols = {Granularity.GROUP: inp // (w.group_size or inp), Granularity.PER_CHANNEL: 1}.get(w.granularity)
    scale_shape = (out, scale_cols) if scale_cols else (1,)
    n = layer.name
    specs = [Spec(f"{n}.weight_scale", float_dtype, scale_shape)]
    if weight_format(scheme) == PACKED:
        specs += [Spec(f"{n}.weight_packed", torch.int32, (out, math.ceil(inp * w.qtype.bits / 32))),
                  Spec(f"{n}.weight_shape", torch.int64, (2,))]
        if not w.symmetric:
            specs.append(Spec(f"{n}.weight_zero_point", torch.int32,
                                    (math.ceil(out * w.qtype.bits / 32), scale_shape[-1]) if scale_cols else (1,)))
    else:
        specs.append(Spec(f"{n}.weight", torch.int8, (out, inp)))
        if not w.symmetric:
            specs.append(Spec(f"{n}.weight_zero_point", torch.int8, scale_shape))
    return specs + _input_specs(layer, scheme, float_dtype)


def _input_specs(layer: Layer, scheme: Scheme, float_dtype: torch.dtype) -> list[TensorSpec]:
    if not static_input(scheme):
        return []
    if scheme.quantized_inputs.qtype is QType.NVFP4:
        return [Spec(f"{layer.name}.input_global_scale", torch.float32, (1,))]
    specs = [Spec(f"{layer.name}.input_scale", float_dtype, (1,))]
    if not scheme.quantized_inputs.symmetric:
        specs.append(Spec(f"{layer.name}.input_zero_point", torch.int8, (1,)))
    return specs


def _float_specs(layer: Layer, scheme: Scheme, float_dtype: torch.dtype) -> list[TensorSpec]:
    """The stored tensors of a floating format (what its compressed-tensors compressor writes)."""
    w, n = scheme.quantized_weights, layer.name
    out, inp = layer.out_features, layer.in_features
    if w.qtype.fixed_group:
        scales = (out, inp // w.qtype.fixed_group)
        scale_dtype = torch.float8_e4m3fn if w.qtype is QType.NVFP4 else torch.uint8
        values = (Spec(f"{n}.weight_packed", torch.uint8, (out, math.ceil(inp / 2))) if w.qtype.bits == 4
                  else Spec(f"{n}.weight", torch.float8_e4m3fn, (out, inp)))
        specs = [values, Spec(f"{n}.weight_scale", scale_dtype, scales)]
        if w.qtype is QType.NVFP4:
            specs.append(Spec(f"{n}.weight_global_scale", torch.float32, (1,)))
        return specs
    scale_shape = {Granularity.PER_TENSOR: (1,), Granularity.PER_CHANNEL: (out, 1)}.get(w.granularity) or \
        (math.ceil(out / w.block_shape[0]), math.ceil(inp / w.block_shape[1]))
    return [Spec(f"{n}.weight", torch.float8_e4m3fn, (out, inp)),
            Spec(f"{n}.weight_scale", float_dtype, scale_shape)]


def layer_tensors(layer: Layer, scheme: Scheme, q: QuantizedWeight | FloatQuantized, input_qparams: tuple[float, int] | None,
                  float_dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The stored form of one quantized Linear (`q` in the torch layout [out, in], torch convention)."""
    w, n = scheme.quantized_weights, layer.name
    if isinstance(q, FloatQuantized):
        return {f"{n}.{k}": v for k, v in q.stored.items()} | _input_tensors(n, scheme, input_qparams, float_dtype)
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
    return tensors | _input_tensors(n, scheme, input_qparams, float_dtype)


def _input_tensors(n: str, scheme: Scheme, input_qparams: tuple[float, int] | None,
                   float_dtype: torch.dtype) -> dict[str, torch.Tensor]:
    if input_qparams is None:
        return {}
    s, z = input_qparams
    if scheme.quantized_inputs.qtype is QType.NVFP4:
        return {f"{n}.input_global_scale": torch.tensor([s], dtype=torch.float32)}
    tensors = {f"{n}.input_scale": torch.tensor([s], dtype=torch.float32).to(float_dtype)}
    if not scheme.quantized_inputs.symmetric:
        tensors[f"{n}.input_zero_point"] = torch.tensor([z], dtype=torch.int8)
    return tensors


def quantization_config(quantized: list[tuple[Layer, Scheme]], ignored: list[str],
                        targets: dict[str, str] | None = None) -> dict:
    """config.json's `quantization_config`: one config group per scheme, targeting its layers by
    `targets` (checkpoint layer name → target string; the checkpoint name when not given), `ignored` as
    given."""
    groups: dict[str, dict] = {}
    targets = targets or {}
    for layer, scheme in quantized:
        group = groups.get(scheme.name)
        if group is None:
            w, a = scheme.quantized_weights, scheme.activations
            group = groups[scheme.name] = {
                "targets": [], "format": weight_format(scheme),
                "weights": weight_args(w, scheme.rounding),
                "input_activations": None if a is None else input_args(a),
                "output_activations": None}
        target = targets.get(layer.name, layer.name)
        if target not in group["targets"]:
            group["targets"].append(target)
    formats = sorted({g["format"] for g in groups.values()})
    return {"quant_method": "compressed-tensors", "format": formats[0] if len(formats) == 1 else "mixed-precision",
            "quantization_status": "compressed", "config_groups": dict(sorted(groups.items())),
            "ignore": sorted(ignored), "kv_cache_scheme": None}
