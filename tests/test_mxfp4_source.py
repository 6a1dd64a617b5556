"""gpt-oss's MXFP4 checkpoints as source models (issue 68): each packed expert pair indexed as the float tensor
transformers decodes from it (headers alone: `check` and `plan` read no weight bytes), decoded when read, and
recompiled: a float folder equal to transformers' own load of the source, a calibrated W4A16, a broken pair
refused naming the tensor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from compiling import bytes_read
from safetensors import safe_open
from typer.testing import CliRunner
from zoo import gpt_oss_mxfp4

from compiler.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    return gpt_oss_mxfp4(tmp_path_factory.mktemp("mxfp4") / "gpt-oss")


def _recipe(tmp_path: Path, model: Path, body: str, out: Path, name: str = "r") -> Path:
    recipe = tmp_path / f"{name}.recipe"
    recipe.write_text(f'recipe {name} {{\n  model "{model}"\n  backend torch\n{body}\n  emit "{out}"\n}}\n')
    return recipe


def _load(folder: Path):
    import transformers

    model, info = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32,
                                                                    output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    return model.eval()


def _logits(model) -> torch.Tensor:
    ids = torch.randint(2, 300, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return model(ids).logits.float()


def test_check_and_plan_index_the_pairs_as_float_experts_reading_no_weight_bytes(source, tmp_path):
    """The index holds `experts.gate_up_proj` [experts, in, out] where the file has `_blocks` and `_scales`; the
    fused experts are said to stay float (Q266), decoded; no weight bytes read."""
    recipe = _recipe(tmp_path, source, "  scheme w4 = W4A16 { group 32 }\n  quantize { type Linear -> w4 }",
                     tmp_path / "out")
    for command in ("check", "plan"):
        runner.invoke(app, [command, str(recipe)])  # the modules it imports read once, before the count
        before = bytes_read()
        done = runner.invoke(app, [command, str(recipe)])
        read = bytes_read() - before
        assert done.exit_code == 0, done.output
        assert read < (source / "model.safetensors").stat().st_size // 4, (command, read)
    assert "model.layers.0.mlp.experts.down_proj`" in done.output and "decoded from the source's MXFP4" in \
        done.output, done.output


@pytest.mark.slow  # compiles and transformers loads
def test_every_layer_none_writes_the_floats_transformers_decodes(source, tmp_path):
    """A float folder: every expert tensor equal to transformers' MXFP4 load of the source (dequantized), no
    `_blocks` or `_scales` left, the source's `quantization_config` gone; the same logits."""
    out = tmp_path / "float"
    done = runner.invoke(app, ["compile", str(_recipe(tmp_path, source, "  quantize { type Linear -> none }", out))])
    assert done.exit_code == 0, done.output
    with safe_open(out / "model.safetensors", "pt") as f:
        names = list(f.keys())
        written = f.get_tensor("model.layers.1.mlp.experts.gate_up_proj").float()
    assert not [n for n in names if n.endswith(("_blocks", "_scales"))], names
    assert json.loads((out / "config.json").read_text())["quantization_config"].get("quant_method") != "mxfp4"
    reference = _load(source)
    assert torch.equal(written, reference.model.layers[1].mlp.experts.gate_up_proj.detach().float())
    assert torch.allclose(_logits(_load(out)), _logits(reference), atol=1e-5)


@pytest.mark.slow
def test_a_calibrated_w4a16_of_it_loads_and_verifies(source, tmp_path):
    """GPTQ on the attention layers, the model run with its decoded experts (routing as the model's): verified,
    and transformers' default load of the folder is close to the source."""
    out = tmp_path / "w4"
    body = ("  scheme w4 = W4A16 { group 32  rounding gptq }\n  quantize { type Linear -> w4 }\n"
            "  calibrate { data synthetic { samples 8  seqlen 32 }  chunk 4 }\n"
            "  verify { samples 4  metric cosine  at_least 0.95 }")
    done = runner.invoke(app, ["compile", str(_recipe(tmp_path, source, body, out))])
    assert done.exit_code == 0 and "passed: cosine" in done.output, done.output
    quantized, reference = _logits(_load(out)), _logits(_load(source))
    assert torch.nn.functional.cosine_similarity(quantized.flatten(), reference.flatten(), dim=0) > 0.95


def test_a_pair_without_its_scales_is_refused_naming_the_tensor(source, tmp_path):
    """A `_blocks` tensor whose `_scales` is missing: Q252 at check, naming it, no traceback."""
    from safetensors.torch import load_file, save_file

    broken = tmp_path / "broken"
    broken.mkdir()
    tensors = load_file(source / "model.safetensors")
    del tensors["model.layers.1.mlp.experts.down_proj_scales"]
    save_file(tensors, broken / "model.safetensors", metadata={"format": "pt"})
    (broken / "config.json").write_text((source / "config.json").read_text())
    recipe = _recipe(tmp_path, broken, "  quantize { type Linear -> W8A16 }", tmp_path / "out")
    done = runner.invoke(app, ["check", str(recipe)])
    assert done.exit_code == 2 and "Q252" in done.output and "experts.down_proj_blocks" in done.output, done.output
    assert "Traceback" not in done.output
