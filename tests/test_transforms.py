"""Outlier transforms (AWQ, SmoothQuant) on the torch backend, on transformers models built from configs with
outlier channels injected: the fold keeps the float model, AWQ beats RTN and SmoothQuant beats plain W8A8_STATIC as
measured in transformers, MoE experts and GPTQ after AWQ compile, and a wrong mapping stops the run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from compiling import compile_, compile_program  # noqa: E402
from zoo import build, transformers_cosines  # noqa: E402

from compiler.data import verify_batches  # noqa: E402

pytestmark = pytest.mark.slow  # minutes of compiles: `pytest -m "not slow"` skips them

OUTLIER_CHANNELS = (3, 17, 40)


def with_outliers(folder, factor: float = 30.0):
    """Scale a few channels of every pre-norm's weight: the activations the projections read then have the
    outlier channels real LLMs have (the float model is a different one, no less valid)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("input_layernorm.weight", "post_attention_layernorm.weight")):
                param[list(OUTLIER_CHANNELS)] *= factor
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("outliers")
    return {family: with_outliers(build(family, root / family)) for family in ("llama", "qwen3_moe")}


RECIPE = """recipe t {{
    model "{model}"
    {transform}
    scheme s = {scheme}
    quantize {{ type Linear -> s  "lm_head" -> none  {ignore} }}
    calibrate {{ data synthetic {{ samples 16  seqlen 32 }}  chunk 4 }}
    memory {{ mode {mode} }}
    verify {{ samples 8  metric kld  at_most 5 }}
    emit "{out}"
}}
"""


def _compile(tmp_path, model, transform: str, scheme: str = "W4A16 { group 32 }", mode: str = "offload", ignore: str = "",
             name: str = "r"):
    out = tmp_path / f"{name}-out"
    recipe = tmp_path / f"{name}.recipe"
    recipe.write_text(RECIPE.format(model=model, transform=transform, scheme=scheme, mode=mode, out=out,
                                    ignore=ignore))
    result, planned = compile_program(str(recipe), out)
    return result, planned, out


def _transformers_kl(planned, float_folder, out) -> float:
    """KL(float ‖ quantized) of the next-token distributions, both models loaded by transformers."""
    batches, _ = verify_batches(planned.check.ir.calibration.data, planned.check.assignment.model, 8, 4)
    reference = transformers.AutoModelForCausalLM.from_pretrained(str(float_folder)).eval()
    quantized = transformers.AutoModelForCausalLM.from_pretrained(
        str(out), quantization_config=transformers.CompressedTensorsConfig(dequantize=True)).eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for feed in batches:
            feed = {k: torch.from_numpy(v) for k, v in feed.items()}
            p = torch.log_softmax(reference(**feed).logits.float(), -1)
            q = torch.log_softmax(quantized(**feed).logits.float(), -1)
            total += float((p.exp() * (p - q)).sum(-1).sum())
            count += p.shape[0] * p.shape[1]
    return total / count


@pytest.mark.parametrize("kind", ["awq", "smoothquant"])
def test_folding_keeps_the_float_model(models, kind):
    """Statistics, scales and the fold on a transformers Llama: its logits stay what they were."""
    from compiler.backends.torch.smoothing import SmoothingStatistics, fold
    from compiler.frontend import check_source
    from compiler.ir.types import Rounding, WeightQuant
    from compiler.quant.smoothing import awq_scales, smoothquant_scales
    from compiler.quant.weights import Convention, quantize_weight
    from compiler.source import Source

    text = RECIPE.format(model=models["llama"], transform=f"transform {kind}", scheme="W4A16 { group 32 }", mode="full",
                         out="unused", ignore="")
    checked = check_source(Source("t.recipe", text), with_model=True)
    mappings = checked.assignment.smoothing
    # both methods also smooth the MLP's gated product into down_proj (a Linear source: up_proj's rows)
    assert {m.source.rpartition(".")[2] for m in mappings} >= {"input_layernorm", "post_attention_layernorm", "up_proj"}
    model = transformers.AutoModelForCausalLM.from_pretrained(str(models["llama"])).eval()
    ids = torch.randint(0, 300, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = model(ids).logits
        with SmoothingStatistics(model, list(mappings), {n: n for m in mappings for n in (m.source, *m.targets)},
                                 checked.ir.transform, checked.ir.calibration) as stats:
            model(ids)
        spec = checked.ir.scheme("s").weights
        for m in mappings:
            weights = [model.get_submodule(x).weight.detach().numpy() for x in m.targets]
            if kind == "awq":
                scales, _ = awq_scales(stats.stats[m.source], weights, [spec] * len(weights), 8, True,
                                       lambda w, s: quantize_weight(w, s, Rounding.RTN, 0, 1,
                                                                    Convention.TORCH).dequantize())
            else:
                scales = smoothquant_scales(stats.stats[m.source], weights, 0.5)
            assert not np.allclose(scales, 1.0)
            fold(model.get_submodule(m.source), m.kind, [model.get_submodule(x) for x in m.targets], scales)
        after = model(ids).logits
    assert isinstance(spec, WeightQuant)
    assert float((after - before).norm() / before.norm()) < 1e-4


@pytest.mark.parametrize("mode, scheme", [("offload", "W4A16 { group 32 }"), ("full", "W4A16 { group 32 }"),
                                          ("full", "NVFP4A16")])
def test_awq_beats_rtn_in_transformers(models, tmp_path, mode, scheme):
    """AWQ in front of int4 and of NVFP4 (FP4 weights in groups of 16 with a global scale, compressed-tensors'
    rounding): transformers loads both folders, and AWQ's is closer to the float model."""
    rtn, planned, rtn_out = _compile(tmp_path, models["llama"], "", scheme=scheme, mode=mode, name="rtn")
    awq, _, awq_out = _compile(tmp_path, models["llama"], "transform awq", scheme=scheme, mode=mode, name="awq")
    # 2 blocks × (input norm, post-attention norm, up → down); v → o is skipped under grouped-query attention
    assert "folded into 6 mapping(s)" in awq.transform
    kl_rtn = _transformers_kl(planned, models["llama"], rtn_out)
    kl_awq = _transformers_kl(planned, models["llama"], awq_out)
    print(f"{scheme}, {mode}: KL in transformers rtn {kl_rtn:.5f}, awq {kl_awq:.5f}")
    assert kl_awq < 0.8 * kl_rtn, (kl_awq, kl_rtn)
    # qrc's own verify agrees with transformers' measurement of the folder it wrote
    assert abs(awq.verify["kld"] - kl_awq) < 0.1 * kl_awq + 1e-4, (awq.verify, kl_awq)
    norm = json.loads((awq_out / "model.safetensors.index.json").read_text()) if (
        awq_out / "model.safetensors.index.json").exists() else None
    assert norm is None or "model.layers.0.input_layernorm.weight" in norm["weight_map"]


def test_a_failed_verification_behind_awq_names_the_coarse_layer(models, tmp_path):
    """Q501's help names the layers whose own rounding adds the most error: behind AWQ each layer's float
    reference is its weight as AWQ folded it (a reference read unfolded from the checkpoint made every folded
    layer look worse than a layer given a much coarser scheme)."""
    from typer.testing import CliRunner

    from compiler.cli import app

    recipe = tmp_path / "r.recipe"
    recipe.write_text(f'recipe r {{\n    model "{models["llama"]}"\n    transform awq\n'
                      '    scheme coarse = W4A16 { group 64 }\n'
                      '    quantize {\n        type Linear -> W8A16\n        "lm_head" -> none\n'
                      '        "model.layers.1.self_attn.o_proj" -> coarse\n    }\n'
                      '    calibrate { data synthetic { samples 16  seqlen 32 }  chunk 4 }\n'
                      '    memory { mode low_memory }\n'
                      '    verify { samples 8  metric cosine  at_least 0.999999 }\n'
                      f'    emit "{tmp_path / "out"}"\n}}\n')
    result = CliRunner().invoke(app, ["compile", str(recipe)])
    assert result.exit_code == 2 and "Q501" in result.output, result.output
    named = result.output.split("the layers that lose the most:")[1]
    assert named.lstrip().startswith("`model.layers.1.self_attn.o_proj`"), result.output


def test_smoothquant_beats_plain_w8a8(models, tmp_path):
    """Activations really quantized (qrc's verify runs the static int8 inputs): SmoothQuant moves the outlier
    channels' range into the weights."""
    plain, _, _ = _compile(tmp_path, models["llama"], "", scheme="W8A8_STATIC", mode="low_memory", name="plain")
    smooth, _, _ = _compile(tmp_path, models["llama"], "transform smoothquant { alpha 0.8 }", scheme="W8A8_STATIC",
                            mode="low_memory", name="sq")
    assert smooth.verify["kld"] < 0.8 * plain.verify["kld"], (smooth.verify, plain.verify)


def test_a_searched_strength_compiles_and_says_what_it_kept(models, tmp_path):
    """`alpha search` on static W8A8: each mapping's strength is chosen, the summary says which, the folded model
    still computes the float one, and the rounded one loses less than with no transform."""
    plain, _, _ = _compile(tmp_path, models["llama"], "", scheme="W8A8_STATIC", mode="low_memory", name="plain")
    searched, planned, _ = _compile(tmp_path, models["llama"], "transform smoothquant { alpha search  grid 4 }",
                                    scheme="W8A8_STATIC", mode="low_memory", name="searched")
    assert "alpha searched over 5 strengths" in searched.transform, searched.transform
    assert any("mean |x| and XᵀX, search 5 strengths" in op.summary for op in planned.plan.ops), planned.plan.ops
    assert searched.verify["kld"] < 0.8 * plain.verify["kld"], (searched.verify, plain.verify)


def test_awq_on_moe_experts_and_gptq_after_awq(models, tmp_path):
    """Qwen3-MoE: the post-attention norm's mapping takes the router and every expert's gate/up; GPTQ rounds
    the scaled weights. The folder loads in transformers and agrees with qrc's verify."""
    result, planned, out = _compile(tmp_path, models["qwen3_moe"], "transform awq",
                                    scheme="W4A16 { group 32  rounding gptq }", ignore='re".*\\.mlp\\.gate" -> none')
    mlp = next(m for m in planned.check.assignment.smoothing if m.source.endswith("layers.0.post_attention_layernorm"))
    leaves = {x.rpartition(".")[2] for x in mlp.targets}
    assert leaves == {"gate", "gate_proj", "up_proj"} and sum(".experts." in x for x in mlp.targets) >= 8
    assert result.verify_passed, result.verify
    batches, _ = verify_batches(planned.check.ir.calibration.data, planned.check.assignment.model, 8, 4)
    cosines, _ = transformers_cosines(models["qwen3_moe"], out, transformers.AutoModelForCausalLM, batches)
    assert abs(result.verify["cosine"] - sum(cosines) / len(cosines)) < 2e-3


def test_a_mapping_that_changes_the_model_stops_the_run(models, tmp_path, monkeypatch):
    """Where qrc cannot tell a norm's readers from names (patched here to stand for such a family), a `map`
    that leaves a reader out passes `check`; the run's float-output check stops it (Q422), nothing written."""
    from compiler.resolve import smoothing

    monkeypatch.setattr(smoothing, "norm_readers", lambda index, norm: None)
    out = tmp_path / "bad"
    recipe = tmp_path / "bad.recipe"
    transform = 'transform smoothquant { map "*.input_layernorm" -> "*.q_proj", "*.k_proj" }'
    recipe.write_text(RECIPE.format(model=models["llama"], transform=transform, scheme="W8A8_STATIC", mode="offload",
                                    out=out, ignore=""))
    result = compile_(str(recipe), out)
    assert result.exit_code == 2 and "Q422" in result.output and "Traceback" not in result.output, result.output
    assert not out.exists()


# ---- the ONNX backend ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def onnx_outliers(tmp_path_factory):
    """builtin:tiny-llama (4 blocks) as an .onnx file with outlier channels in its pre-norms."""
    import onnx
    from onnx import numpy_helper

    from compiler.models.builtin import onnx_path

    model = onnx.load(str(onnx_path("builtin:tiny-llama?layers=4")))
    for tensor in model.graph.initializer:
        if tensor.name.endswith(("input_layernorm.weight", "post_attention_layernorm.weight")):
            values = numpy_helper.to_array(tensor).copy()
            values[list(OUTLIER_CHANNELS)] *= 30
            tensor.CopyFrom(numpy_helper.from_array(values, tensor.name))
    path = tmp_path_factory.mktemp("onnx-outliers") / "tiny-llama-outliers.onnx"
    onnx.save(model, str(path))
    return path


ONNX_RECIPE = """recipe t {{
    model "{model}"
    {transform}
    quantize {{ type MatMul -> {scheme}  "lm_head" -> none }}
    calibrate {{ data synthetic {{ samples 16  seqlen 32 }}  chunk 4 }}
    memory {{ mode {mode} }}
    verify {{ samples 8  metric kld  at_most 5 }}
    emit "{out}" {{ format {format} }}
}}
"""


def _onnx_compile(tmp_path, model, transform: str, scheme: str, mode: str, name: str, fmt: str = "qdq"):
    out = tmp_path / f"{name}.onnx"
    recipe = tmp_path / f"{name}.recipe"
    recipe.write_text(ONNX_RECIPE.format(model=model, transform=transform, scheme=scheme, mode=mode, out=out,
                                         format=fmt))
    result, planned = compile_program(str(recipe), out)
    return result, planned


@pytest.mark.parametrize(("kind", "mode"), [("awq", "full"), ("smoothquant", "offload")])
def test_onnx_fold_keeps_the_float_model(onnx_outliers, tmp_path, kind, mode):
    """The smoothed copy the ONNX backend compiles computes what the original does, in onnxruntime, the up
    projections' output channels scaled for the down projections' inputs too."""
    import onnx
    import onnxruntime as ort

    from compiler import data
    from compiler.backends.onnx.files import open_model
    from compiler.backends.onnx.smoothing import smooth
    from compiler.frontend import check_source
    from compiler.ir.types import MemoryMode
    from compiler.source import Source

    text = ONNX_RECIPE.format(model=onnx_outliers, transform=f"transform {kind}", scheme="W4A16", mode=mode,
                              out=tmp_path / "unused.onnx", format="qdq")
    checked = check_source(Source("t.recipe", text), with_model=True)
    # 4 blocks × (input norm → q/k/v, post-attention norm → gate/up, and up → down through the gated product)
    assert len(checked.assignment.smoothing) == 12
    files = open_model(onnx_outliers)
    batches = data.calibration_batches(checked.ir.calibration.data, checked.assignment.model, 4)
    smoothed, _ = smooth(checked.ir.transform, checked.assignment, files, MemoryMode(mode), batches, None,
                         lambda: None)
    try:
        feed = next(iter(batches))
        original = ort.InferenceSession(str(onnx_outliers)).run(["logits"], feed)[0]
        after = ort.InferenceSession(str(smoothed.path)).run(["logits"], feed)[0]
        changed = [t.name for t in smoothed.light.graph.initializer if "layernorm" in t.name]
        assert changed and np.linalg.norm(after - original) / np.linalg.norm(original) < 1e-4
        ups = [t for t in smoothed.light.graph.initializer if t.name.endswith("up_proj.weight")]
        before = {t.name: t for t in onnx.load(str(onnx_outliers)).graph.initializer}
        # the up projection divides its output channels by the product's scales, after its rows took the norm's
        for t in ups:
            new, old = (onnx.numpy_helper.to_array(x, str(p)) for x, p in ((t, smoothed.path.parent),
                                                                          (before[t.name], onnx_outliers.parent)))
            ratios = new / old
            assert not np.allclose(ratios, ratios[:, :1]), t.name  # not one factor per row: the columns moved too
    finally:
        smoothed.close()
        files.close()  # the inline-weight model's split copy in the temp folder goes too


def test_onnx_smoothquant_and_awq_beat_plain_rounding(onnx_outliers, tmp_path):
    """W8A8_STATIC QDQ and W4A16 MatMulNBits, measured by running the emitted models in onnxruntime."""
    plain, _ = _onnx_compile(tmp_path, onnx_outliers, "", "W8A8_STATIC", "low_memory", "plain")
    smooth, _ = _onnx_compile(tmp_path, onnx_outliers, "transform smoothquant { alpha 0.8 }", "W8A8_STATIC", "low_memory",
                              "sq")
    assert "folded into 12 mapping(s)" in smooth.transform
    assert smooth.verify["kld"] < 0.8 * plain.verify["kld"], (smooth.verify, plain.verify)
    searched, _ = _onnx_compile(tmp_path, onnx_outliers, "transform smoothquant { alpha search }", "W8A8_STATIC",
                                "low_memory", "sq-search")
    assert "alpha searched over 11 strengths" in searched.transform, searched.transform
    assert searched.verify["kld"] < 0.8 * plain.verify["kld"], (searched.verify, plain.verify)
    rtn, _ = _onnx_compile(tmp_path, onnx_outliers, "", "W4A16", "offload", "rtn", "matmul_nbits")
    awq, _ = _onnx_compile(tmp_path, onnx_outliers, "transform awq", "W4A16", "offload", "awq", "matmul_nbits")
    assert awq.verify["kld"] < rtn.verify["kld"], (awq.verify, rtn.verify)


@pytest.mark.slow  # a SmoothQuant compile: 4 s
def test_onnx_copies_of_the_model_go_to_the_recipes_disk(onnx_outliers, tmp_path, monkeypatch):
    """The split of an inline-weight model and its smoothed copy are written under `memory { disk }`, not the
    temporary folder (TMPDIR, perhaps memory), and removed after."""
    import tempfile

    made = []
    real = tempfile.mkdtemp

    def spy(*args, **kwargs):
        folder = real(*args, **kwargs)
        made.append(Path(folder))
        return folder

    monkeypatch.setattr(tempfile, "mkdtemp", spy)
    disk = tmp_path / "disk"
    recipe = tmp_path / "r.recipe"
    recipe.write_text(ONNX_RECIPE.format(model=onnx_outliers, transform="transform smoothquant { alpha 0.8 }",
                                         scheme="W8A8_STATIC", mode=f'full  disk "{disk}"', out=tmp_path / "o.onnx",
                                         format="qdq"))
    compile_program(str(recipe), tmp_path / "o.onnx")
    copies = [p for p in made if p.name.startswith(("qrc-model-", "qrc-smoothed-"))]
    assert {p.name.split("-")[1] for p in copies} == {"model", "smoothed"}, made
    assert all(p.parent == disk and not p.exists() for p in copies), copies
