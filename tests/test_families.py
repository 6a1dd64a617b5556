"""Planning from config.json alone: for every family qrc knows, the layout it derives from the config alone
equals what transformers saves for a tiny model of that family (names, shapes, layer kinds)."""

from __future__ import annotations

import shutil

import pytest

from compiler.models import index_model
from compiler.models.families import DECODERS

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

SIZES = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128)


def _tiny(family: str):
    t = transformers
    head = dict(head_dim=16)
    return {
        "llama": (t.LlamaConfig(**SIZES), t.LlamaForCausalLM),
        "mistral": (t.MistralConfig(**SIZES, **head), t.MistralForCausalLM),
        "granite": (t.GraniteConfig(**SIZES), t.GraniteForCausalLM),
        "qwen2": (t.Qwen2Config(**SIZES), t.Qwen2ForCausalLM),
        "qwen3": (t.Qwen3Config(**SIZES, **head), t.Qwen3ForCausalLM),
        "olmo2": (t.Olmo2Config(**SIZES), t.Olmo2ForCausalLM),
        "gemma2": (t.Gemma2Config(**SIZES, **head), t.Gemma2ForCausalLM),
        "gemma3_text": (t.Gemma3TextConfig(**SIZES, **head), t.Gemma3ForCausalLM),
        "phi3": (t.Phi3Config(**SIZES, pad_token_id=0), t.Phi3ForCausalLM),
        "mixtral": (t.MixtralConfig(**SIZES, num_local_experts=4, num_experts_per_tok=2), t.MixtralForCausalLM),
        "qwen3_moe": (t.Qwen3MoeConfig(**SIZES, **head, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32),
                      t.Qwen3MoeForCausalLM),
        "deepseek_v3": (t.DeepseekV3Config(vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                           n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
                                           first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=16,
                                           qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, n_group=2,
                                           topk_group=1, max_position_embeddings=128), t.DeepseekV3ForCausalLM),
    }[family]


@pytest.mark.parametrize("family", DECODERS)
def test_config_alone_gives_the_saved_layout(family, tmp_path):
    config, cls = _tiny(family)
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
