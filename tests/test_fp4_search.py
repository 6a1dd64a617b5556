"""`rounding mse` and `rounding imatrix` on NVFP4 and MXFP4 weights: each block's scale searched among its own
and its neighbours (compiler/quant/float_kernels.py) for the least squared error, each input column's error
weighted by its importance for imatrix. Both ways a weight is rounded (the compiled loop file to file, and
compressed-tensors given the loop's scales where the dequantized weight is wanted) store the same bytes; the
search never leaves a block worse than round to nearest under the error it minimises; and recipes compile with
them into folders transformers loads."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from test_float_kernels import assert_same, stored_bytes, weights

from compiler.backends.torch.float_formats import quantize_float
from compiler.backends.torch.quant_args import weight_args, weight_format
from compiler.ir.schemes import PRESETS

FP4 = ("NVFP4A16", "MXFP4A16")


def _round(w: torch.Tensor, name: str, importance: np.ndarray | None, measure: bool, kernel: bool = True):
    scheme = PRESETS[name]
    spec = scheme.quantized_weights
    return quantize_float(w, spec, weight_args(spec), weight_format(scheme), torch.bfloat16, None, measure, kernel,
                          importance=importance)


def _weighted_error(w: torch.Tensor, dequantized: torch.Tensor, importance: np.ndarray) -> torch.Tensor:
    """Each row's Σ importance · (w − dequantized)², float64."""
    return ((w.double() - dequantized.double()) ** 2 * torch.from_numpy(importance).double()).sum(dim=1)


@pytest.mark.parametrize("name", FP4)
@pytest.mark.parametrize("source", [torch.bfloat16, torch.float32])
def test_the_loop_and_compressed_tensors_store_the_same_searched_bytes(name, source):
    """File to file the loop rounds with the scales it searched; elsewhere compressed-tensors rounds with them
    (given as ranges): the same stored tensors, and the same error sums as compressed-tensors measures them."""
    for rows, cols, seed in [(64, 256, 0), (1, 128, 1), (300, 320, 2)]:
        w = weights(rows, cols, source, seed)
        importance = np.random.default_rng(seed).uniform(0.01, 4.0, cols).astype(np.float32)
        for weights_of_columns in (np.ones(cols, np.float32), importance):
            compiled = _round(w, name, weights_of_columns, measure=True)
            assert_same(compiled, _round(w, name, weights_of_columns, measure=True, kernel=False))
            given = _round(w, name, weights_of_columns, measure=False)
            for key, expected in compiled.stored.items():
                assert torch.equal(stored_bytes(given.stored[key]), stored_bytes(expected)), (name, key)


@pytest.mark.parametrize("name", FP4)
def test_the_search_never_rounds_a_row_worse_than_rtn_and_weighting_follows_the_inputs(name):
    """Round to nearest's scale is one of the candidates, so each row's error (as the search weighs it) is at most
    rtn's, and lower overall; the weighted search's weighted error is at most the unweighted search's (the same
    candidates). Columns weighted 1000× come out closer to the float weight than unweighted."""
    w = weights(256, 512, torch.bfloat16, 7)[8:]  # random rows only: the special values' rows are not rounding
    cols = w.shape[1]
    ones = np.ones(cols, np.float32)
    importance = np.ones(cols, np.float32)
    importance[::7] = 1000.0
    rtn = _round(w, name, None, measure=False).dequantized
    mse = _round(w, name, ones, measure=False).dequantized
    imatrix = _round(w, name, importance, measure=False).dequantized
    assert rtn is not None and mse is not None and imatrix is not None
    for found, weighted_by in ((mse, ones), (imatrix, importance)):
        searched, plain = _weighted_error(w, found, weighted_by), _weighted_error(w, rtn, weighted_by)
        assert bool((searched <= plain * (1 + 1e-9)).all())
        # MXFP4's neighbours are twice and half its scale: on Gaussian weights few blocks gain
        assert float(searched.sum()) < (0.95 if name == "NVFP4A16" else 1.0) * float(plain.sum())
    assert float(_weighted_error(w, imatrix, importance).sum()) <= float(_weighted_error(w, mse, importance).sum())
    heavy = slice(0, cols, 7)
    assert float((w[:, heavy].double() - imatrix[:, heavy].double()).square().sum()) < \
        float((w[:, heavy].double() - mse[:, heavy].double()).square().sum())


@pytest.mark.parametrize("name", FP4)
def test_a_non_finite_weight_is_left_to_compressed_tensors(name):
    """The loop does not search a weight holding a NaN: compressed-tensors rounds it by its ranges, and the sums
    say it is not finite (the compile's Q409)."""
    w = weights(32, 128, torch.bfloat16, 5)
    w[7, 9] = math.nan
    rounded = _round(w, name, np.ones(128, np.float32), measure=True)
    assert not math.isfinite(rounded.sums[0])


@pytest.mark.slow  # compiles and transformers loads
def test_recipes_with_searched_fp4_scales_compile_plan_and_load(tmp_path):
    """`NVFP4A16 { rounding imatrix }` calibrates its inputs' mean squares and passes its verify; the folder loads
    in transformers with every layer. `MXFP4A16 { rounding mse }` is data-free, file to file (into a GGUF), and
    its plan counts the search (more rounding time than rtn's). Learned rounding is still refused on FP4 (Q256)."""
    import transformers
    from typer.testing import CliRunner
    from zoo import add_tokenizer, build

    from compiler.cli import app
    from compiler.frontend import plan_file

    runner = CliRunner()
    model = add_tokenizer(build("llama", tmp_path / "llama"), 320)

    def recipe(name: str, scheme: str, extra: str = "", gguf: bool = False) -> str:
        path = tmp_path / f"{name}.recipe"
        out = f'"{tmp_path / name}.gguf" {{ format gguf }}' if gguf else f'"{tmp_path / name}"'
        path.write_text(f'recipe {name} {{\n  model "{model}"\n  backend torch\n  scheme s = {scheme}\n'
                        f'  quantize {{ type Linear -> s  "lm_head" -> none }}\n{extra}  emit {out}\n}}\n')
        return str(path)

    calibrated = recipe("imatrix", "NVFP4A16 { rounding imatrix }", "  calibrate { data synthetic { samples 8  "
                        "seqlen 32 } }\n  verify { samples 8  metric kld  at_most 0.05 }\n")
    done = runner.invoke(app, ["compile", calibrated])
    assert done.exit_code == 0 and "passed: kld" in done.output, done.output
    loaded, info = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "imatrix"),
                                                                      output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    import json

    config = json.loads((tmp_path / "imatrix" / "config.json").read_text())
    assert config["quantization_config"]["format"] == "nvfp4-pack-quantized"
    assert loaded is not None
    seconds = {}
    for name, scheme in (("rtn", "MXFP4A16"), ("mse", "MXFP4A16 { rounding mse }")):
        path = recipe(name, scheme, gguf=True)  # no load check's process to wait for, as a folder's has
        planned = plan_file(path)
        assert planned.ok, [d.message for d in planned.diagnostics]
        seconds[name] = next(op.seconds for op in planned.plan.ops if op.kind.value == "quantize_weights")
        done = runner.invoke(app, ["compile", path])
        assert done.exit_code == 0, done.output
    assert seconds["mse"] > seconds["rtn"], seconds
    refused = runner.invoke(app, ["check", recipe("learned", "NVFP4A16 { rounding autoround }")])
    assert refused.exit_code == 2 and "Q256" in refused.output, refused.output


@pytest.mark.parametrize("name", ("NVFP4A16", "MXFP4A16"))
def test_gptq_onto_fp4_takes_the_scales_searched_with_the_hessian_diagonal(name):
    """GPTQ onto FP4 rounds onto block scales from the float weight: by default (`mse_scales`) the ones the search
    finds with each column weighted by the Hessian's diagonal (its inputs' mean square), with `minmax_scales` the
    blocks' ranges (round to nearest's)."""
    from dataclasses import replace

    from compiler.backends.torch.float_formats import fp4_scales, searched_scales
    from compiler.backends.torch.fp4_gptq import gptq_fp4

    w = weights(64, 256, torch.float32, 9)[8:]
    inputs = torch.randn(512, 256, generator=torch.Generator().manual_seed(3)) * torch.linspace(0.1, 3.0, 256)
    hessian = (2 * inputs.T @ inputs / 512).double().numpy()
    scheme = PRESETS[name]
    spec = scheme.quantized_weights
    found = {}
    for choice in (True, False):
        stored = gptq_fp4(w, replace(scheme, mse_scales=choice), hessian.copy(), torch.bfloat16, None, "cpu").stored
        found[choice] = stored_bytes(stored["weight_scale"])
    diagonal = np.ascontiguousarray(np.diagonal(hessian), np.float32)
    searched = searched_scales(w, spec, None, diagonal)
    assert searched is not None
    args = (spec, weight_args(spec), weight_format(scheme), torch.bfloat16, None, False)
    with_searched = quantize_float(w, *args, given=searched).stored["weight_scale"]
    with_ranges = quantize_float(w, *args, given=fp4_scales(w, spec)).stored["weight_scale"]
    assert torch.equal(found[True], stored_bytes(with_searched))
    assert torch.equal(found[False], stored_bytes(with_ranges))
    assert not torch.equal(found[True], found[False])
