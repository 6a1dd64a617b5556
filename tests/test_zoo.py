"""The model zoo on the torch backend: tiny random models that transformers builds from a config (no
download), compiled W4A16 (offload) and W8A8 (low_memory), verified, and loaded back with transformers."""

from __future__ import annotations

import pytest
from compiling import assert_ran_the_plan, compile_program
from typer.testing import CliRunner
from zoo import FAMILIES, build

from compiler.cli import app

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

DENSE = [f for f in FAMILIES if f != "gpt2"]
SCHEMES = {"w4a16": ("scheme s = W4A16 { group 32 }", "offload"), "w8a8": ("scheme s = W8A8", "low_memory")}
RECIPE = """recipe zoo {{
    model "{model}"
    backend torch
    {scheme}
    quantize {{ type Linear -> s }}
    calibrate {{ data synthetic {{ samples 8  seqlen 32 }}  chunk 4 }}
    memory {{ mode {mode}  disk "{disk}" }}
    verify {{ samples 4  metric cosine  at_least 0.5 }}
    emit "{out}"
}}
"""


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    root = tmp_path_factory.mktemp("zoo")
    return lambda family: build(family, root / family) if not (root / family).exists() else root / family


def _recipe(tmp_path, folder, scheme: str) -> str:
    text, mode = SCHEMES[scheme]
    path = tmp_path / "r.recipe"
    path.write_text(RECIPE.format(model=folder, scheme=text, mode=mode, disk=tmp_path / "disk", out=tmp_path / "out"))
    return str(path)


@pytest.mark.parametrize("scheme", list(SCHEMES))
@pytest.mark.parametrize("family", DENSE)
def test_family_compiles_verifies_and_loads(zoo, family, scheme, tmp_path):
    folder = zoo(family)
    result, planned = compile_program(_recipe(tmp_path, folder, scheme), tmp_path / "out")
    assert result.verify_passed, result.verify
    assert_ran_the_plan(result, planned)
    config = transformers.CompressedTensorsConfig(run_compressed=False)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"), quantization_config=config).eval()
    ids = torch.randint(0, 320, (1, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        generated = model.generate(ids, max_new_tokens=3, do_sample=False)
    assert generated.shape == (1, 9)
    if family.endswith("-tied") or model.config.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()


def test_gpt2_conv1d_is_refused_at_check(zoo, tmp_path):
    """GPT-2's projections are transformers' Conv1D (weights stored [in, out]): refused by `qrc check`."""
    result = CliRunner().invoke(app, ["check", _recipe(tmp_path, zoo("gpt2"), "w4a16")])
    assert result.exit_code == 2 and "Q411" in result.output and "Conv1D" in result.output, result.output
    assert "Traceback" not in result.output


MOE = """recipe moe {{
    model "{model}"
    backend torch
    scheme w4 = W4A16 {{ group 32 }}
    quantize {{
        type Linear -> w4
        re".*\\.(mlp|block_sparse_moe)\\.gate" -> none
    }}
    memory {{ mode offload }}
    emit "{out}"
}}
"""


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    """Tiny Mixtral (per-expert w1/w2/w3 names) and Qwen3-MoE folders as transformers saves them."""
    root = tmp_path_factory.mktemp("moe")
    for name in ("mixtral", "qwen3_moe"):
        build(name, root / name)
    return root


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_moe_data_free_compiles_file_to_file_with_every_expert_quantized(moe, family, tmp_path):
    """Data-free W4A16 of an MoE folder runs file to file: every expert projection is in the output as packed
    int4 under the checkpoint's own names (what vLLM reads), equal to compressed-tensors' decompression."""
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32
    from safetensors import safe_open

    recipe = tmp_path / "r.recipe"
    recipe.write_text(MOE.format(model=moe / family, out=tmp_path / "out"))
    result, planned = compile_program(str(recipe), tmp_path / "out")
    assert_ran_the_plan(result, planned)
    assert "no model definition is built" in planned.plan.ops[0].summary
    source = safe_open(str(moe / family / "model.safetensors"), "pt")
    output = safe_open(str(tmp_path / "out" / "model.safetensors"), "pt")
    experts = [k.removesuffix(".weight") for k in source.keys() if ".experts." in k and k.endswith(".weight")]
    assert experts and all(f"{e}.weight_packed" in output.keys() for e in experts)
    routers = [k for k in source.keys() if k.endswith(".gate.weight")]
    assert routers and all(r in output.keys() for r in routers)  # kept in float
    for expert in experts:  # unpacked with compressed-tensors' own unpacker: close to the float weight
        shape = output.get_tensor(f"{expert}.weight_shape").tolist()
        q = unpack_from_int32(output.get_tensor(f"{expert}.weight_packed"), 4, torch.Size(shape)).float()
        scale = output.get_tensor(f"{expert}.weight_scale").float()
        dequantized = q * scale.repeat_interleave(q.shape[1] // scale.shape[1], dim=1)
        original = source.get_tensor(f"{expert}.weight").float()
        assert torch.nn.functional.cosine_similarity(dequantized.flatten(), original.flatten(), dim=0) > 0.98


def test_moe_that_must_run_is_refused_at_check(moe, tmp_path):
    recipe = tmp_path / "r.recipe"
    recipe.write_text(MOE.format(model=moe / "mixtral", out=tmp_path / "out").replace(
        "    emit", "    verify { samples 2  metric cosine  at_least 0.5 }\n    emit"))
    result = CliRunner().invoke(app, ["check", str(recipe)])
    assert result.exit_code == 2 and "Q411" in result.output and "mixture-of-experts" in result.output, result.output


def test_quantized_routers_are_warned(moe, tmp_path):
    recipe = tmp_path / "r.recipe"
    recipe.write_text(MOE.format(model=moe / "qwen3_moe", out=tmp_path / "out").replace(
        '        re".*\\.(mlp|block_sparse_moe)\\.gate" -> none\n', ""))
    result = CliRunner().invoke(app, ["check", str(recipe)])
    assert result.exit_code == 0 and "Q247" in result.output, result.output
