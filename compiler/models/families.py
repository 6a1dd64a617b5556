"""Layer layouts of known HF families, from config.json alone (so a 7B model need not be on disk)."""

from __future__ import annotations

from dataclasses import dataclass

from compiler.models.index import LayerKind

DECODERS = ("llama", "mistral", "qwen2")
ENCODERS = ("bert",)


@dataclass(frozen=True, slots=True)
class Tensor:
    """A parameter of the layout: name, torch shape, and the layer kind when it is a layer's weight."""

    name: str
    shape: tuple[int, ...]
    kind: LayerKind | None = None  # Linear | Embedding for layer weights; None for norms and biases


def layout(config: dict) -> list[Tensor] | None:
    """The parameter layout a config describes (llama, mistral, qwen2, bert), or None for other families."""
    family = config.get("model_type")
    if family in DECODERS:
        return _decoder(config, family)
    if family in ENCODERS:
        return _bert(config)
    return None


def _decoder(c: dict, family: str) -> list[Tensor]:
    h, n, inter, vocab = c["hidden_size"], c["num_hidden_layers"], c["intermediate_size"], c["vocab_size"]
    heads = c["num_attention_heads"]
    kv_heads = c.get("num_key_value_heads") or heads
    hd = c.get("head_dim") or h // heads
    out = [Tensor("model.embed_tokens.weight", (vocab, h), LayerKind.EMBEDDING)]
    for i in range(n):
        p = f"model.layers.{i}"
        out.append(Tensor(f"{p}.input_layernorm.weight", (h,)))
        for name, rows in (("q_proj", heads * hd), ("k_proj", kv_heads * hd), ("v_proj", kv_heads * hd)):
            out.append(Tensor(f"{p}.self_attn.{name}.weight", (rows, h), LayerKind.LINEAR))
            if family == "qwen2":
                out.append(Tensor(f"{p}.self_attn.{name}.bias", (rows,)))
        out.append(Tensor(f"{p}.self_attn.o_proj.weight", (h, heads * hd), LayerKind.LINEAR))
        out.append(Tensor(f"{p}.post_attention_layernorm.weight", (h,)))
        out += [Tensor(f"{p}.mlp.gate_proj.weight", (inter, h), LayerKind.LINEAR),
                Tensor(f"{p}.mlp.up_proj.weight", (inter, h), LayerKind.LINEAR),
                Tensor(f"{p}.mlp.down_proj.weight", (h, inter), LayerKind.LINEAR)]
    out.append(Tensor("model.norm.weight", (h,)))
    out.append(Tensor("lm_head.weight", (vocab, h), LayerKind.LINEAR))
    return out


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
