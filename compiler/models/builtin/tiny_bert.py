"""builtin:tiny-bert — a BERT encoder with `query/key/value` naming and an attention-mask input.

The padding mask is built like HF BERT: (1 - mask) · float32 min, a huge negative range that a naive
min/max calibration of the mask path would turn into a useless scale.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.models.builtin.graph import FLOAT, INT64, GraphBuilder, normal, tensor

LN_EPS = 1e-12


@dataclass(frozen=True)
class BertSpec:
    """The sizes of a tiny BERT (`builtin:tiny-bert?layers=…`)."""
    layers: int = 2
    hidden: int = 128
    heads: int = 4
    intermediate: int = 512
    vocab: int = 512
    max_positions: int = 512
    seed: int = 0

    def problems(self) -> list[str]:
        """What is wrong with these sizes, as sentences."""
        return [f"hidden ({self.hidden}) must be a multiple of heads ({self.heads})"] if self.hidden % self.heads else []


def _linear(w, rng, name: str, out: int, inp: int) -> None:
    w[f"{name}.weight"] = normal(rng, (out, inp), inp ** -0.5)
    w[f"{name}.bias"] = normal(rng, (out,), 0.02)


def _layer_norm(w, rng, name: str, size: int) -> None:
    w[f"{name}.weight"] = 1 + normal(rng, (size,), 0.1)
    w[f"{name}.bias"] = normal(rng, (size,), 0.02)


def weights(spec: BertSpec) -> dict[str, np.ndarray]:
    """The seeded weights, by tensor name."""
    rng = np.random.RandomState(spec.seed)
    h = spec.hidden
    w = {"embeddings.word_embeddings.weight": normal(rng, (spec.vocab, h), 1.0),
         "embeddings.position_embeddings.weight": normal(rng, (spec.max_positions, h), 0.1),
         "embeddings.token_type_embeddings.weight": normal(rng, (2, h), 0.1)}
    _layer_norm(w, rng, "embeddings.LayerNorm", h)
    for i in range(spec.layers):
        p = f"encoder.layer.{i}"
        for name in ("query", "key", "value"):
            _linear(w, rng, f"{p}.attention.self.{name}", h, h)
        _linear(w, rng, f"{p}.attention.output.dense", h, h)
        _layer_norm(w, rng, f"{p}.attention.output.LayerNorm", h)
        _linear(w, rng, f"{p}.intermediate.dense", spec.intermediate, h)
        _linear(w, rng, f"{p}.output.dense", h, spec.intermediate)
        _layer_norm(w, rng, f"{p}.output.LayerNorm", h)
    _linear(w, rng, "pooler.dense", h, h)
    return w


def build_onnx(spec: BertSpec):
    """The ONNX form (as torch.onnx exports BERT)."""
    g, w = GraphBuilder(), weights(spec)
    e = "/embeddings"
    seq = g.op("Gather", [g.op("Shape", ["input_ids"], e), g.const(1, np.int64)], e)
    pos = g.op("Range", [g.const(0, np.int64), seq, g.const(1, np.int64)], e)
    word = g.op("Gather", [g.weight("embeddings.word_embeddings.weight", w["embeddings.word_embeddings.weight"]),
                           "input_ids"], f"{e}/word_embeddings")
    position = g.op("Gather", [g.weight("embeddings.position_embeddings.weight",
                                        w["embeddings.position_embeddings.weight"]), pos], f"{e}/position_embeddings")
    token_type = g.op("Gather", [g.weight("embeddings.token_type_embeddings.weight",
                                          w["embeddings.token_type_embeddings.weight"]), g.const(0, np.int64)],
                      f"{e}/token_type_embeddings")
    x = g.op("Add", [g.op("Add", [word, position], e), token_type], e)
    x = _layer_norm_op(g, w, x, "embeddings.LayerNorm", f"{e}/LayerNorm")
    m = "/extended_attention_mask"
    keep = g.op("Cast", [g.op("Unsqueeze", ["attention_mask", g.const([1, 2], np.int64)], m)], m, to=FLOAT)
    mask = g.op("Mul", [g.op("Sub", [g.const(1.0), keep], m), g.const(np.finfo(np.float32).min)], m)
    for i in range(spec.layers):
        x = _layer(g, spec, w, i, x, mask)
    hidden = g.rename_output(x, "last_hidden_state")
    first = g.op("Gather", [hidden, g.const(0, np.int64)], "/pooler", axis=1)
    pooled = g.op("Tanh", [g.linear(first, "/pooler/dense", "pooler.dense.weight", w["pooler.dense.weight"],
                                    w["pooler.dense.bias"])], "/pooler")
    pooled = g.rename_output(pooled, "pooler_output")
    inputs = [tensor("input_ids", INT64, ["batch", "sequence"]), tensor("attention_mask", INT64, ["batch", "sequence"])]
    outputs = [tensor(hidden, FLOAT, ["batch", "sequence", spec.hidden]), tensor(pooled, FLOAT, ["batch", spec.hidden])]
    return g.model("tiny_bert", inputs, outputs)


def _layer_norm_op(g, w, x: str, name: str, scope: str) -> str:
    return g.op("LayerNormalization", [x, g.weight(f"{name}.weight", w[f"{name}.weight"]),
                                       g.weight(f"{name}.bias", w[f"{name}.bias"])], scope, axis=-1, epsilon=LN_EPS)


def _dense(g, w, x: str, name: str) -> str:
    return g.linear(x, "/" + name.replace(".", "/").replace("/layer/", "/layer."), f"{name}.weight",
                    w[f"{name}.weight"], w[f"{name}.bias"])


def _layer(g, spec: BertSpec, w, i: int, x: str, mask: str) -> str:
    p = f"encoder.layer.{i}"
    a = f"/encoder/layer.{i}/attention/self"
    hd = spec.hidden // spec.heads
    heads = [g.op("Reshape", [_dense(g, w, x, f"{p}.attention.self.{n}"), g.const([0, 0, spec.heads, hd], np.int64)], a)
             for n in ("query", "key", "value")]
    q = g.op("Transpose", [heads[0]], a, perm=[0, 2, 1, 3])
    k = g.op("Transpose", [heads[1]], a, perm=[0, 2, 3, 1])
    v = g.op("Transpose", [heads[2]], a, perm=[0, 2, 1, 3])
    scores = g.op("Add", [g.op("Mul", [g.op("MatMul", [q, k], a), g.const(hd ** -0.5)], a), mask], a)
    ctx = g.op("MatMul", [g.op("Softmax", [scores], a, axis=-1), v], a)
    ctx = g.op("Reshape", [g.op("Transpose", [ctx], a, perm=[0, 2, 1, 3]), g.const([0, 0, spec.hidden], np.int64)], a)
    attn = _dense(g, w, ctx, f"{p}.attention.output.dense")
    x = _layer_norm_op(g, w, g.op("Add", [attn, x], f"/encoder/layer.{i}/attention/output"),
                       f"{p}.attention.output.LayerNorm", f"/encoder/layer.{i}/attention/output/LayerNorm")
    inner = g.op("Gelu", [_dense(g, w, x, f"{p}.intermediate.dense")], f"/encoder/layer.{i}/intermediate")
    out = _dense(g, w, inner, f"{p}.output.dense")
    return _layer_norm_op(g, w, g.op("Add", [out, x], f"/encoder/layer.{i}/output"), f"{p}.output.LayerNorm",
                          f"/encoder/layer.{i}/output/LayerNorm")
