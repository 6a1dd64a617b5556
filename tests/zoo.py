"""Tiny random-weight models of the families people quantize, built from transformers configs (no
download): what the model-zoo tests compile. Each is saved once per test session with save_pretrained."""

from __future__ import annotations

from pathlib import Path

SIZES = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128)


def _configs(t) -> dict:
    """family → (config, model class); dense decoders and an encoder."""
    head = dict(head_dim=16)
    return {
        "llama": (t.LlamaConfig(**SIZES, tie_word_embeddings=False), t.LlamaForCausalLM),
        "llama-tied": (t.LlamaConfig(**SIZES, tie_word_embeddings=True), t.LlamaForCausalLM),
        "qwen2": (t.Qwen2Config(**SIZES, tie_word_embeddings=False), t.Qwen2ForCausalLM),
        "qwen3": (t.Qwen3Config(**SIZES, **head, tie_word_embeddings=False), t.Qwen3ForCausalLM),
        "qwen3-tied": (t.Qwen3Config(**SIZES, **head, tie_word_embeddings=True), t.Qwen3ForCausalLM),
        "mistral": (t.MistralConfig(**SIZES, **head), t.MistralForCausalLM),
        "granite": (t.GraniteConfig(**SIZES), t.GraniteForCausalLM),
        "olmo2": (t.Olmo2Config(**SIZES), t.Olmo2ForCausalLM),
        "gemma2": (t.Gemma2Config(**SIZES, **head), t.Gemma2ForCausalLM),
        "gemma3_text": (t.Gemma3TextConfig(**SIZES, **head), t.Gemma3ForCausalLM),
        "phi3": (t.Phi3Config(**SIZES, pad_token_id=0), t.Phi3ForCausalLM),
        "gpt2": (t.GPT2Config(vocab_size=320, n_embd=64, n_layer=2, n_head=4, n_positions=128,
                              bos_token_id=0, eos_token_id=0), t.GPT2LMHeadModel),
    }


FAMILIES = ("llama", "llama-tied", "qwen2", "qwen3", "qwen3-tied", "mistral", "granite", "olmo2", "gemma2",
            "gemma3_text", "phi3", "gpt2")


def build(family: str, folder: Path) -> Path:
    """Save the tiny `family` model (seeded random weights) to `folder` and return it."""
    import torch
    import transformers

    config, cls = _configs(transformers)[family]
    torch.manual_seed(0)
    cls(config).eval().save_pretrained(folder)
    return folder
