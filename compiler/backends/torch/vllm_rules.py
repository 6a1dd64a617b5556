"""vLLM's rules for a compressed-tensors `quantization_config`, restated from its loader (vLLM 0.32.0,
model_executor/layers/quantization/compressed_tensors/compressed_tensors.py: the scheme map built from the
config groups, then the scheme chosen from each group's weight and input arguments). `qrc check` warns with
them (Q267) and the tests check the configs qrc writes against them; bench/vllm_side_by_side.py runs vLLM's
CPU build itself on the folders. `vllm_scheme` returns the name of the vLLM scheme class a group gets, or raises what vLLM
raises. Rules for GPUs' capabilities are left out: an FP8 W8A8 group is named CompressedTensorsW8A8Fp8 (on
GPUs without FP8 it runs as W8A16Fp8)."""

from __future__ import annotations

ACTIVATION_FORMATS = {"naive-quantized", "int-quantized", "float-quantized", "nvfp4-pack-quantized"}
WNA16_BITS = (4, 8)


class VllmRejects(Exception):
    """What vLLM raises for this config (an AssertionError at parse time, NotImplementedError at scheme choice)."""


def vllm_scheme(config: dict, group: str) -> str:
    """The vLLM scheme class for config group `group` of `config` (raises VllmRejects where vLLM fails)."""
    entry = config["config_groups"][group]
    weights, inputs = entry.get("weights"), entry.get("input_activations")
    fmt = entry.get("format") or config.get("format") or ""
    if fmt in ACTIVATION_FORMATS or inputs:
        if not inputs and weights["type"] != "float":  # vLLM: `assert weights.type == QuantizationType.FLOAT`
            raise VllmRejects(f"{group}: format {fmt} without input activations needs float weights")
    else:
        inputs = None
    return _scheme(weights, inputs, fmt, group)


def _scheme(w: dict, a: dict | None, fmt: str, group: str) -> str:
    # vLLM 0.32 (`_get_scheme_from_parts`) decides the FP4 and microscaling weights first, whatever the format
    if _fp4(w):
        if a is None:
            return "CompressedTensorsW4A16Fp4"
        if not _fp4(a):
            raise VllmRejects(f"{group}: for NVFP4 weights, input quantization must also be NVFP4, or none")
        return "CompressedTensorsW4A4Fp4"
    if _mx(w, 4):
        return "CompressedTensorsW4A8Mxfp4" if a is not None and _fp8_dynamic(a) else "CompressedTensorsW4A4Mxfp4"
    if _mx(w, 8) and w.get("scale_dtype") == "torch.uint8":
        return "CompressedTensorsW8A8Mxfp8"
    if a is None and w["strategy"] in ("channel", "group") and not w.get("dynamic"):
        if fmt == "pack-quantized" and w["num_bits"] in WNA16_BITS:
            return "CompressedTensorsWNA16"
    if fmt in ACTIVATION_FORMATS:
        if a is not None and _fp8_w4a8(w, a):  # vLLM runs it on Hopper (capability 90) only
            return "CompressedTensorsW4A8Fp8"
        if a is not None and _fp8_w8a8(w, a):
            return "CompressedTensorsW8A8Fp8"
        if _fp8_w8a16(w):
            return "CompressedTensorsW8A16Fp8"
        if a is not None and _int8_static_tensor(w, a):
            return "CompressedTensorsW8A8Int8 (static)"
        if a is not None and _int8_dynamic_token(w, a):
            return "CompressedTensorsW8A8Int8 (dynamic)"
    raise VllmRejects(f"{group}: no compressed-tensors compatible scheme was found")


def _fp4(args: dict) -> bool:
    return (args["strategy"] == "tensor_group" and args["symmetric"] and args.get("group_size") == 16
            and args["type"] == "float" and args["num_bits"] == 4)


def _mx(args: dict, bits: int) -> bool:
    return (args["type"] == "float" and args["num_bits"] == bits and args["strategy"] == "group"
            and args.get("group_size") == 32 and args["symmetric"])


def _fp8_dynamic(a: dict) -> bool:
    return (a["type"] == "float" and a["num_bits"] == 8 and bool(a.get("dynamic")) and a["symmetric"]
            and a["strategy"] in ("token", "group"))


def _fp8_w4a8(w: dict, a: dict) -> bool:
    return (w["num_bits"] == 4 and a["num_bits"] == 8 and w["strategy"] == "group" and a["strategy"] == "token"
            and not w.get("dynamic") and bool(a.get("dynamic")) and w["symmetric"] and a["symmetric"])


def _float_weights(w: dict) -> bool:
    return w["type"] == "float" and w["symmetric"] and not w.get("dynamic") and w["strategy"] in ("tensor", "channel",
                                                                                                  "block")


def _fp8_w8a8(w: dict, a: dict) -> bool:
    if not (_float_weights(w) and a["type"] == "float"):
        return False
    return bool(a.get("dynamic")) or (a["symmetric"] and a["strategy"] == "tensor")


def _fp8_w8a16(w: dict) -> bool:
    return _float_weights(w)


def _int8_weights(w: dict, a: dict) -> bool:
    return w["num_bits"] == a["num_bits"] == 8 and w["strategy"] in ("tensor", "channel") and w["symmetric"]


def _int8_static_tensor(w: dict, a: dict) -> bool:
    return _int8_weights(w, a) and a["strategy"] == "tensor" and not w.get("dynamic") and not a.get("dynamic")


def _int8_dynamic_token(w: dict, a: dict) -> bool:
    return _int8_weights(w, a) and a["strategy"] == "token" and not w.get("dynamic") and bool(a.get("dynamic"))
