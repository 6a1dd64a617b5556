"""builtin:tiny-llama — a Llama-style decoder: RMSNorm, RoPE, GQA q/k/v/o_proj, SwiGLU gate/up/down_proj,
a causal mask built with -inf, outputs `logits` and `present.N.key/value` like real LLM exports."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.models.builtin.graph import FLOAT, INT64, GraphBuilder, normal, tensor

EPS = 1e-6
ROPE_THETA = 10000.0


@dataclass(frozen=True)
class LlamaSpec:
    """The sizes of a tiny Llama (`builtin:tiny-llama?layers=…&hidden=…`)."""
    layers: int = 2
    hidden: int = 128
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 256
    vocab: int = 512
    seed: int = 0

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.hidden // self.heads

    def problems(self) -> list[str]:
        """What is wrong with these sizes, as sentences."""
        out = []
        if self.hidden % self.heads:
            out.append(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        elif self.head_dim % 2:
            out.append(f"hidden/heads ({self.head_dim}) must be even for rotary embeddings")
        if self.heads % self.kv_heads:
            out.append(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        return out


def weights(spec: LlamaSpec) -> dict[str, np.ndarray]:
    """All parameters in torch layout ([out, in] for Linear), in module order; shared by both forms."""
    rng = np.random.RandomState(spec.seed)
    h, kv = spec.hidden, spec.kv_heads * spec.head_dim
    w = {"model.embed_tokens.weight": normal(rng, (spec.vocab, h), 1.0)}
    for i in range(spec.layers):
        p = f"model.layers.{i}"
        w[f"{p}.input_layernorm.weight"] = (1 + normal(rng, (h,), 0.1))
        for name, out in (("q_proj", h), ("k_proj", kv), ("v_proj", kv), ("o_proj", h)):
            w[f"{p}.self_attn.{name}.weight"] = normal(rng, (out, h), h ** -0.5)
        w[f"{p}.post_attention_layernorm.weight"] = (1 + normal(rng, (h,), 0.1))
        w[f"{p}.mlp.gate_proj.weight"] = normal(rng, (spec.intermediate, h), h ** -0.5)
        w[f"{p}.mlp.up_proj.weight"] = normal(rng, (spec.intermediate, h), h ** -0.5)
        w[f"{p}.mlp.down_proj.weight"] = normal(rng, (h, spec.intermediate), spec.intermediate ** -0.5)
    w["model.norm.weight"] = (1 + normal(rng, (h,), 0.1))
    w["lm_head.weight"] = normal(rng, (spec.vocab, h), h ** -0.5)
    return w


def build_onnx(spec: LlamaSpec):
    """The ONNX form (as torch.onnx exports a Llama decoder without cache)."""
    g, w = GraphBuilder(), weights(spec)
    embed = g.weight("model.embed_tokens.weight", w["model.embed_tokens.weight"])
    h = g.op("Gather", [embed, "input_ids"], "/model/embed_tokens")
    cos, sin, mask = _positions_and_mask(g, spec)
    presents = []
    for i in range(spec.layers):
        h, key, value = _layer(g, spec, w, i, h, cos, sin, mask)
        presents += [g.rename_output(key, f"present.{i}.key"), g.rename_output(value, f"present.{i}.value")]
    x = _rms_norm(g, h, "/model/norm", g.weight("model.norm.weight", w["model.norm.weight"]))
    logits = g.rename_output(g.linear(x, "/lm_head", "lm_head.weight", w["lm_head.weight"]), "logits")
    kv_shape = ["batch", spec.kv_heads, "sequence", spec.head_dim]
    outputs = [tensor(logits, FLOAT, ["batch", "sequence", spec.vocab])]
    outputs += [tensor(name, FLOAT, kv_shape) for name in presents]
    inputs = [tensor("input_ids", INT64, ["batch", "sequence"]), tensor("attention_mask", INT64, ["batch", "sequence"])]
    return g.model("tiny_llama", inputs, outputs)


def _positions_and_mask(g: GraphBuilder, spec: LlamaSpec):
    s = "/model/rotary_emb"
    seq = g.op("Gather", [g.op("Shape", ["input_ids"], s), g.const(1, np.int64)], s)
    pos = g.op("Range", [g.const(0, np.int64), seq, g.const(1, np.int64)], s)
    inv_freq = 1.0 / ROPE_THETA ** (np.arange(0, spec.head_dim, 2, dtype=np.float64) / spec.head_dim)
    freqs = g.op("Mul", [g.op("Unsqueeze", [g.op("Cast", [pos], s, to=FLOAT), g.const([1], np.int64)], s),
                         g.const(inv_freq.astype(np.float32))], s)
    emb = g.op("Concat", [freqs, freqs], s, axis=-1)
    cos, sin = g.op("Cos", [emb], s), g.op("Sin", [emb], s)
    m = "/model/causal_mask"
    future = g.op("Greater", [g.op("Unsqueeze", [pos, g.const([0], np.int64)], m),
                              g.op("Unsqueeze", [pos, g.const([1], np.int64)], m)], m)
    causal = g.op("Where", [future, g.const(-np.inf), g.const(0.0)], m)
    padded = g.op("Equal", [g.op("Unsqueeze", ["attention_mask", g.const([1, 2, 3], np.int64)], m),
                            g.const(0, np.int64)], m)
    mask = g.op("Add", [causal, g.op("Where", [padded, g.const(-np.inf), g.const(0.0)], m)], m)
    return cos, sin, mask  # mask: [batch, 1, 1, seq, seq] for the grouped-query layout


def _rms_norm(g: GraphBuilder, x: str, scope: str, weight: str) -> str:
    var = g.op("ReduceMean", [g.op("Mul", [x, x], scope), g.const([-1], np.int64)], scope, keepdims=1)
    rms = g.op("Sqrt", [g.op("Add", [var, g.const(EPS)], scope)], scope)
    return g.op("Mul", [g.op("Div", [x, rms], scope), weight], scope)


def _rope(g: GraphBuilder, x: str, scope: str, cos: str, sin: str, head_dim: int) -> str:
    half = head_dim // 2
    first = g.op("Slice", [x, g.const([0], np.int64), g.const([half], np.int64), g.const([-1], np.int64)], scope)
    second = g.op("Slice", [x, g.const([half], np.int64), g.const([head_dim], np.int64), g.const([-1], np.int64)], scope)
    rotated = g.op("Concat", [g.op("Neg", [second], scope), first], scope, axis=-1)
    return g.op("Add", [g.op("Mul", [x, cos], scope), g.op("Mul", [rotated, sin], scope)], scope)


def _layer(g, spec: LlamaSpec, w, i: int, h: str, cos: str, sin: str, mask: str):
    p, s = f"model.layers.{i}", f"/model/layers.{i}"
    x = _rms_norm(g, h, f"{s}/input_layernorm", g.weight(f"{p}.input_layernorm.weight", w[f"{p}.input_layernorm.weight"]))
    a = f"{s}/self_attn"
    q, k, v = (g.linear(x, f"{a}/{n}", f"{p}.self_attn.{n}.weight", w[f"{p}.self_attn.{n}.weight"])
               for n in ("q_proj", "k_proj", "v_proj"))
    kv, rep, hd = spec.kv_heads, spec.heads // spec.kv_heads, spec.head_dim
    q = g.op("Transpose", [g.op("Reshape", [q, g.const([0, 0, kv, rep, hd], np.int64)], a)], a, perm=[0, 2, 3, 1, 4])
    k = g.op("Transpose", [g.op("Reshape", [k, g.const([0, 0, kv, hd], np.int64)], a)], a, perm=[0, 2, 1, 3])
    v = g.op("Transpose", [g.op("Reshape", [v, g.const([0, 0, kv, hd], np.int64)], a)], a, perm=[0, 2, 1, 3])
    q, k = _rope(g, q, a, cos, sin, hd), _rope(g, k, a, cos, sin, hd)
    k_t = g.op("Unsqueeze", [g.op("Transpose", [k], a, perm=[0, 1, 3, 2]), g.const([2], np.int64)], a)
    scores = g.op("Mul", [g.op("MatMul", [q, k_t], a), g.const(hd ** -0.5)], a)
    probs = g.op("Softmax", [g.op("Add", [scores, mask], a)], a, axis=-1)
    ctx = g.op("MatMul", [probs, g.op("Unsqueeze", [v, g.const([2], np.int64)], a)], a)
    ctx = g.op("Reshape", [g.op("Transpose", [ctx], a, perm=[0, 3, 1, 2, 4]), g.const([0, 0, spec.hidden], np.int64)], a)
    h = g.op("Add", [h, g.linear(ctx, f"{a}/o_proj", f"{p}.self_attn.o_proj.weight", w[f"{p}.self_attn.o_proj.weight"])], s)
    x = _rms_norm(g, h, f"{s}/post_attention_layernorm",
                  g.weight(f"{p}.post_attention_layernorm.weight", w[f"{p}.post_attention_layernorm.weight"]))
    m = f"{s}/mlp"
    gate = g.linear(x, f"{m}/gate_proj", f"{p}.mlp.gate_proj.weight", w[f"{p}.mlp.gate_proj.weight"])
    up = g.linear(x, f"{m}/up_proj", f"{p}.mlp.up_proj.weight", w[f"{p}.mlp.up_proj.weight"])
    act = g.op("Mul", [g.op("Mul", [gate, g.op("Sigmoid", [gate], m)], m), up], m)
    down = g.linear(act, f"{m}/down_proj", f"{p}.mlp.down_proj.weight", w[f"{p}.mlp.down_proj.weight"])
    return g.op("Add", [h, down], s), k, v
