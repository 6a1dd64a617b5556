"""Offline rotations folded into a decoder's weights (QuaRot's R1 and R2; docs/torch.md, Rotations), on a
transformers model in memory. The float model's outputs do not change; what changes is where the outliers sit:

- R1 rotates the residual stream by Q (a random Hadamard of the hidden width). RMSNorm commutes with an
  orthogonal Q once its weights are folded into the linear layers it feeds (‖xQ‖ = ‖x‖), so: each norm's
  weights go into the layers after it (and become ones), then the embeddings and every layer reading the stream
  take W·Q, every layer writing it (o_proj, down_proj) Qᵀ·W. A tied LM head is untied first: the final norm's
  weights fold into the head, not into the embeddings.
- R2 rotates each attention head's values by H (a random Hadamard of the head width): v_proj's rows of a head
  take Hᵀ, o_proj's columns of each head H. Every head shares H, so grouped-query attention needs nothing more.
- R4 (`online r4`) rotates each down projection's input by D (a random Hadamard of the intermediate width) as the
  model runs, the SiLU product not commuting with any rotation: down_proj's weight takes W·D and a forward pre-hook
  gives it x·D (`attach_online`). The folder stores D unnormalized (±1) once, as `….mlp.down_proj.R4_input.weight`
  of the first layer, and names it in `quantization_config.transform_config`: the form llm-compressor's
  SpinQuantModifier writes and vLLM applies (compressed-tensors' `random-hadamard`, divided by √n as it runs).

The products are formed in float32 a slice of rows (or columns) at a time and cast back to each weight's dtype, Q
applied as its Kronecker factors (never formed): what rotating holds beside the tensor read is the factors, H
and one slice (cost.py counts it)."""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Container
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

from compiler.backends.torch.shards import DerivedShards, Entry
from compiler.quant.rotations import ONLINE_DOWN, SLICE, hadamard_factors, hadamard_order, random_hadamard, random_signs

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
    submodules are reached by name), each tensor as `Rotation.tensor` gives it: its float outputs are unchanged."""
    base, head = decoder_of(model), model.get_output_embeddings()
    hidden = base.embed_tokens.weight.shape[1]
    factors = hadamard_order(hidden)
    if factors is None:
        raise RotationRefused(f"no Hadamard matrix of order {hidden} (the hidden width) is built here")
    for layer in base.layers:
        refuse_other_norms(layer)
    config = model.config
    head_dim = (getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads) if heads else None
    if head_dim is not None and hadamard_order(head_dim) is None:
        raise RotationRefused(f"no Hadamard matrix of order {head_dim} (the head width) is built here")
    rotation = Rotation.seeded(hidden, head_dim, seed)
    untied = head.weight is base.embed_tokens.weight
    if untied:  # the final norm's weights fold into the head alone
        head.weight = nn.Parameter(head.weight.detach().clone())
        config.tie_word_embeddings = False
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for key, param in model.state_dict().items():
            rotated = rotation.tensor(key, state.__getitem__, state)
            if rotated is not None:
                param.copy_(rotated)
    return Rotated(hidden, head_dim, factors, untied)


def decoder_of(model: Any) -> Any:
    """The decoder stack: embeddings, layers, final norm (Llama-family naming)."""
    base = getattr(model, "model", None)
    if base is None or not all(hasattr(base, a) for a in ("embed_tokens", "layers", "norm")):
        raise RotationRefused(f"{type(model).__name__} has no Llama-style decoder (embed_tokens, layers, norm)")
    return base


def refuse_other_norms(layer: Any) -> None:
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
ONLINE_WEIGHT = f".mlp.down_proj.{ONLINE_DOWN}_input.weight"  # R4's D, stored under the first down projection


@dataclass(frozen=True)
class Kronecker:
    """A randomized Hadamard diag(s)·F/√n (F = F1 ⊗ F2 ⊗ …, float32; the signs first: compiler/quant/rotations.py),
    never formed: `right` applies its factors.
    Applied to rows wider than n, it turns each run of n of them alike (the block-diagonal rotation of `block`)."""

    factors: tuple[torch.Tensor, ...]
    signs: torch.Tensor  # s/√n

    @classmethod
    def seeded(cls, n: int, seed: int) -> Kronecker:
        """The randomized Hadamard of order n (a width, or the block of a block-diagonal rotation) whose signs
        come from `seed`."""
        return cls(tuple(torch.from_numpy(f).float() for f in hadamard_factors(n)),
                   torch.from_numpy(random_signs(n, seed)).float() / n ** 0.5)

    @property
    def width(self) -> int:
        """n."""
        return self.signs.shape[0]

    def right(self, rows: torch.Tensor) -> torch.Tensor:
        """rows · diag(s)·F/√n, float32, over the last axis (any leading shape; a multiple of n wide: each run of n
        of it turned alike)."""
        lead = rows.shape[:-1]
        y = (rows.reshape(-1, self.width) * self.signs.to(rows.device)).reshape(-1, *(f.shape[0] for f in self.factors))
        for axis, factor in enumerate(self.factors, start=1):
            y = torch.movedim(torch.movedim(y, axis, -1) @ factor.to(y.device), -1, axis)
        return y.reshape(*lead, -1)

    def stored(self) -> torch.Tensor:
        """diag(s)·F as the folder stores it (entries ±1: compressed-tensors and vLLM divide by √n as they run)."""
        product = torch.ones(1, 1)
        for factor in self.factors:  # float32 all along: n² · 4 bytes, twice at the last product (cost.py)
            product = torch.kron(product, factor)
        return torch.sign(self.signs)[:, None] * product


@dataclass(frozen=True)
class Dense:
    """A learned orthogonal matrix (SpinQuant's R1: torch/spinquant.py), applied as one product; `right` as
    Kronecker's."""

    matrix: torch.Tensor  # float32 [n, n]

    @property
    def width(self) -> int:
        """n."""
        return self.matrix.shape[0]

    def right(self, rows: torch.Tensor) -> torch.Tensor:
        """rows · Q, float32, over the last axis (any leading shape)."""
        lead = rows.shape[:-1]
        return (rows.reshape(-1, self.width).float() @ self.matrix.to(rows.device)).reshape(*lead, -1)


@dataclass(frozen=True)
class Rotation:
    """R1's Q = diag(s)·H/√n (H a Kronecker product of small Hadamard factors, float32) and R2's dense H of the
    head width (None: values not rotated), drawn from a seed; `base`: the decoder's prefix in the checkpoint. A
    learned rotation (SpinQuant) has a dense Q and one H per layer (`layer_heads`, by layer number)."""

    q: Kronecker | Dense
    h: torch.Tensor | None
    base: str = "model"
    down: Kronecker | None = None  # R4's D, applied online (None: no online rotation)
    block: int | None = None  # Q and D block-diagonal with blocks of this order (None: each the whole width)
    layer_heads: tuple[torch.Tensor, ...] | None = None  # learned: layer n's values turned by layer_heads[n]
    # R4 alone (`transform smoothquant { online r4 }`): nothing is turned as it is read (the checkpoint gains D's
    # entry); the smoothing folds first, then turns each down projection (torch/smoother.py `_turn_down`)
    after_fold: bool = False

    @classmethod
    def seeded(cls, hidden: int, head_dim: int | None, seed: int = 0, base: str = "model",
               down: int | None = None, block: int | None = None) -> Rotation:
        """Q from `seed`, H from `seed + 1` (R2 where `head_dim` is given), D from `seed + 2` (R4 where `down`, the
        intermediate width, is given); with `block`, Q and D are block-diagonal, one randomized Hadamard of that
        order repeated along the width (R2 keeps the head width)."""
        h = torch.from_numpy(random_hadamard(head_dim, seed + 1)).float() if head_dim else None
        return cls(Kronecker.seeded(block or hidden, seed), h, base,
                   Kronecker.seeded(block or down, seed + 2) if down else None, block)

    @classmethod
    def online_only(cls, down: int, seed: int = 0) -> Rotation:
        """R4 alone, of the down projections' input width: D as `seeded` draws it (no Q or H is applied)."""
        return cls(Kronecker.seeded(1, seed), None, down=Kronecker.seeded(down, seed + 2), after_fold=True)

    def right(self, rows: torch.Tensor) -> torch.Tensor:
        """rows · Q, float32: each factor applied along its axis of the rows reshaped (n·Σf products a row; a
        block-diagonal Q turns each block of the row alike)."""
        return self.q.right(rows)

    def left_transposed(self, cols: torch.Tensor) -> torch.Tensor:
        """Qᵀ · cols, float32."""
        return self.right(cols.T).T

    def touches(self, key: str) -> bool:
        """Whether `tensor` gives a rotated form of `key` (without reading anything)."""
        if self.after_fold:
            return self.down is not None and key.endswith(ONLINE_WEIGHT)
        if key == HEAD or any(p.match(key) for p in (_READERS, _WRITERS, _NORMS, _EMBED)):
            return True
        if self.down is not None and key.endswith(ONLINE_WEIGHT):
            return True
        return (self.h is not None or self.layer_heads is not None) and _VALUE_BIAS.match(key) is not None

    def tensor(self, key: str, read, stored: Container[str]) -> torch.Tensor | None:
        """The rotated form of checkpoint tensor `key` (`read(name)` gives any checkpoint tensor; `stored`: the
        names the checkpoint has), or None where the rotation leaves it as it is. `lm_head.weight` is given
        also for a tied checkpoint, which stores none: the final norm folds into the head alone."""
        if self.after_fold:
            return self.down.stored() if self.down is not None and key.endswith(ONLINE_WEIGHT) else None
        if key == HEAD:
            source = read(HEAD) if HEAD in stored else read(f"{self.base}.embed_tokens.weight")
            return _rows_times(source, read(f"{self.base}.norm.weight"), self)
        if (m := _READERS.match(key)) is not None:
            norm = "input_layernorm" if m["part"].startswith("self_attn") else "post_attention_layernorm"
            rotated = _rows_times(read(key), read(f"{m['base']}.layers.{m['n']}.{norm}.weight"), self)
            return self._values(rotated, self.head(int(m["n"]))) if m["part"] == "self_attn.v_proj" else rotated
        if (m := _WRITERS.match(key)) is not None:
            tensor = read(key)
            if m["kind"] == "bias":
                return self.right(tensor.float()[None, :])[0].to(tensor.dtype)
            heads = self.head(int(m["n"])) if m["part"] == "self_attn.o_proj" else None
            written = _stream_written(tensor, self, heads)
            if m["part"] == "mlp.down_proj" and self.down is not None:
                return _rows_times(written, None, self.down)
            return written
        if (m := _VALUE_BIAS.match(key)) is not None:
            heads = self.head(int(m["n"]))
            return self._values(read(key), heads) if heads is not None else None
        if _NORMS.match(key) is not None:
            return torch.ones_like(read(key))
        if _EMBED.match(key) is not None:
            return _rows_times(read(key), None, self)
        if self.down is not None and key.endswith(ONLINE_WEIGHT):
            return self.down.stored()
        return None

    def head(self, layer: int) -> torch.Tensor | None:
        """The H that turns layer `layer`'s values (R2), None where values are not rotated."""
        return self.layer_heads[layer] if self.layer_heads is not None else self.h

    @staticmethod
    def _values(rotated: torch.Tensor, h: torch.Tensor | None) -> torch.Tensor:
        """v_proj's rows (or bias) of each head by Hᵀ (R2)."""
        if h is None:
            return rotated
        d = h.shape[0]
        if rotated.dim() == 1:
            return (rotated.float().reshape(-1, d) @ h).reshape(-1).to(rotated.dtype)
        rows = rotated.float().reshape(-1, d, rotated.shape[1])
        return torch.einsum("ji,kjc->kic", h, rows).reshape(rotated.shape).to(rotated.dtype)


def _rows_times(weight: torch.Tensor, gamma: torch.Tensor | None, rotation: Rotation | Kronecker) -> torch.Tensor:
    """A tensor reading the stream (or the embeddings): its input columns scaled by the norm before it (folded
    in), then · Q (or a down projection's · D); a slice of rows at a time, in the weight's dtype."""
    out = torch.empty_like(weight)
    scale = gamma.float()[None, :] if gamma is not None else None
    for first in range(0, weight.shape[0], SLICE):
        rows = weight[first:first + SLICE].float()
        out[first:first + SLICE] = rotation.right(rows * scale if scale is not None else rows).to(weight.dtype)
    return out


def _stream_written(weight: torch.Tensor, rotation: Rotation, heads: torch.Tensor | None) -> torch.Tensor:
    """A layer writing the stream: Qᵀ · W, a slice of columns at a time; o_proj's columns of each head then · H
    (R2)."""
    out = torch.empty_like(weight)
    step = SLICE - SLICE % heads.shape[0] if heads is not None else SLICE  # whole heads in each slice
    for first in range(0, weight.shape[1], step):
        cols = rotation.left_transposed(weight[:, first:first + step].float())
        if heads is not None:
            cols = (cols.reshape(cols.shape[0], -1, heads.shape[0]) @ heads).reshape(cols.shape)
        out[:, first:first + step] = cols.to(weight.dtype)
    return out


class RotatedShards(DerivedShards):
    """A checkpoint's tensors as the rotation leaves them (the `Shards` a TorchModel reads: torch/shards.py),
    each computed as it is read from its own bytes and its norm's: materializing, rounding file to file and the
    output's copies all see the rotated model, and nothing of it is held. A tied checkpoint gains an untied
    `lm_head.weight` (its entry the embeddings' bytes, rotated on read)."""

    def __init__(self, inner, rotation: Rotation):
        self.rotation = rotation
        entries = dict(inner.entries)
        embed = f"{rotation.base}.embed_tokens.weight"
        if HEAD not in entries and embed in entries and not rotation.after_fold:
            entries[HEAD] = entries[embed]
        if rotation.down is not None:  # D once, under the first down projection (llm-compressor's layout)
            downs = [k for k in entries if _WRITERS.match(k) and k.endswith(".mlp.down_proj.weight")]
            first = min(downs, key=lambda k: int(_WRITERS.match(k)["n"]), default=None)  # type: ignore[index]
            if first is not None:
                n, entry = rotation.down.width, entries[first]
                entries[first.removesuffix(".weight") + f".{ONLINE_DOWN}_input.weight"] = Entry(
                    entry.file, entry.dtype, (n, n), entry.start, entry.start)
        super().__init__(inner, entries, frozenset(name for name in entries if rotation.touches(name)))

    def derive(self, name: str) -> torch.Tensor:
        """A tensor the rotation touches, rotated (a rotated row of o/down mixes the whole tensor's rows: whole)."""
        rotated = self.rotation.tensor(name, self.inner.read, self.inner.entries)
        assert rotated is not None  # `touches` says which tensors it gives
        return rotated


# ---- R4 as the model runs -----------------------------------------------------------------------------------
def rotate_input_first(module: nn.Module, turn) -> None:
    """A forward pre-hook giving `module` `turn(x)` for its input x, first among its hooks now and after any hook
    prepended later (`online_first`): what the layer's input quantizer, GPTQ's statistics and the attribution read
    is the rotated input."""
    def hook(_module, args):
        return (turn(args[0]), *args[1:])
    hook.qrc_online_rotation = True  # type: ignore[attr-defined]  # kept first by `online_first`
    module.register_forward_pre_hook(hook, prepend=True)


def turn_input(module: nn.Module, rotation: Kronecker) -> None:
    """x·D for `module`'s input x (computed in float32, given back in x's dtype), first among its hooks."""
    rotate_input_first(module, lambda x: rotation.right(x.float()).to(x.dtype))


def attach_online(module: nn.Module, rotation: Kronecker) -> int:
    """x·D before every down projection of `module` (`turn_input`); the count."""
    count = 0
    for name, sub in module.named_modules():
        if name.endswith("mlp.down_proj"):
            turn_input(sub, rotation)
            count += 1
    return count


def online_first(module: nn.Module) -> None:
    """After a hook was prepended to `module`: the online rotation's hook first again (a hook reading the raw
    input reads it rotated, as the layer's weight expects)."""
    hooks = cast("OrderedDict[int, Any]", module._forward_pre_hooks)  # an OrderedDict in torch
    for key in [k for k, h in hooks.items() if getattr(h, "qrc_online_rotation", False)]:
        hooks.move_to_end(key, last=False)


def transform_config(rotation: Rotation | None) -> dict | None:
    """`quantization_config.transform_config` of a folder whose down projections read online-rotated inputs (None
    without): compressed-tensors' TransformConfig with one `random-hadamard` group of the input location, as
    llm-compressor's SpinQuantModifier names R4. Its other half (`weight_input`, inverse) is already folded into
    the weights here and is left out: vLLM reads only the online locations, and compressed-tensors'
    `apply_transform_config` would fold it a second time."""
    if rotation is None or rotation.down is None:
        return None
    online = {"targets": ["re:.*mlp.down_proj$"], "location": "input", "inverse": False, "ignore": []}
    # compressed-tensors calls a block-diagonal transform's block `head_dim`
    return {"config_groups": {ONLINE_DOWN: {"type": "random-hadamard", "apply": [online], "randomize": False,
                                            "requires_grad": False, "head_dim": rotation.block,
                                            "precision": "torch.float32"}}}
