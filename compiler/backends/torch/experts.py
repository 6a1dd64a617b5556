"""Mixture-of-experts blocks with one nn.Linear per expert projection.

transformers 5 fuses a block's experts into 3-D parameters (`experts.gate_up_proj` [E, 2I, H] and
`experts.down_proj` [E, H, I]), built at load time from the checkpoint's per-expert tensors by the weight
conversions it registers for the family (`.experts.*.w1.weight` + `.experts.*.w3.weight` → gate_up_proj).
qrc rounds, calibrates and emits each expert projection as a layer of its own, under the checkpoint's
names (what vLLM and compressed-tensors read), so the fused module is replaced by per-expert Linears named
as those conversions' sources. The replacement computes what the fused module computes and applies the
gate with transformers' own `_apply_gate`; only the layouts that conversion describes exactly (stacked,
concatenated gate/up, no bias, not transposed) are replaced — anything else is refused, never guessed.
gpt-oss's experts (`GptOssExperts`: [in, out] matrices, gate and up interleaved, a bias each) are replaced too
where the output is a GGUF, whose merged expert tensors qrc writes from per-expert layers (models/expert_slices.py).

Why not keep the fused parameter and slice it: per-expert input hooks (Hessians, observers), per-expert
rounding, reading one expert's tensors from the files and releasing them all need a module per expert."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from compiler.ir.types import ExpertRouting

_FLAGS = {"has_bias": False, "is_transposed": False, "is_concatenated": True, "has_gate": True,
          "has_post_expert_norm": False}


@dataclass(frozen=True)
class ExpertNames:
    """The checkpoint's leaf names of one expert's projections (`gate_proj`/`up_proj`/`down_proj`, or
    Mixtral's `w1`/`w3`/`w2`), read from transformers' conversion of the family, and how the fused module lays
    them out."""
    gate: str
    up: str
    down: str
    transposed: bool = False  # the fused matrices are [E, in, out] (gpt-oss), not [E, out, in]
    interleaved: bool = False  # gate and up alternate along gate_up's output (gpt-oss), rather than halves
    biased: bool = False  # `gate_up_proj_bias` [E, 2I] and `down_proj_bias` [E, H] are added (gpt-oss)


# gpt-oss's experts as the GGUF writer's per-expert layers (models/expert_slices.py names them so)
GPT_OSS = ExpertNames("gate_proj", "up_proj", "down_proj", transposed=True, interleaved=True, biased=True)
_BIASES = ("gate_up_proj_bias", "down_proj_bias")


def gguf_expert_names(fused: nn.Module) -> ExpertNames | None:
    """The per-expert layers of a fused experts module that the checkpoint stores fused, where a GGUF output is
    written from them (gpt-oss's); None for any other module."""
    return GPT_OSS if type(fused).__name__ == "GptOssExperts" else None


def expert_names(converters) -> ExpertNames | None:
    """The per-expert leaf names from transformers' converters for `experts.gate_up_proj` (two sources,
    stacked then concatenated on the output dimension) and `experts.down_proj` (stacked); None when the
    family converts its experts some other way."""
    gate_up = down = None
    for converter in converters:
        targets = [t for t in converter.target_patterns if isinstance(t, str)]
        steps = [(type(op).__name__, getattr(op, "dim", None)) for op in getattr(converter, "operations", [])]
        leaves = [_leaf(s) for s in converter._original_source_patterns]
        if any(t.endswith("experts.gate_up_proj") for t in targets) and len(leaves) == 2 and \
                steps == [("MergeModulelist", 0), ("Concatenate", 1)]:
            gate_up = leaves
        elif any(t.endswith("experts.down_proj") for t in targets) and len(leaves) == 1 and \
                steps == [("MergeModulelist", 0)]:
            down = leaves[0]
    if gate_up is None or down is None:
        return None
    gate, up = gate_up
    if gate is None or up is None:
        return None
    return ExpertNames(gate, up, down)


def _leaf(pattern: str) -> str | None:
    """`.experts.*.w1.weight` → `w1`."""
    _, star, rest = pattern.partition("*.")
    leaf = rest.removesuffix(".weight")
    return leaf if star and leaf and "." not in leaf else None


def fused_experts(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """The fused expert modules of a model: a 3-D `gate_up_proj` and `down_proj`."""
    found = []
    for name, child in module.named_modules():
        params = dict(child.named_parameters(recurse=False))
        if {"gate_up_proj", "down_proj"} <= set(params) and params["gate_up_proj"].dim() == 3:
            found.append((name, child))
    return found


def unsupported(fused: nn.Module, names: ExpertNames | None = None) -> str | None:
    """Why this fused module's layout is not the stacked, concatenated one qrc splits, or the one `names` says
    (None when it is)."""
    params = {n for n, _ in fused.named_parameters(recurse=False)}
    if names is not None and names.biased:
        if params != {"gate_up_proj", "down_proj", *_BIASES}:
            return f"its parameters are {', '.join(sorted(params))}"
        return None if callable(getattr(fused, "_apply_gate", None)) else "it has no `_apply_gate`"
    if params != {"gate_up_proj", "down_proj"}:
        return f"its parameters are {', '.join(sorted(params))}"
    for flag, wanted in _FLAGS.items():
        if getattr(fused, flag, wanted) != wanted:
            return f"its `{flag}` is {not wanted}"
    if not callable(getattr(fused, "_apply_gate", None)):
        return "it has no `_apply_gate`"
    return None


class Experts(nn.Module):
    """One MoE block's experts as Linears `{e}.{gate,up,down}` (the checkpoint's leaf names), computing
    what the fused module computes: each token through the experts the router chose, weighted and summed.

    With `routing` ALL (set while statistics are gathered), every token also runs through every expert so
    each expert's hooks see data; the output still adds only the routed tokens, so the block computes the
    same thing either way. The gate and up projections then read one tensor (their statistics share one
    leader: torch/layers.py Statistics), and the down projection multiplies only the routed rows."""

    apply_gate: Callable[[torch.Tensor], torch.Tensor]

    def __init__(self, fused: nn.Module, names: ExpertNames):
        super().__init__()
        shape = tuple(fused.get_parameter("gate_up_proj").shape)
        experts, hidden, two_i = shape if names.transposed else (shape[0], shape[2], shape[1])
        inner = two_i // 2
        self.names = names
        # transformers' gate (activation of the gate half times the up half), kept without the fused
        # module's 3-D parameters being registered here
        self.__dict__["apply_gate"] = fused._apply_gate
        self.routing = ExpertRouting.ROUTED
        for bias in _BIASES if names.biased else ():  # stored fused, read as they are (the checkpoint's names)
            self.register_parameter(bias, nn.Parameter(torch.empty_like(fused.get_parameter(bias), device="meta"),
                                                       requires_grad=False))
        for e in range(experts):
            expert = nn.Module()
            for leaf, (i, o) in ((names.gate, (hidden, inner)), (names.up, (hidden, inner)),
                                 (names.down, (inner, hidden))):
                expert.add_module(leaf, nn.Linear(i, o, bias=False, device="meta"))
            self.add_module(str(e), expert)

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
        """Same signature and result as transformers' fused experts."""
        out = torch.zeros_like(hidden_states)
        every = self.routing is ExpertRouting.ALL
        for e, expert in enumerate(self.children()):
            token, slot = torch.where(top_k_index == e)
            if token.numel() == 0 and not every:
                continue
            x = hidden_states if every else hidden_states[token]
            gate_up = self._gate_up(e, getattr(expert, self.names.gate)(x), getattr(expert, self.names.up)(x))
            down = getattr(expert, self.names.down)
            y = _routed_rows(down, self.apply_gate(gate_up), token) if every else down(self.apply_gate(gate_up))
            if self.names.biased:
                y = y + self.get_parameter("down_proj_bias")[e]
            out.index_add_(0, token, (y * top_k_weights[token, slot, None]).to(out.dtype))
        return out

    def _gate_up(self, e: int, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        """The gate and up outputs as the fused module's gate_up, which `apply_gate` splits: halves, or
        interleaved; with the fused bias's part added where the module has one."""
        if self.names.biased:
            bias = self.get_parameter("gate_up_proj_bias")[e]
            half = bias.shape[0] // 2
            gate = gate + (bias[0::2] if self.names.interleaved else bias[:half])
            up = up + (bias[1::2] if self.names.interleaved else bias[half:])
        if self.names.interleaved:
            return torch.stack([gate, up], dim=-1).flatten(-2)
        return torch.cat([gate, up], dim=-1)


def _routed_rows(down: nn.Module, inner: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """down(inner[token]) with down's forward pre-hooks (statistics, observers) seeing every row of `inner`: the
    statistics take every token's input, and the block adds only the routed tokens' outputs, so the others
    are not multiplied (a third of an expert's work with `experts all`). The hook that keeps the routed rows is
    registered last, so every other pre-hook runs before it, on all of them."""
    handle = down.register_forward_pre_hook(lambda module, args: (args[0][token], *args[1:]))
    try:
        return down(inner)
    finally:
        handle.remove()


def split_experts(module: nn.Module, names: ExpertNames) -> None:
    """Replace every fused experts module of `module` by per-expert Linears (on the meta device)."""
    for name, fused in fused_experts(module):
        owner, _, leaf = name.rpartition(".")
        setattr(module.get_submodule(owner) if owner else module, leaf, Experts(fused, names))


def remove_hooks(root: nn.Module, handles: list) -> None:
    """End a calibration pass: the experts route as the model does again, and the pass's hooks go."""
    set_routing(root, ExpertRouting.ROUTED)
    for handle in handles:
        handle.remove()
    handles.clear()


def set_routing(module: nn.Module, routing: ExpertRouting) -> None:
    """Route calibration tokens through every expert (ALL) or only the chosen ones (ROUTED)."""
    for child in module.modules():
        if isinstance(child, Experts):
            child.routing = routing
