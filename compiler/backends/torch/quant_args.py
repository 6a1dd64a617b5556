"""compressed-tensors' description of a scheme as config.json gives it (format, QuantizationArgs of weights
and inputs), without torch: `qrc check` matches it against vLLM's loader rules (vllm_rules.py), and the
writer puts it into the output's config."""

from __future__ import annotations

from compiler.ir.types import ActivationMode, ActivationQuant, Granularity, QType, Rounding, Scheme, WeightQuant

PACKED, INT = "pack-quantized", "int-quantized"
FLOAT, NAIVE = "float-quantized", "naive-quantized"
_FORMATS = {QType.NVFP4: "nvfp4-pack-quantized", QType.MXFP4: "mxfp4-pack-quantized", QType.MXFP8: "mxfp8-quantized"}
_STRATEGY = {Granularity.PER_TENSOR: "tensor", Granularity.PER_CHANNEL: "channel", Granularity.GROUP: "group",
             Granularity.PER_TOKEN: "token", Granularity.BLOCK: "block"}
# Weights compressed-tensors decompresses to bfloat16 whatever the model's dtype (its FP4 and MX decompressors): a
# float32 model's folder with them says bfloat16, or transformers' default load runs bfloat16 weights against
# float32 inputs and fails at the first forward (`float != c10::BFloat16`; tests/test_runtimes.py runs each)
DECOMPRESSED_TO_BFLOAT16 = (QType.NVFP4, QType.MXFP4, QType.MXFP8)
_SCALE_DTYPES = {QType.NVFP4: "torch.float8_e4m3fn", QType.MXFP4: "torch.uint8", QType.MXFP8: "torch.uint8"}


def weight_format(scheme: Scheme) -> str:
    """The compressed-tensors format of a scheme, by the rule compressed-tensors itself infers it with
    (compressors/format.py's priority list; tests/test_compressed_config.py checks the two agree): integer
    weights with activations are `int-quantized`, integer weights alone are `pack-quantized`, whatever
    their width; floating weights are `float-quantized` with activations and `naive-quantized` without,
    except the microscaling formats, which have compressors of their own."""
    qtype = scheme.quantized_weights.qtype
    if qtype in _FORMATS:
        return _FORMATS[qtype]
    if qtype.is_float:
        return FLOAT if scheme.activations is not None else NAIVE
    return INT if scheme.activations is not None else PACKED


def static_input(scheme: Scheme) -> bool:
    """Whether the scheme quantizes its inputs with a calibrated scale (static, or NVFP4's global one)."""
    act = scheme.activations
    return act is not None and act.calibrated


def weight_args(w: WeightQuant, rounding: Rounding = Rounding.RTN) -> dict:
    """compressed-tensors' QuantizationArgs of a scheme's weights, as config.json lists them."""
    args: dict[str, object] = {
        "num_bits": w.qtype.bits, "type": "float" if w.qtype.is_float else "int", "symmetric": w.symmetric,
        "strategy": "tensor_group" if w.qtype is QType.NVFP4 else _STRATEGY[w.granularity], "dynamic": False,
        "observer": "mse" if rounding is Rounding.MSE else "minmax"}
    if w.granularity is Granularity.GROUP:
        args["group_size"] = w.group_size
    if w.granularity is Granularity.BLOCK:
        args["block_structure"] = list(w.block_shape)
    if w.qtype in _SCALE_DTYPES:
        args["scale_dtype"] = args["zp_dtype"] = _SCALE_DTYPES[w.qtype]
    return args


def input_args(a: ActivationQuant) -> dict:
    """compressed-tensors' QuantizationArgs of a scheme's inputs (its NVFP4 and MXFP4 presets' for those
    formats: NVFP4's block scales are dynamic `local` under a global scale its `static_minmax` observer set)."""
    dynamic = a.mode is ActivationMode.DYNAMIC
    args: dict[str, object] = {
        "num_bits": a.qtype.bits, "type": "float" if a.qtype.is_float else "int", "symmetric": a.symmetric,
        "strategy": _STRATEGY[a.granularity], "dynamic": dynamic, "observer": None if dynamic else "minmax"}
    if a.granularity is Granularity.GROUP:
        args["group_size"] = a.group_size
    if a.qtype is QType.NVFP4:
        args.update(strategy="tensor_group", dynamic="local", observer="static_minmax")
    if a.qtype in _SCALE_DTYPES:
        args["scale_dtype"] = args["zp_dtype"] = _SCALE_DTYPES[a.qtype]
    return args
