"""The torch backend's quantization_config, for every scheme qrc can write: compressed-tensors' schema accepts
it, its format is the one compressed-tensors infers for the scheme, and vLLM's config rules (tests/vllm_rules.py)
give it a kernel."""

from __future__ import annotations

import pytest

from compiler.backends.torch.compressed import quantization_config
from compiler.backends.torch.vllm_rules import VllmRejects, vllm_scheme
from compiler.ir.schemes import PRESETS
from compiler.ir.types import ActivationMode, ActivationQuant, Granularity, QType, Rounding, Scheme, WeightQuant
from compiler.models.index import Layer, LayerKind

pytest.importorskip("compressed_tensors")

_W8 = WeightQuant(QType.INT8, Granularity.PER_CHANNEL, None, True)
_DYNAMIC = ActivationQuant(QType.INT8, Granularity.PER_TOKEN, True, ActivationMode.DYNAMIC)
SCHEMES = {
    **PRESETS,
    "W4A16_ASYM": Scheme("W4A16_ASYM", WeightQuant(QType.INT4, Granularity.GROUP, 128, False), None, Rounding.RTN),
    "W4A16_CHANNEL": Scheme("W4A16_CHANNEL", WeightQuant(QType.INT4, Granularity.PER_CHANNEL, None, True), None,
                            Rounding.GPTQ),
    "W8A16_G128": Scheme("W8A16_G128", WeightQuant(QType.INT8, Granularity.GROUP, 128, True), None, Rounding.RTN),
    "W8A8_STATIC_SYM": Scheme("W8A8_STATIC_SYM", _W8, ActivationQuant(QType.INT8, Granularity.PER_TENSOR, True,
                                                                      ActivationMode.STATIC), Rounding.RTN),
}
# what vLLM runs each as (its CPU and GPU builds choose among these classes)
VLLM = {"W4A16": "CompressedTensorsWNA16", "W8A16": "CompressedTensorsWNA16", "W8A8": "CompressedTensorsW8A8Int8 (dynamic)",
        "W8A8_STATIC": "CompressedTensorsW8A8Int8 (static)",
        "W4A16_ASYM": "CompressedTensorsWNA16", "W4A16_CHANNEL": "CompressedTensorsWNA16",
        "W8A16_G128": "CompressedTensorsWNA16",
        "W8A8_STATIC_SYM": "CompressedTensorsW8A8Int8 (static)", "FP8": "CompressedTensorsW8A8Fp8",
        "FP8_DYNAMIC": "CompressedTensorsW8A8Fp8", "FP8_BLOCK": "CompressedTensorsW8A8Fp8",
        "NVFP4A16": "CompressedTensorsW4A16Fp4",
        "MXFP4A16": "CompressedTensorsW4A4Mxfp4", "MXFP8A16": "CompressedTensorsW8A8Mxfp8",  # vLLM 0.32's MX schemes
        "NVFP4": "CompressedTensorsW4A4Fp4", "MXFP4": "CompressedTensorsW4A4Mxfp4",
        "W4AFP8": "CompressedTensorsW4A8Fp8"}  # on Hopper (capability 90)


def _layer(name: str) -> Layer:
    return Layer(name, LayerKind.LINEAR, "Linear", f"{name}.weight", f"{name}:input", (256, 512), "float32", 512, 256,
                 "model.layers.0")


def _config(*schemes: Scheme) -> dict:
    return quantization_config([(_layer(f"model.layers.0.l{i}"), s) for i, s in enumerate(schemes)], ["lm_head"])


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_each_scheme_validates_has_the_inferred_format_and_a_vllm_kernel(name):
    import torch
    from compressed_tensors.compressors.format import infer_module_format
    from compressed_tensors.quantization import QuantizationConfig, QuantizationScheme

    config = _config(SCHEMES[name])
    QuantizationConfig.model_validate(config)
    group = config["config_groups"][name]
    scheme = QuantizationScheme.model_validate({k: v for k, v in group.items() if k != "format"})
    assert infer_module_format(torch.nn.Linear, scheme).value == group["format"] == config["format"]
    if VLLM[name] is None:
        with pytest.raises(VllmRejects):
            vllm_scheme(config, name)
    else:
        assert vllm_scheme(config, name) == VLLM[name]


def test_a_mixed_folder_lists_one_group_per_scheme_and_each_loads():
    config = _config(PRESETS["W4A16"], PRESETS["W8A16"], PRESETS["W8A8"], PRESETS["W4A16"])
    assert config["format"] == "mixed-precision"
    assert {g: len(v["targets"]) for g, v in config["config_groups"].items()} == {"W4A16": 2, "W8A16": 1, "W8A8": 1}
    assert {g: vllm_scheme(config, g) for g in config["config_groups"]} == {
        "W4A16": VLLM["W4A16"], "W8A16": VLLM["W8A16"], "W8A8": VLLM["W8A8"]}


def test_vllm_rules_reject_int8_weight_only_written_as_int_quantized():
    """The layout qrc wrote before (and the rule replicated from vLLM, shown able to fail)."""
    config = _config(PRESETS["W8A16"])
    config["config_groups"]["W8A16"]["format"] = config["format"] = "int-quantized"
    with pytest.raises(VllmRejects, match="without input activations"):
        vllm_scheme(config, "W8A16")


def test_schema_rejection_is_refused_before_work_with_q420():
    from compiler.backends import BackendError
    from compiler.backends.torch.config_schema import check_config
    from compiler.frontend import check_file
    from golden import ROOT

    ir = check_file(ROOT / "recipes/tiny-llama-torch-w4a16.recipe").ir
    config = _config(PRESETS["W4A16"])
    assert check_config(config, ir.span) is None
    config["config_groups"]["W4A16"]["weights"]["strategy"] = "diagonal"
    with pytest.raises(BackendError) as caught:
        check_config(config, ir.span)
    assert caught.value.diagnostic.code == "Q420" and "diagonal" in caught.value.diagnostic.message


def test_without_compressed_tensors_the_check_is_skipped_with_q421_or_refused_for_float_formats(monkeypatch):
    import sys

    from compiler.backends import BackendError
    from compiler.backends.torch.config_schema import check_config
    from compiler.frontend import check_file
    from golden import ROOT

    ir = check_file(ROOT / "recipes/tiny-llama-torch-w4a16.recipe").ir
    monkeypatch.setitem(sys.modules, "compressed_tensors.quantization", None)  # import fails
    assert check_config(_config(PRESETS["W4A16"]), ir.span).code == "Q421"
    with pytest.raises(BackendError) as caught:
        check_config(_config(PRESETS["FP8_DYNAMIC"]), ir.span, needs_package=True)
    assert caught.value.diagnostic.code == "Q400"
    # a file-to-file run asks before any work whether the package is there, without importing it
    import importlib.util

    from compiler.backends.torch.config_schema import require_package

    require_package(ir.span)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *rest: None)
    with pytest.raises(BackendError) as caught:
        require_package(ir.span)
    assert caught.value.diagnostic.code == "Q400"


@pytest.mark.parametrize("scheme, rejected", [("W4A16", False), ("FP8_DYNAMIC", False), ("NVFP4A16", False),
                                              ("MXFP4A16", False), ("W8A16 { asymmetric }", False),
                                              ("NVFP4A16 { activations fp8 per_token dynamic }", True)])
def test_qrc_check_warns_where_vllm_would_refuse_the_folder(scheme, rejected, tmp_path):
    """`qrc check` runs vLLM's loader rules on each scheme (Q267, a warning: transformers still loads it), so
    NVFP4 weights with FP8 inputs, which vLLM refuses, are said before any work."""
    from compiler import check_file

    recipe = tmp_path / "r.recipe"
    recipe.write_text(f'recipe r {{\n  model "builtin:tiny-llama"\n  backend torch\n  scheme s = {scheme}\n'
                      f'  quantize {{ type Linear -> s  "lm_head" -> none }}\n  emit "{tmp_path / "out"}"\n}}\n')
    result = check_file(recipe, with_model=True)
    assert result.ok and any(d.code == "Q267" for d in result.diagnostics) is rejected, result.diagnostics


@pytest.mark.parametrize("scheme, code", [
    ("NVFP4", None), ("MXFP4", None), ("W4AFP8", None), ("W4A16 { activations fp8 per_token dynamic }", None),
    ("NVFP4A16 { activations nvfp4 }", None), ("NVFP4A16 { activations mxfp4 }", "Q256"),
    ("MXFP4 { activations mxfp4 group 16 }", "Q256"), ("W4A16 { activations fp8 per_tensor static }", "Q256"),
    ("W8A8 { activations nvfp4 }", "Q256"), ("W4A16 { activations int4 }", "Q225")])
def test_fp4_and_w4a8_inputs_are_checked_at_the_scheme(scheme, code, tmp_path):
    """FP4 inputs take their format's own blocks with weights of the same format; integer weights take FP8
    inputs only as W4AFP8 does (groups, dynamic per token)."""
    from compiler import check_file

    recipe = tmp_path / "r.recipe"
    recipe.write_text(f'recipe r {{\n  model "builtin:tiny-llama"\n  backend torch\n  scheme s = {scheme}\n'
                      f'  quantize {{ type Linear -> s  "lm_head" -> none }}\n  emit "{tmp_path / "out"}"\n}}\n')
    result = check_file(recipe)
    errors = [d.code for d in result.diagnostics if d.severity.value == "error"]
    assert errors == ([code] if code else []), result.diagnostics


@pytest.mark.parametrize("method, code", [("mse", "Q269"), ("layerwise_percentile", "Q269"), ("entropy", None),
                                          ("minmax", None)])
def test_nvfp4_inputs_refuse_the_grid_searching_methods(method, code, tmp_path):
    """NVFP4's global input scale comes from a range; mse and layerwise_percentile search an integer grid."""
    from compiler import check_file

    recipe = tmp_path / "r.recipe"
    recipe.write_text(f'recipe r {{\n  model "builtin:tiny-llama"\n  backend torch\n'
                      f'  quantize {{ type Linear -> NVFP4  "lm_head" -> none }}\n  calibrate {{ method {method} }}\n'
                      f'  emit "{tmp_path / "out"}"\n}}\n')
    errors = [d.code for d in check_file(recipe).diagnostics if d.severity.value == "error"]
    assert errors == ([code] if code else [])
