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
