"""FP8 source checkpoints as DeepSeek- and Qwen-class releases ship them: a Linear's `weight` stored as
float8_e4m3fn with a `weight_scale_inv` beside it, one float32 scale per block of the weight
(`quantization_config.weight_block_size`, [128, 128] when the config does not say). qrc reads such a weight
as `weight · scale_inv` per block, in the model's float dtype, and requantizes it per the recipe; the
scales themselves are not tensors of the model (the output has its own)."""

from __future__ import annotations

import math

SCALE_SUFFIX = "_scale_inv"
FP8_DTYPES = ("float8_e4m3fn", "F8_E4M3")


def block_size(config: dict | None) -> tuple[int, int]:
    """The [rows, columns] one scale covers, from the config's quantization_config."""
    quant = (config or {}).get("quantization_config") or {}
    size = quant.get("weight_block_size") if isinstance(quant, dict) else None
    if isinstance(size, list) and len(size) == 2 and all(isinstance(n, int) and n > 0 for n in size):
        return size[0], size[1]
    return 128, 128


def scaled_weights(dtypes: dict[str, str]) -> dict[str, str]:
    """weight name → its scale's name, for the FP8 tensors that have a `_scale_inv` beside them."""
    return {name: name + SCALE_SUFFIX for name, dtype in dtypes.items()
            if dtype in FP8_DTYPES and name + SCALE_SUFFIX in dtypes}


def as_dequantized(headers: dict[str, tuple[str, tuple[int, ...]]], dtype: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Header facts as qrc works with them: block-scaled FP8 weights in `dtype` (the model's float dtype),
    their scales left out."""
    scaled = scaled_weights({name: dt for name, (dt, _) in headers.items()})
    scales = set(scaled.values())
    return {name: ((dtype, shape) if name in scaled else (dt, shape)) for name, (dt, shape) in headers.items()
            if name not in scales}


def grid_mismatch(headers: dict[str, tuple[str, tuple[int, ...]]], block: tuple[int, int]) -> tuple[str, str] | None:
    """The first block-scaled weight whose `_scale_inv` is not one scale per `block` tile of it (a checkpoint
    whose `weight_block_size` does not match its scales would be read with the wrong scale on most tiles),
    as (weight name, what was found); None when every grid matches."""
    for name, scale in scaled_weights({n: dt for n, (dt, _) in headers.items()}).items():
        shape, found = headers[name][1], tuple(headers[scale][1])
        if len(shape) != 2:
            return name, f"a {len(shape)}-D weight {list(shape)}"
        expected = (math.ceil(shape[0] / block[0]), math.ceil(shape[1] / block[1]))
        if found != expected:
            return name, (f"its scale `{scale}` is {list(found)} for a {list(shape)} weight, where blocks of "
                          f"{block[0]}x{block[1]} need {list(expected)}")
    return None
