"""PyTorch forms of the built-ins: same module names, same weights, same numerics as the ONNX forms."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from compiler.models.builtin import parse_ref, tiny_bert, tiny_cnn, tiny_llama


class _RMSNorm(nn.Module):
    def __init__(self, size: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))

    def forward(self, x):
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + tiny_llama.EPS) * self.weight


class _LlamaAttention(nn.Module):
    def __init__(self, spec: tiny_llama.LlamaSpec):
        super().__init__()
        self.spec = spec
        kv = spec.kv_heads * spec.head_dim
        self.q_proj = nn.Linear(spec.hidden, spec.hidden, bias=False)
        self.k_proj = nn.Linear(spec.hidden, kv, bias=False)
        self.v_proj = nn.Linear(spec.hidden, kv, bias=False)
        self.o_proj = nn.Linear(spec.hidden, spec.hidden, bias=False)

    def forward(self, x, cos, sin, mask):
        s = self.spec
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, s.heads, s.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, s.kv_heads, s.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, s.kv_heads, s.head_dim).transpose(1, 2)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        rep = s.heads // s.kv_heads
        scores = q @ k.repeat_interleave(rep, dim=1).transpose(-1, -2) * s.head_dim ** -0.5
        probs = torch.softmax(scores + mask, dim=-1)
        ctx = (probs @ v.repeat_interleave(rep, dim=1)).transpose(1, 2).reshape(b, t, s.hidden)
        return self.o_proj(ctx), k, v


def _rope(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class _LlamaMLP(nn.Module):
    def __init__(self, spec: tiny_llama.LlamaSpec):
        super().__init__()
        self.gate_proj = nn.Linear(spec.hidden, spec.intermediate, bias=False)
        self.up_proj = nn.Linear(spec.hidden, spec.intermediate, bias=False)
        self.down_proj = nn.Linear(spec.intermediate, spec.hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _LlamaLayer(nn.Module):
    def __init__(self, spec):
        super().__init__()
        self.input_layernorm = _RMSNorm(spec.hidden)
        self.self_attn = _LlamaAttention(spec)
        self.post_attention_layernorm = _RMSNorm(spec.hidden)
        self.mlp = _LlamaMLP(spec)

    def forward(self, h, cos, sin, mask):
        attn, k, v = self.self_attn(self.input_layernorm(h), cos, sin, mask)
        h = h + attn
        return h + self.mlp(self.post_attention_layernorm(h)), k, v


class _LlamaBody(nn.Module):
    def __init__(self, spec):
        super().__init__()
        self.embed_tokens = nn.Embedding(spec.vocab, spec.hidden)
        self.layers = nn.ModuleList(_LlamaLayer(spec) for _ in range(spec.layers))
        self.norm = _RMSNorm(spec.hidden)


class TinyLlama(nn.Module):
    """Returns (logits, [(key, value) per layer]) like an exported decoder's outputs."""

    def __init__(self, spec: tiny_llama.LlamaSpec):
        super().__init__()
        self.spec = spec
        self.model = _LlamaBody(spec)
        self.lm_head = nn.Linear(spec.hidden, spec.vocab, bias=False)

    def forward(self, input_ids, attention_mask):
        """Logits of the tiny Llama."""
        t = input_ids.shape[1]
        pos = torch.arange(t, dtype=torch.float32)
        inv_freq = 1.0 / tiny_llama.ROPE_THETA ** (np.arange(0, self.spec.head_dim, 2, dtype=np.float64) / self.spec.head_dim)
        freqs = pos[:, None] * torch.from_numpy(inv_freq.astype(np.float32))[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        causal = torch.zeros(t, t).masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        padding = torch.zeros(attention_mask.shape).masked_fill(attention_mask == 0, float("-inf"))[:, None, None, :]
        mask = causal + padding
        h, presents = self.model.embed_tokens(input_ids), []
        for layer in self.model.layers:
            h, k, v = layer(h, cos, sin, mask)
            presents.append((k, v))
        return self.lm_head(self.model.norm(h)), presents


class _BertSelf(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.query, self.key, self.value = nn.Linear(h, h), nn.Linear(h, h), nn.Linear(h, h)


class _BertAttentionOutput(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.dense = nn.Linear(h, h)
        self.LayerNorm = nn.LayerNorm(h, eps=tiny_bert.LN_EPS)


class _BertAttention(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.self = _BertSelf(h)
        self.output = _BertAttentionOutput(h)


class _Dense(nn.Module):
    def __init__(self, inp, out, norm: bool):
        super().__init__()
        self.dense = nn.Linear(inp, out)
        if norm:
            self.LayerNorm = nn.LayerNorm(out, eps=tiny_bert.LN_EPS)


class _BertLayer(nn.Module):
    def __init__(self, spec):
        super().__init__()
        self.spec = spec
        self.attention = _BertAttention(spec.hidden)
        self.intermediate = _Dense(spec.hidden, spec.intermediate, norm=False)
        self.output = _Dense(spec.intermediate, spec.hidden, norm=True)

    def forward(self, x, mask):
        s, (b, t, _) = self.spec, x.shape
        hd = s.hidden // s.heads
        split = lambda y: y.view(b, t, s.heads, hd).transpose(1, 2)  # noqa: E731
        att = self.attention
        q, k, v = split(att.self.query(x)), split(att.self.key(x)), split(att.self.value(x))
        probs = torch.softmax(q @ k.transpose(-1, -2) * hd ** -0.5 + mask, dim=-1)
        ctx = (probs @ v).transpose(1, 2).reshape(b, t, s.hidden)
        x = att.output.LayerNorm(att.output.dense(ctx) + x)
        return self.output.LayerNorm(self.output.dense(F.gelu(self.intermediate.dense(x))) + x)


class _BertEmbeddings(nn.Module):
    def __init__(self, spec):
        super().__init__()
        self.word_embeddings = nn.Embedding(spec.vocab, spec.hidden)
        self.position_embeddings = nn.Embedding(spec.max_positions, spec.hidden)
        self.token_type_embeddings = nn.Embedding(2, spec.hidden)
        self.LayerNorm = nn.LayerNorm(spec.hidden, eps=tiny_bert.LN_EPS)


class _BertEncoder(nn.Module):
    def __init__(self, spec):
        super().__init__()
        self.layer = nn.ModuleList(_BertLayer(spec) for _ in range(spec.layers))


class _Pooler(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.dense = nn.Linear(h, h)


class TinyBert(nn.Module):
    """Returns (last_hidden_state, pooler_output)."""

    def __init__(self, spec: tiny_bert.BertSpec):
        super().__init__()
        self.embeddings = _BertEmbeddings(spec)
        self.encoder = _BertEncoder(spec)
        self.pooler = _Pooler(spec.hidden)

    def forward(self, input_ids, attention_mask):
        """Token embeddings of the tiny BERT (last hidden state)."""
        e = self.embeddings
        pos = torch.arange(input_ids.shape[1])
        x = e.word_embeddings(input_ids) + e.position_embeddings(pos) + e.token_type_embeddings.weight[0]
        x = e.LayerNorm(x)
        mask = (1.0 - attention_mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
        for layer in self.encoder.layer:
            x = layer(x, mask)
        return x, torch.tanh(self.pooler.dense(x[:, 0]))


class TinyCnn(nn.Module):
    """The PyTorch form of the tiny CNN."""
    def __init__(self, spec: tiny_cnn.CnnSpec):
        super().__init__()
        self.conv1 = nn.Conv2d(3, spec.channels, 3, padding=1)
        self.conv2 = nn.Conv2d(spec.channels, 2 * spec.channels, 3, padding=1)
        self.fc1 = nn.Linear(spec.flat, spec.hidden)
        self.fc2 = nn.Linear(spec.hidden, spec.classes)

    def forward(self, pixel_values):
        """Class logits."""
        x = F.max_pool2d(F.relu(self.conv1(pixel_values)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = x.permute(0, 2, 3, 1).flatten(1)
        return self.fc2(F.relu(self.fc1(x)))


_FORMS = {"tiny-llama": (TinyLlama, tiny_llama), "tiny-bert": (TinyBert, tiny_bert), "tiny-cnn": (TinyCnn, tiny_cnn)}


def skeleton(ref: str) -> nn.Module:
    """The PyTorch form of `builtin:…` without its weights loaded (under `parameters_on_meta`, no memory)."""
    name, spec = parse_ref(ref)
    return _FORMS[name][0](spec)


def torch_model(ref: str) -> nn.Module:
    """The PyTorch form of `builtin:…`, with the weights of its ONNX form."""
    name, spec = parse_ref(ref)
    cls, mod = _FORMS[name]
    model = cls(spec)
    state = {k: torch.from_numpy(v) for k, v in mod.weights(spec).items()}
    model.load_state_dict(state, strict=True)
    return model.eval()
