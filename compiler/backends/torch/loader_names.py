"""The names `quantization_config` gives its layers, so that every loader attaches the quantization.

compressed-tensors matches `targets` and `ignore` against the module names of the model being loaded, and
those differ by loader: the checkpoint says `language_model.model.layers.0.mlp.down_proj`, transformers'
task class (`LlavaForConditionalGeneration`) builds `model.language_model.layers.0.mlp.down_proj`, its base
class (`AutoModel`, what sentence-transformers and embedding users load) drops the `model.` prefix, and
vLLM maps transformers' names to its own with a per-family prefix mapper (which leaves `re:` patterns alone).
A name that matches no module leaves its layer unquantized while its packed tensors are unexpected keys:
the model loads with random weights and nothing fails.

So the config uses forms every loader matches:
- one scheme on every quantized Linear (a plain `type Linear -> …` recipe): llm-compressor's form, the
  class target `Linear` and an ignore list of every other Linear of the task class, each under its task
  name and its base-class name (an ignore entry that matches nothing is harmless; a target is warned);
- otherwise each layer by name, as a pattern with the base prefix optional
  (`re:^(?:(?:model\\.)?layers\\.0\\.mlp\\.down_proj)$`: the task class, the base class and vLLM's dense
  decoders match it) and, where transformers renamed the checkpoint's name (a VLM), that name as a second
  alternative (vLLM keeps it for its VLMs, and leaves `re:` targets unmapped); an expert projection keeps
  the checkpoint's name (transformers fuses experts into 3-D parameters, so no module carries that name in
  any loader; vLLM reads the checkpoint's). A file-to-file run builds no model: its layers are named by
  their checkpoint names with the prefix of the class config.json names made optional.
  Layers that differ only in their indices (`layers.0.mlp.down_proj` … `layers.27.mlp.down_proj`) share one
  pattern with `\\d+` in place of the indices when every layer of that form is in the same group (or every
  one is ignored): one target a projection, not one a layer. Loaders match every module against every
  target, and Python's regex cache holds 512 patterns: a target a layer made transformers' meta-device load
  of a 28-block Llama 2.2 s against 1.1, and grows with the layers times the targets (MoE experts).

Before the folder goes into place, load_check.py has transformers open it on the meta device with both
classes: a name that matches wrongly is Q426 there, not a model that loads with random weights."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from torch import nn

from compiler.backends.torch.check_process import architecture_of, class_prefix
from compiler.backends.torch.experts import Experts
from compiler.backends.torch.model import TorchModel


@dataclass(frozen=True)
class LoaderNames:
    """How `quantization_config` names layers for this model."""
    targets: dict[str, str]  # checkpoint layer name → the target string of its group (`Linear`: the class)
    ignore: tuple[str, ...]


def loader_names(model: TorchModel, quantized: dict[str, str], floating: list[str], groups: dict[str, str],
                 layers: Iterable[str], provisional: bool = False) -> LoaderNames:
    """Targets and ignore list for `quantized` (checkpoint layer name → its module in the task class) and the
    Linear layers left `floating` (checkpoint names); `groups` gives each quantized layer's config group,
    `layers` every layer of the model (any kind: a pattern for many is made only where it matches none
    outside them). `provisional`: without importing the class here (the names may lack its base-model prefix:
    for checking the config's form early; a file-to-file run makes the output's again once its check process
    reported the prefix)."""
    schemes = len(set(groups.values()))
    root = model.module
    prefix = class_prefix(type(root)) or _class_prefix(model.config, wait=not provisional) or ""
    in_experts = _expert_modules(root)
    modules = {name: m for name, m in root.named_modules()}
    # the class form needs the model's own module tree (a file-to-file run has a stand-in without Linears):
    # only then does the ignore list name every other Linear the loader will build
    whole_tree = all(isinstance(modules.get(m), nn.Linear) for m in quantized.values())
    if schemes == 1 and not in_experts and whole_tree:
        chosen = set(quantized.values())
        others = [name for name, m in modules.items() if isinstance(m, nn.Linear) and name not in chosen]
        forms = {form for name in others for form in _forms(name, prefix)}
        return LoaderNames({name: "Linear" for name in quantized}, tuple(sorted(forms)))
    every = {*layers, *quantized, *floating}
    targets = {name: _named(name, module, prefix, modules, in_experts) for name, module in quantized.items()}
    ignored = {name: _named(name, _module_of(model, name) or name, prefix, modules, in_experts) for name in floating}
    shared = _shared({k: v for k, v in targets.items() if quantized[k] not in in_experts}, groups, every)
    return LoaderNames({**targets, **shared}, tuple(sorted(set(_shared(ignored, {}, every).values()))))


_NAME_INDEX = re.compile(r"(?<=\.)\d+(?=\.)")  # an index between two dots of a layer's name
_PATTERN_INDEX = re.compile(r"(?<=\\\.)\d+(?=\\\.)")  # the same in its pattern (the dots escaped)


def _shared(named: dict[str, str], groups: dict[str, str], every: set[str]) -> dict[str, str]:
    """`named` (layer → its target) with one pattern for the layers of a form (their name with each index
    replaced) where every layer of that form in `every` is in `named`, in one of `groups` (all in none when
    it is empty), and their targets differ only in those indices."""
    forms: dict[str, list[str]] = {}
    for name in every:
        forms.setdefault(_NAME_INDEX.sub("#", name), []).append(name)
    shared = dict(named)
    for members in forms.values():
        if len(members) < 2 or any(m not in named for m in members) or len({groups.get(m) for m in members}) > 1:
            continue
        patterns = {_PATTERN_INDEX.sub(r"\\d+", _as_pattern(named[m])) for m in members}
        if len(patterns) == 1:
            shared.update(dict.fromkeys(members, patterns.pop()))
    return shared


def _as_pattern(target: str) -> str:
    """A target as a `re:` pattern matching what it matches (a plain name: itself only)."""
    return target if target.startswith("re:") else f"re:^(?:{re.escape(target)})$"


def _named(checkpoint: str, module: str, prefix: str, modules: dict, in_experts: set[str]) -> str:
    if module in in_experts:
        return checkpoint
    if module not in modules:  # no module tree (a file-to-file run): the checkpoint names the module
        module = checkpoint
    if not prefix and checkpoint == module:  # one naming for every loader (qrc's built-ins)
        return module
    rest = _without_prefix(module, prefix)
    pattern = f"(?:{re.escape(prefix)}\\.)?{re.escape(rest)}" if prefix else re.escape(rest)
    if checkpoint not in (module, rest):  # renamed by transformers' conversion (a VLM): loaders that keep the
        pattern += "|" + re.escape(checkpoint)  # checkpoint's names (vLLM's VLMs) match that alternative
    return f"re:^(?:{pattern})$"


_PREFIXES: dict[str, str] = {}  # architecture → the base-model prefix a check process found (check_process.py)


def record_class_prefix(config: dict, prefix: str) -> None:
    """The base-model prefix of the class config.json names, as found in another process (a file-to-file
    run's check process imports transformers so that this one does not)."""
    name = architecture_of(config)
    if name:
        _PREFIXES[name] = prefix


def _class_prefix(config: dict, wait: bool = True) -> str | None:
    """The base-model prefix of the class config.json names (a file-to-file run builds no model; the class
    attribute is read without building one). Not `wait`: None unless a check process reported it (importing
    transformers here takes seconds)."""
    name = architecture_of(config)
    if not name:
        return ""
    if name in _PREFIXES:
        return _PREFIXES[name]
    if not wait:
        return None
    return class_prefix(_model_class(name))


def _model_class(name: str):
    """transformers' class `name`, or None (transformers missing, or a class it does not have)."""
    try:
        import transformers
    except ImportError:
        return None
    return getattr(transformers, name, None)


def _without_prefix(module: str, prefix: str) -> str:
    """The name under the base model (the base class's name), or the name itself outside it (an LM head) or
    in a base class (BERT's `encoder.…`)."""
    return module[len(prefix) + 1:] if prefix and module.startswith(prefix + ".") else module


def _forms(module: str, prefix: str) -> tuple[str, ...]:
    """A module's name in the task class and in the base class (the base-model prefix dropped or added)."""
    if not prefix:
        return (module,)
    rest = _without_prefix(module, prefix)
    return (module, rest) if rest != module else (module, f"{prefix}.{module}")


def _expert_modules(root: nn.Module) -> set[str]:
    """The per-expert Linears qrc split a fused experts module into (no loader has such modules)."""
    return {f"{name}.{child}" for name, m in root.named_modules() if isinstance(m, Experts)
            for child, _ in m.named_modules() if child}


def _module_of(model: TorchModel, checkpoint_layer: str) -> str | None:
    """The task class's module that reads `<checkpoint_layer>.weight`, if any."""
    params = model.params_reading.get(checkpoint_layer + ".weight", [])
    leaf = checkpoint_layer.rpartition(".")[2]
    chosen = next((p for p in params if p.removesuffix(".weight").rpartition(".")[2] == leaf), None)
    return chosen.removesuffix(".weight") if chosen else None
