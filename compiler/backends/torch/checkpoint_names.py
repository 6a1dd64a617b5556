"""Checkpoint tensor names ↔ the module's parameter names, as transformers loads them.

A checkpoint does not always use the module's names: LLaVA-style folders store `language_model.model.*`
where transformers 5 builds `model.language_model.*`, Mixtral stores `block_sparse_moe.experts.3.w1`
where the module has `mlp.experts.gate_up_proj`. transformers registers those renamings and conversions
per family (`conversion_mapping`); qrc applies the same ones, so the index (checkpoint names, what
`qrc inspect` lists and recipes select) and the running module always mean the same tensor."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from compiler.backends import BackendError
from compiler.backends.torch.experts import expert_names, fused_experts, gguf_expert_names, split_experts, unsupported
from compiler.diagnostics import error
from compiler.source import Span


def adapt(module: nn.Module, ref: str, span: Span | None, experts_split: bool = False) -> list:
    """transformers' renamings for this model; its fused MoE experts split into per-expert Linears first
    (the layouts transformers' converters describe, from a per-expert checkpoint; `experts_split`: gpt-oss's,
    which the index splits for a GGUF output), kept fused where the checkpoint stores them fused too, anything
    else refused with Q411."""
    renamings, converters = _conversions(module)
    _as_loaded_quantized(module)
    fused = fused_experts(module)
    names = expert_names(converters) if fused else None
    if fused and names is None and experts_split:
        names = gguf_expert_names(fused[0][1])
    if fused and names is None:  # the checkpoint stores them fused as well (Gemma 4): they run as they are,
        return renamings  # in float (Q266 at check); a checkpoint without those tensors is Q404 when read
    if fused:
        problem = unsupported(fused[0][1], names)
        if problem:
            raise BackendError(error("Q411", f"`{ref}`: the MoE experts `{fused[0][0]}` ({type(fused[0][1]).__name__}) "
                                     f"cannot be split into per-expert layers: {problem}", span, "MoE layout not supported",
                                     help="data-free rounding without `verify` compiles it file to file (W4A16 with rtn)"))
        assert names is not None  # fused experts with names: the checkpoint stores them per expert
        split_experts(module, names)
    return renamings


def _as_loaded_quantized(module: nn.Module) -> None:
    """Swap in the modules transformers swaps in when it opens a compressed-tensors folder of this model (Llama 4's
    fused experts become `SequentialLlama4TextExperts`, one Linear per expert: transformers' own table and class,
    which compute what the fused module computes), so qrc runs, rounds and writes the layers that load. The
    checkpoint reads their weights as slices of the fused tensors (torch/expert_shards.py)."""
    try:
        from transformers.quantizers.base import MODULES_TO_PATCH_FOR_QUANTIZATION
    except ImportError:  # a transformers without the table patches nothing
        return
    config = getattr(module, "config", None)
    for name, child in list(module.named_modules()):
        patch: dict[str, Any] | None = MODULES_TO_PATCH_FOR_QUANTIZATION.get(type(child).__name__)
        if patch is None or config is None or "compressed-tensors" not in [str(getattr(m, "value", m))
                                                                          for m in patch["quantization_methods"]]:
            continue
        owner, _, leaf = name.rpartition(".")
        with torch.device("meta"):
            experts = patch["module_name"](config.get_text_config())
        # every token reaches every expert, those the router did not choose scaled to zero (Llama 4 weighs the
        # experts' inputs by the router's scores): statistics count the rows that are not all zero (layers.py)
        for linear in experts.modules():
            if isinstance(linear, nn.Linear):
                linear.__dict__["unrouted_rows_zero"] = True  # a plain attribute, not a submodule
        setattr(module.get_submodule(owner) if owner else module, leaf, experts)


def _conversions(module: nn.Module) -> tuple[list, list]:
    """(renamings, converters) transformers applies when it loads this model's checkpoint."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming
    except ImportError:  # transformers before 5 renames through `_checkpoint_conversion_mapping` only
        mapping = getattr(module, "_checkpoint_conversion_mapping", None) or {}
        return [_Legacy(k, v) for k, v in mapping.items()], []
    transforms = get_model_conversion_mapping(module)
    return ([t for t in transforms if isinstance(t, WeightRenaming)],
            [t for t in transforms if isinstance(t, WeightConverter)])


class _Legacy:
    """A transformers 4 `_checkpoint_conversion_mapping` entry (regex → replacement)."""

    def __init__(self, pattern: str, replacement: str):
        import re

        self.regex, self.replacement = re.compile(pattern), replacement

    def rename_source_key(self, key: str) -> tuple[str, str | None]:
        """Rename `key` as transformers 4 would."""
        new = self.regex.sub(self.replacement, key, count=1)
        return new, (self.regex.pattern if new != key else None)


def module_names(module: nn.Module, keys: list[str], renamings: list) -> dict[str, str]:
    """Module parameter name → checkpoint tensor name, for every checkpoint tensor that transformers'
    renamings (and its base-model prefix rule) turn into a parameter of `module`."""
    params = {name: True for name, _ in module.named_parameters(remove_duplicate=False)}
    prefix = getattr(module, "base_model_prefix", "") or ""
    out: dict[str, str] = {}
    for key in keys:
        name = key
        for renaming in renamings:
            name, _ = renaming.rename_source_key(name)
        if name not in params and prefix:  # a base model's checkpoint in a head model, or the reverse
            name = _with_prefix(name, prefix, params)
        if name in params:
            out.setdefault(name, key)
    return out


def _with_prefix(name: str, prefix: str, params: dict) -> str:
    stripped = name.removeprefix(prefix + ".")
    if stripped != name and stripped in params:
        return stripped
    return f"{prefix}.{name}" if f"{prefix}.{name}" in params else name


def module_block(block: str, keys: dict[str, str]) -> str:
    """The module path of an index block (`language_model.model.layers.0` → `model.language_model.layers.0`):
    the parameter whose checkpoint tensor lies under the block, with the same tail."""
    for param, key in keys.items():
        if key.startswith(block + "."):
            tail = key[len(block):]
            if param.endswith(tail):
                return param[: len(param) - len(tail)]
    return block
