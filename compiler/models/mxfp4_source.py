"""gpt-oss's MXFP4 checkpoints as source models: config.json's `quantization_config` says `quant_method: mxfp4`,
and each fused MoE projection is stored as two tensors, `<name>_blocks` (uint8 [experts, out, in/32, 16]: two
e2m1 codes a byte, the low nibble first) and `<name>_scales` (uint8 [experts, out, in/32]: E8M0 exponents, biased
by 127). transformers decodes each pair when it loads the folder (integrations/mxfp4.py,
`convert_moe_packed_tensors`) into the float parameter the model holds, [experts, in, out]. qrc indexes each pair
as that float tensor from the headers alone (`check` and `plan` read no weight bytes), and the torch backend
decodes it when it is read, with the same transformers function (torch/mxfp4_source.py)."""

from __future__ import annotations

from compiler.models.index import Headers

BLOCKS, SCALES = "_blocks", "_scales"
_BYTES = ("U8", "uint8")


def is_mxfp4(config: dict | None) -> bool:
    """Whether config.json says the checkpoint's experts are stored as MXFP4 (gpt-oss's releases)."""
    quant = (config or {}).get("quantization_config")
    return isinstance(quant, dict) and quant.get("quant_method") == "mxfp4"


def packed_pairs(headers: Headers, config: dict | None) -> dict[str, tuple[str, str]]:
    """float tensor name → (its `_blocks`, its `_scales`) for each packed pair of an MXFP4 checkpoint ({} for any
    other model). A `_blocks` tensor without its `_scales` is left as it is (pair_problem says so)."""
    if not is_mxfp4(config):
        return {}
    pairs = {}
    for name in headers:
        if name.endswith(BLOCKS) and name.removesuffix(BLOCKS) + SCALES in headers:
            base = name.removesuffix(BLOCKS)
            pairs[base] = (name, base + SCALES)
    return pairs


def float_shape(blocks: tuple[int, ...]) -> tuple[int, ...]:
    """The float parameter's shape from its blocks' [experts, out, groups, 16]: [experts, groups · 32, out]."""
    experts, out, groups, width = blocks
    return experts, groups * width * 2, out


def pair_problem(headers: Headers, config: dict | None) -> tuple[str, str] | None:
    """The first packed tensor qrc cannot decode, as (its name, why); None when every pair is whole and its
    blocks and scales agree."""
    if not is_mxfp4(config):
        return None
    for name, (dtype, shape) in headers.items():
        if name.endswith(SCALES) and name.removesuffix(SCALES) + BLOCKS not in headers:
            return name, f"no `{name.removesuffix(SCALES) + BLOCKS}` beside it"
        if not name.endswith(BLOCKS):
            continue
        scales = name.removesuffix(BLOCKS) + SCALES
        if scales not in headers:
            return name, f"no `{scales}` beside it"
        scale_dtype, scale_shape = headers[scales]
        if dtype not in _BYTES or scale_dtype not in _BYTES:
            return name, f"stored as {dtype} with scales as {scale_dtype}, where MXFP4 packs bytes (uint8)"
        if len(shape) != 4 or shape[-1] != 16 or tuple(scale_shape) != tuple(shape[:-1]):
            return name, (f"blocks {list(shape)} with scales {list(scale_shape)}, where MXFP4 stores [experts, out, "
                          f"groups, 16] with [experts, out, groups]")
    return None


def as_dequantized(headers: Headers, config: dict | None, dtype: str) -> Headers:
    """The header facts as qrc works with them: each packed pair one float tensor in `dtype` (the model's float
    dtype), of the shape transformers gives it; any other model as it is."""
    pairs = packed_pairs(headers, config)
    if not pairs:
        return headers
    stored = {blocks: base for base, (blocks, _) in pairs.items()}
    scales = {scale for _, scale in pairs.values()}
    out: Headers = {}
    for name, (dt, shape) in headers.items():
        if name in stored:
            out[stored[name]] = (dtype, float_shape(tuple(shape)))
        elif name not in scales:
            out[name] = (dt, shape)
    return out
