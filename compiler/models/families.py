"""Layer layouts of known HF families, from config.json alone (so a 7B or a 671B model need not be on
disk). Each layout names the tensors as transformers saves them (`save_pretrained`), with their torch
shapes; tests/test_families.py checks every family against a tiny model transformers builds and saves."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from compiler.models.index import LayerKind

# attention: "gqa" (q, k, v, o), "fused_qkv" (phi3), "mla" (DeepSeek's multi-head latent attention)
# mlp: "gated" (gate, up, down), "fused_gate_up" (phi3), "mixtral" and "qwen_moe" (routed experts),
#      "deepseek" (dense first layers, then routed and shared experts)
# norms: "llama" (input, post-attention), "gemma" (+ pre/post feed-forward), "olmo2" (post-attention,
#        post-feed-forward only); qk_norm: per-head q/k norms ("head", or "full" width for olmo2)
FAMILY_SHAPES: dict[str, dict[str, Any]] = {
    "llama": dict(),
    "mistral": dict(),
    "granite": dict(),
    "qwen2": dict(qkv_bias=True),
    "qwen3": dict(qk_norm="head"),
    "olmo2": dict(norms="olmo2", qk_norm="full"),
    "gemma2": dict(norms="gemma", tied=True),
    "gemma3_text": dict(norms="gemma", qk_norm="head", tied=True),
    "phi3": dict(attention="fused_qkv", mlp="fused_gate_up"),
    "mixtral": dict(mlp="mixtral"),
    "qwen3_moe": dict(qk_norm="head", mlp="qwen_moe"),
    "deepseek_v3": dict(attention="mla", mlp="deepseek"),
}
DECODERS = tuple(FAMILY_SHAPES)
ENCODERS = ("bert",)


@dataclass(frozen=True, slots=True)
class Tensor:
    """A parameter of the layout: name, torch shape, and the layer kind when it is a layer's weight."""

    name: str
    shape: tuple[int, ...]
    kind: LayerKind | None = None  # Linear | Embedding for layer weights; None for norms and biases


def layout(config: dict) -> list[Tensor] | None:
    """The parameter layout a config describes (see FAMILY_SHAPES and ENCODERS), or None for other families."""
    family = config.get("model_type")
    if family in FAMILY_SHAPES:
        return _decoder(config, **FAMILY_SHAPES[family])
    if family in ENCODERS:
        return _bert(config)
    return None


def _linear(name: str, rows: int, cols: int) -> Tensor:
    return Tensor(f"{name}.weight", (rows, cols), LayerKind.LINEAR)


def _decoder(c: dict, attention: str = "gqa", mlp: str = "gated", norms: str = "llama", qk_norm: str = "",
             qkv_bias: bool = False, tied: bool = False) -> list[Tensor]:
    h, n, vocab = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    out = [Tensor("model.embed_tokens.weight", (vocab, h), LayerKind.EMBEDDING)]
    for i in range(n):
        p = f"model.layers.{i}"
        out += _norms(p, h, norms, "attention")
        out += _attention(c, p, attention, qk_norm, qkv_bias)
        out += _norms(p, h, norms, "mlp")
        out += _mlp(c, p, i, mlp)
    out.append(Tensor("model.norm.weight", (h,)))
    if not c.get("tie_word_embeddings", tied):
        out.append(_linear("lm_head", vocab, h))
    return out


def _norms(p: str, h: int, style: str, where: str) -> list[Tensor]:
    names = {("llama", "attention"): ["input_layernorm"], ("llama", "mlp"): ["post_attention_layernorm"],
             ("gemma", "attention"): ["input_layernorm"],
             ("gemma", "mlp"): ["post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"],
             ("olmo2", "attention"): [], ("olmo2", "mlp"): ["post_attention_layernorm", "post_feedforward_layernorm"]}
    return [Tensor(f"{p}.{name}.weight", (h,)) for name in names[(style, where)]]


def _attention(c: dict, p: str, style: str, qk_norm: str, bias: bool) -> list[Tensor]:
    h, heads = c["hidden_size"], c["num_attention_heads"]
    kv_heads = c.get("num_key_value_heads") or heads
    hd = c.get("head_dim") or h // heads
    a = f"{p}.self_attn"
    if style == "mla":
        return _mla(c, a)
    if style == "fused_qkv":
        return [_linear(f"{a}.qkv_proj", (heads + 2 * kv_heads) * hd, h), _linear(f"{a}.o_proj", h, heads * hd)]
    out = []
    for name, rows in (("q_proj", heads * hd), ("k_proj", kv_heads * hd), ("v_proj", kv_heads * hd)):
        out.append(_linear(f"{a}.{name}", rows, h))
        if bias:
            out.append(Tensor(f"{a}.{name}.bias", (rows,)))
    out.append(_linear(f"{a}.o_proj", h, heads * hd))
    if qk_norm:
        q, k = (hd, hd) if qk_norm == "head" else (heads * hd, kv_heads * hd)
        out += [Tensor(f"{a}.q_norm.weight", (q,)), Tensor(f"{a}.k_norm.weight", (k,))]
    return out


def _mla(c: dict, a: str) -> list[Tensor]:
    """DeepSeek's latent attention: low-rank q (when q_lora_rank is set) and a shared compressed kv."""
    h, heads = c["hidden_size"], c["num_attention_heads"]
    nope, rope, v = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    q_rank, kv_rank = c.get("q_lora_rank"), c["kv_lora_rank"]
    if q_rank:
        out = [_linear(f"{a}.q_a_proj", q_rank, h), Tensor(f"{a}.q_a_layernorm.weight", (q_rank,)),
               _linear(f"{a}.q_b_proj", heads * (nope + rope), q_rank)]
    else:
        out = [_linear(f"{a}.q_proj", heads * (nope + rope), h)]
    return out + [_linear(f"{a}.kv_a_proj_with_mqa", kv_rank + rope, h), Tensor(f"{a}.kv_a_layernorm.weight", (kv_rank,)),
                  _linear(f"{a}.kv_b_proj", heads * (nope + v), kv_rank), _linear(f"{a}.o_proj", h, heads * v)]


def _gated(prefix: str, h: int, inter: int, names=("gate_proj", "up_proj", "down_proj")) -> list[Tensor]:
    gate, up, down = names
    return [_linear(f"{prefix}.{gate}", inter, h), _linear(f"{prefix}.{up}", inter, h), _linear(f"{prefix}.{down}", h, inter)]


def _mlp(c: dict, p: str, layer: int, style: str) -> list[Tensor]:
    h = c["hidden_size"]
    if style == "gated":
        return _gated(f"{p}.mlp", h, c["intermediate_size"])
    if style == "fused_gate_up":
        inter = c["intermediate_size"]
        return [_linear(f"{p}.mlp.gate_up_proj", 2 * inter, h), _linear(f"{p}.mlp.down_proj", h, inter)]
    if style == "mixtral":  # the per-expert names transformers still saves (w1 gate, w2 down, w3 up)
        experts, inter, m = c["num_local_experts"], c["intermediate_size"], f"{p}.block_sparse_moe"
        out = [_linear(f"{m}.gate", experts, h)]
        for e in range(experts):
            x = f"{m}.experts.{e}"
            out += [_linear(f"{x}.w1", inter, h), _linear(f"{x}.w2", h, inter), _linear(f"{x}.w3", inter, h)]
        return out
    if style == "deepseek" and layer < c.get("first_k_dense_replace", 0):
        return _gated(f"{p}.mlp", h, c["intermediate_size"])
    if style == "qwen_moe" and not _qwen_sparse(c, layer):
        return _gated(f"{p}.mlp", h, c["intermediate_size"])
    experts = c.get("num_experts") or c.get("num_local_experts") or c["n_routed_experts"]
    inter = c["moe_intermediate_size"]
    out = [_linear(f"{p}.mlp.gate", experts, h)]
    if style == "deepseek":
        out.append(Tensor(f"{p}.mlp.gate.e_score_correction_bias", (experts,)))
    for e in range(experts):
        out += _gated(f"{p}.mlp.experts.{e}", h, inter)
    if style == "deepseek" and c.get("n_shared_experts"):
        out += _gated(f"{p}.mlp.shared_experts", h, inter * c["n_shared_experts"])
    return out


def _qwen_sparse(c: dict, layer: int) -> bool:
    """Qwen-MoE: a layer has experts unless listed in mlp_only_layers, every decoder_sparse_step-th layer."""
    step = c.get("decoder_sparse_step", 1) or 1
    return layer not in (c.get("mlp_only_layers") or []) and (layer + 1) % step == 0


def _bert(c: dict) -> list[Tensor]:
    h, n, inter = c["hidden_size"], c["num_hidden_layers"], c["intermediate_size"]
    out = [Tensor("embeddings.word_embeddings.weight", (c["vocab_size"], h), LayerKind.EMBEDDING),
           Tensor("embeddings.position_embeddings.weight", (c.get("max_position_embeddings", 512), h), LayerKind.EMBEDDING),
           Tensor("embeddings.token_type_embeddings.weight", (c.get("type_vocab_size", 2), h), LayerKind.EMBEDDING),
           Tensor("embeddings.LayerNorm.weight", (h,)), Tensor("embeddings.LayerNorm.bias", (h,))]

    def dense(name: str, rows: int, cols: int) -> list[Tensor]:
        return [Tensor(f"{name}.weight", (rows, cols), LayerKind.LINEAR), Tensor(f"{name}.bias", (rows,))]

    def norm(name: str) -> list[Tensor]:
        return [Tensor(f"{name}.weight", (h,)), Tensor(f"{name}.bias", (h,))]

    for i in range(n):
        p = f"encoder.layer.{i}"
        for name in ("query", "key", "value"):
            out += dense(f"{p}.attention.self.{name}", h, h)
        out += dense(f"{p}.attention.output.dense", h, h) + norm(f"{p}.attention.output.LayerNorm")
        out += dense(f"{p}.intermediate.dense", inter, h) + dense(f"{p}.output.dense", h, inter)
        out += norm(f"{p}.output.LayerNorm")
    return out + dense("pooler.dense", h, h)
