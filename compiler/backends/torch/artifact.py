"""The emitted folder as its users load it, block by block: what `verify` measures on the torch backend.

transformers loads a compressed-tensors folder by building the model, applying the folder's
`quantization_config` with compressed-tensors (`apply_quantization_config`, then `compress_model` for the
packed layouts), reading the checkpoint's tensors into those modules, and letting compressed-tensors
decompress them (`decompress_module`) and quantize activations in its wrapped forward. qrc does the same
steps with the same library calls, on the staged folder's own config and bytes, but reads one block's
tensors at a time and drops them again, so verification stays within the plan's memory: transformers'
`from_pretrained` reads the whole model at once.

Where transformers builds a parameter from several checkpoint tensors (MoE experts, fused into 3-D
parameters at load time, decompressed by its `dequantize` conversion and run without activation
quantization), the skeleton keeps qrc's per-expert layers (checkpoint_names.adapt) and each expert's
weight is the one compressed-tensors decompresses from the folder's tensors, under the config group whose
targets name it. That transformers' own loader maps every key of the folder to its modules is checked
before this runs (load_check.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from compiler.backends import BackendError
from compiler.backends.torch import checkpoint_names
from compiler.backends.torch.compressed_source import decompressed
from compiler.backends.torch.model import TorchModel, hf_skeleton
from compiler.backends.torch.shards import Shards
from compiler.diagnostics import error
from compiler.source import Span


def can_verify_artifact(model: TorchModel) -> bool:
    """Whether the emitted folder can be loaded for verification: an HF folder (a built-in's output has no
    loader outside qrc) and compressed-tensors, the library that decodes it, importable."""
    if model.folder is None:
        return False
    try:
        import compressed_tensors  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass
class ArtifactModel:
    """The staged folder's model skeleton (compressed-tensors' layout on the meta device) and where each
    parameter's tensor is in the folder."""

    module: nn.Module
    shards: Shards
    container: str
    blocks: tuple[str, ...]
    prefixes: dict[str, str]  # module name → its tensors' prefix in the folder
    twins: dict[str, str]  # parameter name → the source checkpoint's tensor (tied parameters stored once)
    groups: list  # compressed-tensors config groups (QuantizationScheme), for modules it did not attach to
    config_format: str | None
    ignore: list[str]
    accepts_use_cache: bool
    _meta: dict[str, tuple[dict, object]] = field(default_factory=dict)  # module → its meta parameters, status
    _resident: set[str] = field(default_factory=set)

    def block_modules(self) -> nn.ModuleList:
        """The ModuleList of blocks."""
        found = self.module.get_submodule(self.container)
        assert isinstance(found, nn.ModuleList)
        return found

    def owners(self, prefix: str | None) -> list[str]:
        """Modules holding parameters of their own under `prefix` (None: outside the blocks, "": all)."""
        inside = self.container + "."
        if prefix == "":
            return list(self._meta)
        if prefix is None:
            return [m for m in self._meta if not m.startswith(inside)]
        return [m for m in self._meta if m.startswith(prefix + ".")]

    def load(self, names: list[str], device: torch.device | str = "cpu") -> None:
        """Read these modules' tensors from the folder and decompress what compressed-tensors quantized."""
        for name in names:
            if name in self._resident:
                continue
            module = self.module.get_submodule(name)
            for leaf, meta in self._meta[name][0].items():
                if meta is None:
                    continue
                loaded = nn.Parameter(self._read(name, leaf).to(device), requires_grad=False)
                module._parameters[leaf] = loaded
                if loaded.shape != meta.shape:
                    raise BackendError(error("Q428", f"`{self.prefixes.get(name, name)}.{leaf}` in the emitted folder "
                                             f"has shape {tuple(loaded.shape)}, the model "
                                             f"{tuple(meta.shape)}", None, "wrong shape", help=_BUG))
            self._decompress(name, module, device)
            self._resident.add(name)

    def release(self, names: list[str]) -> None:
        """Back to the meta device, in compressed-tensors' compressed layout, ready to be read again."""
        for name in names:
            if name not in self._resident:
                continue
            module = self.module.get_submodule(name)
            params, status = self._meta[name]
            module._parameters.clear()
            module._parameters.update(params)
            if status is not None:
                setattr(module, "quantization_status", status)  # noqa: B010  # compressed-tensors' attribute
            self._resident.discard(name)

    @contextmanager
    def read_on_use(self, names: list[str]) -> Iterator[None]:
        """These modules are read when they first run, and released at the end (what runs before the first
        block is not known from module order alone)."""
        def hook(module, args, kwargs):
            self.load([module_names[id(module)]])
        module_names = {id(self.module.get_submodule(n)): n for n in names}
        handles = [self.module.get_submodule(n).register_forward_pre_hook(hook, with_kwargs=True) for n in names]
        # read now: the first module to run, and some models read its weight's device before it runs (Llama 4:
        # `input_ids.to(embed_tokens.weight.device)` would send the ids to the meta device)
        self.load([n for n in names if isinstance(self.module.get_submodule(n), nn.Embedding)])
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()
            self.release(names)

    def forward(self, feed: dict) -> torch.Tensor:
        """The model's first output for one chunk."""
        kwargs = dict(feed)
        if self.accepts_use_cache:
            kwargs["use_cache"] = False
        with torch.no_grad():
            out = self.module(**kwargs)
        return out[0] if isinstance(out, (tuple, list)) or hasattr(out, "to_tuple") else out

    # ---- reading ----------------------------------------------------------------------------------
    def _key(self, name: str, leaf: str) -> str:
        key = f"{self.prefixes.get(name, name)}.{leaf}"
        if key in self.shards:
            return key
        twin = self.twins.get(f"{name}.{leaf}")  # a tied parameter: the tensor it shares
        if twin is not None and twin in self.shards:
            return twin
        raise BackendError(error("Q428", f"the emitted folder has no tensor `{key}` for `{name}.{leaf}`", None,
                                 "missing tensor", help=_BUG))

    def _read(self, name: str, leaf: str) -> torch.Tensor:
        if leaf == "weight" and self._unattached_compressed(name):
            return self._dequantized(name)
        tensor = self.shards.read(self._key(name, leaf))
        if tensor.is_floating_point() and tensor.element_size() > 1:
            tensor = tensor.float()  # computed in float32 on CPU, as qrc's float reference is
        return tensor

    def _unattached_compressed(self, name: str) -> bool:
        """A layer compressed-tensors did not attach to (per-expert layers transformers fuses at load) whose
        folder tensors are compressed."""
        module = self.module.get_submodule(name)
        prefix = self.prefixes.get(name, name)
        return (getattr(module, "quantization_scheme", None) is None and f"{prefix}.weight_scale" in self.shards)

    def _dequantized(self, name: str) -> torch.Tensor:
        """compressed-tensors' decompression of one layer's folder tensors, under the config group whose
        targets name the layer in the folder (what transformers' `dequantize` conversion computes)."""
        from compressed_tensors.utils.match import match_name

        prefix = self.prefixes.get(name, name)
        scheme = next((g for g in self.groups if any(match_name(prefix, t) for t in g.targets)), None)
        if scheme is None or any(match_name(prefix, t) for t in self.ignore):
            raise BackendError(error("Q428", f"`{prefix}` is stored compressed in the emitted folder but no config "
                                     "group of its quantization_config names it", None, "unnamed layer", help=_BUG))
        return decompressed(self.shards.read, prefix, self.shards.__contains__, scheme,
                            str(scheme.format or self.config_format))

    def _decompress(self, name: str, module: nn.Module, device) -> None:
        from compressed_tensors.compressors.base import decompress_module
        from compressed_tensors.quantization import QuantizationStatus

        if getattr(module, "quantization_status", None) == QuantizationStatus.COMPRESSED:
            decompress_module(module)
            # computed in float32 on CPU, as qrc's float reference is: compressed-tensors 0.20 decompresses
            # NVFP4 weights to bfloat16, which its forward then multiplies with a float32 model's inputs and
            # fails (transformers' default load of a float32 NVFP4 folder; vLLM and `dequantize=True` load it)
            for leaf, param in list(module._parameters.items()):
                if param is not None and param.is_floating_point() and param.element_size() > 1:
                    module._parameters[leaf] = nn.Parameter(param.to(device, torch.float32), requires_grad=False)


_BUG = ("a qrc bug: the folder and its quantization_config disagree; please report it with the recipe. "
        "Nothing was written to the destination")


def open_artifact(staged: Path, source: TorchModel, span: Span | None) -> ArtifactModel:
    """The staged folder's skeleton as transformers builds it for a compressed-tensors checkpoint (the
    config groups applied, the packed layout made), parameters on the meta device."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import apply_quantization_config

    config = json.loads((staged / "config.json").read_text(encoding="utf-8"))
    quantization = config.get("quantization_config") or {}
    try:
        module = hf_skeleton(staged, span)
        checkpoint_names.adapt(module, str(staged), span)  # qrc's per-expert layers, as in the source skeleton
        from transformers import CompressedTensorsConfig

        hf_config = CompressedTensorsConfig.from_dict(quantization)  # what transformers reads config.json into
        compressor = ModelCompressor.from_compression_config(hf_config)
        if compressor.quantization_config is not None:
            apply_quantization_config(module, compressor.quantization_config, run_compressed=False,
                                      show_progress=False)  # its tqdm bar would print between qrc's rows
            if hf_config.is_quantization_compressed:
                compressor.compress_model(module)
            compressor.remove_decompression_hook(module)  # blocks are decompressed as they are read
    except BackendError:
        raise
    except Exception as exc:  # compressed-tensors refuses the folder's quantization_config
        raise BackendError(error("Q428", f"compressed-tensors cannot apply the emitted folder's quantization_config "
                                 f"({type(exc).__name__}: {str(exc).strip()[:160]})", span, "does not load",
                                 help=_BUG)) from None
    ct_config = compressor.quantization_config
    groups = list(ct_config.config_groups.values()) if ct_config is not None else []
    artifact = ArtifactModel(module.eval(), Shards(staged), source.container, source.blocks,
                             _prefixes(source.keys), dict(source.keys), groups,
                             getattr(ct_config, "format", None), list(getattr(ct_config, "ignore", None) or []),
                             source.accepts_use_cache)
    for name, sub in module.named_modules():
        if any(p is not None for p in sub._parameters.values()):  # (a Linear without bias has `bias: None`)
            artifact._meta[name] = (dict(sub._parameters), getattr(sub, "quantization_status", None))
    _online_transforms(artifact, quantization.get("transform_config"), span)
    return artifact


def _online_transforms(artifact: ArtifactModel, config: dict | None, span: Span | None) -> None:
    """The folder's online input transforms (`transform_config`, torch/rotation.py's R4) as its runtime applies
    them: compressed-tensors' own HadamardTransform of each group, with the matrix the folder stores (under the
    first module it names; vLLM shares it across them), as a pre-hook on every module the group targets.
    transformers' loader skips this step (rotation_check.NOT_IN_TRANSFORMERS); qrc runs it so that `verify`
    measures the folder as a runtime that applies its transform_config computes it (vLLM on a GPU, by its rules).
    An online location other than a Linear's input is Q428."""
    if not config:
        return
    from compressed_tensors.transform import TransformConfig, TransformLocation
    from compressed_tensors.transform.factory.hadamard import HadamardTransform
    from compressed_tensors.utils import match_named_modules

    from compiler.backends.torch.rotation import rotate_input_first

    parsed = TransformConfig.model_validate(config)
    for group, scheme in parsed.config_groups.items():
        for args in scheme.apply:
            if not args.is_online():
                continue
            if TransformLocation(args.location) is not TransformLocation.INPUT:
                raise BackendError(error("Q428", f"the emitted folder's transform `{group}` is applied at "
                                         f"`{args.location}`, which qrc does not run", span, "not verifiable",
                                         help=_BUG))
            targets = list(match_named_modules(artifact.module, args.targets, args.ignore))
            stored = next((artifact.shards.read(key) for name, _ in targets
                           if (key := f"{artifact.prefixes.get(name, name)}.{group}_input.weight") in artifact.shards),
                          None)
            if stored is None:
                raise BackendError(error("Q428", f"the emitted folder has no matrix for its transform `{group}`",
                                         span, "missing tensor", help=_BUG))
            weight = nn.Parameter(stored.to(scheme.precision), requires_grad=False)
            for _name, target in targets:
                rotate_input_first(target, HadamardTransform(weight, None, scheme, args, type(target)))


def _prefixes(keys: dict[str, str]) -> dict[str, str]:
    """Module name → the prefix of its tensors in the checkpoint, from the source's parameter → tensor
    names (the emitted folder keeps the source's names): each parameter's module and its ancestors, as far
    as the two names end alike (`model.language_model.layers.0.mlp` → `language_model.model.layers.0.mlp`)."""
    out: dict[str, str] = {}
    for param, key in keys.items():
        p, k = param.split("."), key.split(".")
        if p[-1] != k[-1]:
            continue
        shared = 0
        while shared < min(len(p), len(k)) and p[-1 - shared] == k[-1 - shared]:
            shared += 1
        for cut in range(1, shared):
            out.setdefault(".".join(p[:-cut]), ".".join(k[:-cut]))
    return out
