"""Planning from config.json alone: for every family qrc knows, the layout it derives from the config alone
equals what transformers saves for a tiny model of that family (names, shapes, layer kinds)."""

from __future__ import annotations

import shutil

import pytest
from zoo import configs

from compiler.models import index_model
from compiler.models.families import DECODERS

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

@pytest.mark.parametrize("family", DECODERS)
def test_config_alone_gives_the_saved_layout(family, tmp_path):
    config, cls = configs(transformers)[family]
    torch.manual_seed(0)
    cls(config).save_pretrained(tmp_path / "saved")
    (tmp_path / "config-only").mkdir()
    shutil.copy(tmp_path / "saved" / "config.json", tmp_path / "config-only" / "config.json")
    saved, planned = index_model(str(tmp_path / "saved")), index_model(str(tmp_path / "config-only"))
    describe = lambda index: [(x.name, x.kind, x.shape) for x in index.layers]  # noqa: E731
    assert describe(planned) == describe(saved)
    assert planned.total_bytes == saved.total_bytes


def test_a_qwen3_8b_is_planned_from_its_config_alone(tmp_path):
    """Qwen3-8B's shapes (no weights on disk): indexed, resolved and planned in offload under 8 GiB."""
    import json

    from compiler import plan_file

    folder = tmp_path / "qwen3-8b"
    folder.mkdir()
    folder.joinpath("config.json").write_text(json.dumps({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 4096, "num_hidden_layers": 36,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288,
        "vocab_size": 151936, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}))
    recipe = tmp_path / "r.recipe"
    recipe.write_text(f'recipe q {{\n    model "{folder}"\n    scheme w4 = W4A16 {{ group 128 }}\n'
                      '    quantize { "model.layers.*" -> w4 }\n    group auto qkv\n'
                      '    memory { ram 8 GiB  mode offload }\n    emit "out/q"\n}\n')
    planned = plan_file(recipe, detected_free=1 << 34)
    assert planned.ok, planned.diagnostics
    index = planned.check.assignment.model
    params = sum(x.params for x in index.layers)
    assert 7.5e9 < params < 8.5e9 and len(index.layers) == 36 * 7 + 2
    assert planned.plan.peak_bytes < 8 << 30
