"""A GGUF file's key-value section: the architecture's numbers from config.json and the tokenizer from
tokenizer.json, as llama.cpp reads them (so llama.cpp needs no other file). The container and the key names
are the `gguf` package's (llama.cpp's own writer); special tokens, `add_bos_token` and the chat template come
through its SpecialVocab, as llama.cpp's converter takes them."""

from __future__ import annotations

import json
from pathlib import Path

import gguf

from compiler.backends.torch.gguf_types import pre_tokenizer, token_ids

_NORMAL, _CONTROL, _USER_DEFINED, _UNUSED = (gguf.TokenType.NORMAL, gguf.TokenType.CONTROL,
                                             gguf.TokenType.USER_DEFINED, gguf.TokenType.UNUSED)


def text_config(config: dict) -> dict:
    """The language model's numbers (a VLM nests them; the decoders qrc writes do not)."""
    return config.get("text_config") or config


def head_dim(config: dict) -> int:
    """The attention heads' size: `head_dim` where the config sets it (Qwen3), else hidden / heads."""
    return int(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])


def add_hparams(writer: gguf.GGUFWriter, config: dict, name: str, file_type: int, arch: str = "llama") -> None:
    """The numbers llama.cpp's Llama/Qwen2/Qwen3 graphs read, its MoE graphs' expert counts, and what its gpt-oss
    graph reads beside them (`arch`: llama.cpp's architecture name)."""
    c = text_config(config)
    heads = int(c["num_attention_heads"])
    rope = c.get("rope_parameters") or {}
    writer.add_type("model")
    writer.add_name(name)
    writer.add_context_length(int(c.get("max_position_embeddings", 4096)))
    writer.add_embedding_length(int(c["hidden_size"]))
    writer.add_block_count(int(c["num_hidden_layers"]))
    writer.add_feed_forward_length(int(c["intermediate_size"]))
    writer.add_head_count(heads)
    writer.add_head_count_kv(int(c.get("num_key_value_heads") or heads))
    writer.add_rope_freq_base(float(rope.get("rope_theta", c.get("rope_theta", 10000.0))))
    writer.add_layer_norm_rms_eps(float(c.get("rms_norm_eps", 1e-6)))
    writer.add_key_length(head_dim(c))
    writer.add_value_length(head_dim(c))
    writer.add_rope_dimension_count(head_dim(c))
    writer.add_vocab_size(int(c["vocab_size"]))
    experts = c.get("num_local_experts") or c.get("num_experts")
    if experts:  # an MoE (Mixtral, Qwen3-MoE): its experts and the routed ones per token
        writer.add_expert_count(int(experts))
        writer.add_expert_used_count(int(c["num_experts_per_tok"]))
        if arch == "gpt-oss":  # its experts as wide as `intermediate_size` (transformers reads no other key)
            writer.add_expert_feed_forward_length(int(c["intermediate_size"]))
        elif c.get("moe_intermediate_size"):
            writer.add_expert_feed_forward_length(int(c["moe_intermediate_size"]))
    if arch == "gpt-oss":  # every other layer's attention sliding
        writer.add_sliding_window(int(c["sliding_window"]))
    add_rope_scaling(writer, rope)
    writer.add_file_type(file_type)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def add_rope_scaling(writer: gguf.GGUFWriter, rope: dict) -> None:
    """YaRN's numbers as llama.cpp reads them, where the config scales RoPE so (gguf_check lets it through for the
    architectures whose graph reads them: gguf_types.ROPE_SCALINGS); nothing for plain RoPE."""
    if rope.get("rope_type", rope.get("type")) != "yarn":
        return
    writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    writer.add_rope_scaling_factor(float(rope["factor"]))
    writer.add_rope_scaling_orig_ctx_len(int(rope["original_max_position_embeddings"]))
    optional = {"beta_fast": writer.add_rope_scaling_yarn_beta_fast, "beta_slow": writer.add_rope_scaling_yarn_beta_slow,
                "attention_factor": writer.add_rope_scaling_yarn_attn_factor}
    for key, add in optional.items():
        if rope.get(key) is not None:
            add(float(rope[key]))


def add_tokenizer(writer: gguf.GGUFWriter, folder: Path, vocab_size: int) -> None:
    """The BPE tokenizer of `folder` (gguf_check.tokenizer_problem said it is one): every id below the
    embedding's rows a token (ids the tokenizer lacks are padding, unused, as llama.cpp's converter writes
    them), its merges, its pre-tokenizer's name, then the special tokens."""
    tokenizer = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    model = tokenizer["model"]
    by_id = token_ids(tokenizer)  # its largest below vocab_size: tokenizer_problem refused the rest at check
    added = {int(t["id"]): t for t in tokenizer.get("added_tokens", [])}
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(_UNUSED)
        else:
            tokens.append(by_id[i])
            types.append(_NORMAL if i not in added else _CONTROL if added[i].get("special") else _USER_DEFINED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    writer.add_tokenizer_model("gpt2")  # llama.cpp's name for byte-level BPE
    writer.add_tokenizer_pre(pre_tokenizer(tokenizer) or "default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    gguf.SpecialVocab(folder, load_merges=False, n_vocab=vocab_size).add_to_gguf(writer, quiet=True)
