"""Offline rotations folded into a decoder's weights (QuaRot's R1 and R2; docs/torch.md, Rotations), on a
transformers model in memory. The float model's outputs do not change; what changes is where the outliers sit:

- R1 rotates the residual stream by Q (a random Hadamard of the hidden width). RMSNorm commutes with an
  orthogonal Q once its weights are folded into the linear layers it feeds (‖xQ‖ = ‖x‖), so: each norm's
  weights go into the layers after it (and become ones), then the embeddings and every layer reading the stream
  take W·Q, every layer writing it (o_proj, down_proj) Qᵀ·W. A tied LM head is untied first: the final norm's
  weights fold into the head, not into the embeddings.
- R2 rotates each attention head's values by H (a random Hadamard of the head width): v_proj's rows of a head
  take Hᵀ, o_proj's columns of each head H. Every head shares H, so grouped-query attention needs nothing more.

The products are formed in float64 and cast back to each weight's dtype."""

from __future__ import annotations

import re
from collections.abc import Container
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from compiler.quant.rotations import hadamard_order, random_hadamard

READS_STREAM = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
WRITES_STREAM = ("self_attn.o_proj", "mlp.down_proj")
NORMS = {"input_layernorm": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
         "post_attention_layernorm": ("mlp.gate_proj", "mlp.up_proj")}


class RotationRefused(ValueError):
    """The model has a part these rotations do not commute with (said in words, for a diagnostic)."""


@dataclass(frozen=True)
class Rotated:
    """What a rotation did: the widths rotated and how each Hadamard was built (for the report)."""

    hidden: int
    head_dim: int | None
    hidden_factors: tuple[int, ...]
    untied: bool


def rotate(model: Any, seed: int = 0, heads: bool = True) -> Rotated:
    """R1 (and R2 where `heads`) folded into `model`'s weights in place (a transformers causal LM, typed Any: its
    submodules are reached by name): its float outputs are unchanged."""
    base, head = _decoder(model), model.get_output_embeddings()
    embed, layers, final = base.embed_tokens, base.layers, base.norm
    hidden = embed.weight.shape[1]
    factors = hadamard_order(hidden)
    if factors is None:
        raise RotationRefused(f"no Hadamard matrix of order {hidden} (the hidden width) is built here")
    for layer in layers:
        _refuse_other_norms(layer)
    untied = head.weight is embed.weight
    if untied:  # the final norm's weights fold into the head alone
        head.weight = nn.Parameter(head.weight.detach().clone())
        model.config.tie_word_embeddings = False
    for layer in layers:
        for norm, readers in NORMS.items():
            _fold_norm(getattr(layer, norm), [layer.get_submodule(r) for r in readers])
    _fold_norm(final, [head])
    q = torch.from_numpy(random_hadamard(hidden, seed))
    with torch.no_grad():
        embed.weight.copy_(_times(embed.weight, q))
        head.weight.copy_(_times(head.weight, q))
        for layer in layers:
            for name in READS_STREAM:
                linear = layer.get_submodule(name)
                linear.weight.copy_(_times(linear.weight, q))
            for name in WRITES_STREAM:
                linear = layer.get_submodule(name)
                linear.weight.copy_(_before(q.T, linear.weight))
                if linear.bias is not None:
                    linear.bias.copy_(_vector_times(linear.bias, q))
    head_dim = _rotate_heads(model, layers, seed + 1) if heads else None
    return Rotated(hidden, head_dim, factors, untied)


def _decoder(model: Any) -> Any:
    """The decoder stack: embeddings, layers, final norm (Llama-family naming)."""
    base = getattr(model, "model", None)
    if base is None or not all(hasattr(base, a) for a in ("embed_tokens", "layers", "norm")):
        raise RotationRefused(f"{type(model).__name__} has no Llama-style decoder (embed_tokens, layers, norm)")
    return base


def _refuse_other_norms(layer: Any) -> None:
    """A norm applied to a layer's output before the residual add (Gemma 2/3's post-norms), a LayerNorm's mean
    and bias, or a weight offset (Gemma's 1 + γ) do not commute with the rotation as folded here."""
    norms = {name for name, m in layer.named_children() if "norm" in name.lower()}
    if norms != set(NORMS):
        raise RotationRefused(f"{type(layer).__name__} has norms {sorted(norms)}; rotations here fold "
                              "input_layernorm and post_attention_layernorm only")
    for name in NORMS:
        norm = getattr(layer, name)
        kind = type(norm).__name__
        if not kind.endswith("RMSNorm") or "Gemma" in kind or getattr(norm, "bias", None) is not None:
            raise RotationRefused(f"{name} is a {kind}: rotations here commute with an RMSNorm of weight γ only")


def _fold_norm(norm: Any, readers: list[Any]) -> None:
    """The norm's weights into the layers it feeds (their input columns scaled), the norm's set to ones."""
    with torch.no_grad():
        gamma = norm.weight.detach().double()
        for linear in readers:
            linear.weight.copy_((linear.weight.double() * gamma[None, :]).to(linear.weight.dtype))
        norm.weight.fill_(1.0)


def _rotate_heads(model: Any, layers: Any, seed: int) -> int:
    """R2: each head's values by H, undone in o_proj's columns of that head."""
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if hadamard_order(head_dim) is None:
        raise RotationRefused(f"no Hadamard matrix of order {head_dim} (the head width) is built here")
    h = torch.from_numpy(random_hadamard(head_dim, seed))
    with torch.no_grad():
        for layer in layers:
            v, o = layer.self_attn.v_proj, layer.self_attn.o_proj
            kv = v.weight.shape[0] // head_dim
            rows = v.weight.double().reshape(kv, head_dim, -1)
            v.weight.copy_(torch.einsum("ji,kjc->kic", h, rows).reshape(v.weight.shape).to(v.weight.dtype))
            if v.bias is not None:
                v.bias.copy_((v.bias.double().reshape(kv, head_dim) @ h).reshape(-1).to(v.bias.dtype))
            cols = o.weight.double().reshape(o.weight.shape[0], -1, head_dim)
            o.weight.copy_((cols @ h).reshape(o.weight.shape).to(o.weight.dtype))
    return head_dim


def _times(weight: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """weight · q in float64, back in the weight's dtype."""
    return (weight.double() @ q).to(weight.dtype)


def _before(q: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """q · weight in float64, back in the weight's dtype."""
    return (q @ weight.double()).to(weight.dtype)


def _vector_times(bias: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """A row vector times q (an output bias of a layer writing the rotated stream)."""
    return (bias.double() @ q).to(bias.dtype)


# ---- the same rotation, one checkpoint tensor at a time ---------------------------------------------------
# What streams (file to file, offload, the tensors an output copies) reads instead of the checkpoint's tensor:
# each rotated tensor is computed from its own and, for a layer reading the stream, its norm's weights; nothing
# else of the model is held. Llama-family checkpoint names.
_LAYER = r"(?P<base>.+)\.layers\.(?P<n>\d+)\."
_READERS = re.compile(_LAYER + r"(?P<part>self_attn\.[qkv]_proj|mlp\.gate_proj|mlp\.up_proj)\.weight$")
_WRITERS = re.compile(_LAYER + r"(?P<part>self_attn\.o_proj|mlp\.down_proj)\.(?P<kind>weight|bias)$")
_VALUE_BIAS = re.compile(_LAYER + r"self_attn\.v_proj\.bias$")
_NORMS = re.compile(r".+\.(input_layernorm|post_attention_layernorm)\.weight$|(?P<base>.+)\.norm\.weight$")
_EMBED = re.compile(r"(?P<base>.+)\.embed_tokens\.weight$")
HEAD = "lm_head.weight"


@dataclass(frozen=True)
class Rotation:
    """R1's Q (hidden × hidden) and R2's H (head width; None: values not rotated), float64, as `rotate` draws
    them from a seed; `base`: the decoder's prefix in the checkpoint (`model`)."""

    q: torch.Tensor
    h: torch.Tensor | None
    base: str = "model"

    @classmethod
    def seeded(cls, hidden: int, head_dim: int | None, seed: int = 0, base: str = "model") -> Rotation:
        """The rotation `rotate(model, seed)` folds in (R2 where `head_dim` is given)."""
        h = torch.from_numpy(random_hadamard(head_dim, seed + 1)) if head_dim else None
        return cls(torch.from_numpy(random_hadamard(hidden, seed)), h, base)

    def tensor(self, key: str, read, stored: Container[str]) -> torch.Tensor | None:
        """The rotated form of checkpoint tensor `key` (`read(name)` gives any checkpoint tensor; `stored`: the
        names the checkpoint has), or None where the rotation leaves it as it is. `lm_head.weight` is given
        also for a tied checkpoint, which stores none: the final norm folds into the head alone."""
        if key == HEAD:
            source = read(HEAD) if HEAD in stored else read(f"{self.base}.embed_tokens.weight")
            return _folded(source, read(f"{self.base}.norm.weight"), self.q)
        if (m := _READERS.match(key)) is not None:
            norm = "input_layernorm" if m["part"].startswith("self_attn") else "post_attention_layernorm"
            rotated = _folded(read(key), read(f"{m['base']}.layers.{m['n']}.{norm}.weight"), self.q)
            return self._values(rotated) if m["part"] == "self_attn.v_proj" else rotated
        if (m := _WRITERS.match(key)) is not None:
            tensor = read(key)
            if m["kind"] == "bias":
                return _vector_times(tensor, self.q)
            rotated = _before(self.q.T, tensor)
            if m["part"] == "self_attn.o_proj" and self.h is not None:  # each head's columns by H
                cols = rotated.double().reshape(rotated.shape[0], -1, self.h.shape[0])
                rotated = (cols @ self.h).reshape(rotated.shape).to(rotated.dtype)
            return rotated
        if _VALUE_BIAS.match(key) is not None:
            return self._values(read(key)) if self.h is not None else None
        if _NORMS.match(key) is not None:
            return torch.ones_like(read(key))
        if _EMBED.match(key) is not None:
            return _times(read(key), self.q)
        return None

    def _values(self, rotated: torch.Tensor) -> torch.Tensor:
        """v_proj's rows (or bias) of each head by Hᵀ (R2)."""
        if self.h is None:
            return rotated
        d = self.h.shape[0]
        if rotated.dim() == 1:
            return (rotated.double().reshape(-1, d) @ self.h).reshape(-1).to(rotated.dtype)
        rows = rotated.double().reshape(-1, d, rotated.shape[1])
        return torch.einsum("ji,kjc->kic", self.h, rows).reshape(rotated.shape).to(rotated.dtype)


def _folded(weight: torch.Tensor, gamma: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """A layer reading the stream: its input columns scaled by the norm before it, then · q (in the weight's
    dtype)."""
    return ((weight.double() * gamma.double()[None, :]) @ q).to(weight.dtype)
