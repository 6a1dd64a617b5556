"""A model skeleton whose parameters live on the meta device, and the checkpoint its weights come from:
weights are materialised one module (one block) at a time and dropped again after use."""

from __future__ import annotations

import inspect
import json
import os
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, TypeGuard, Union

import torch
from torch import nn

from compiler.backends import BackendError
from compiler.backends.torch import checkpoint_names
from compiler.backends.torch.compressed_source import with_decompression
from compiler.backends.torch.expert_shards import with_experts
from compiler.backends.torch.gguf_shards import single_file_shards
from compiler.backends.torch.mxfp4_source import with_packed_experts
from compiler.backends.torch.shards import Shards
from compiler.diagnostics import StageError, error
from compiler.ir.types import AttentionKernel
from compiler.models import block_fp8, builtin, model_dir, resolve_path
from compiler.safe_files import own_folder
from compiler.source import Span

if TYPE_CHECKING:
    from compiler.backends.torch.rotation import Rotation

# what a model is read through: QuaRot's (hidden, head, online down, block) widths, seeded; a learned rotation as
# it is (torch/spinquant.py); or nothing
RotationSource = Union[tuple[int, int | None, int | None, int | None], "Rotation", None]


@dataclass
class TorchModel:
    """A model skeleton on the meta device and where each parameter's tensor is in the checkpoint."""
    module: nn.Module
    shards: Shards  # the safetensors files the weights come from
    keys: dict[str, str]  # parameter name in the module → tensor name in the checkpoint
    container: str  # the ModuleList of blocks, e.g. `model.layers`
    blocks: tuple[str, ...]  # `model.layers.0`, …
    dtype: torch.dtype  # the checkpoint's float dtype (kept for scales and cached hidden states)
    accepts_use_cache: bool
    config: dict  # config.json of an HF folder; for built-ins, what describes them
    folder: Path | None  # the HF folder (its other files are copied next to the output)
    span: Span | None = None  # the recipe's `model` line: where a model that fails to run is reported

    @cached_property
    def module_order(self) -> dict[str, int]:
        """Each module's position in the model's own order (the order its forward pass meets them)."""
        return {name: i for i, (name, _) in enumerate(self.module.named_modules())}

    def block_modules(self) -> nn.ModuleList:
        """The ModuleList of blocks (empty when the model has none)."""
        found = self.module.get_submodule(self.container) if self.container else nn.ModuleList()
        assert isinstance(found, nn.ModuleList)
        return found

    def outside(self) -> list[str]:
        """Parameter names outside the blocks (embeddings, final norm, heads)."""
        if not self.container:
            return list(self.keys)
        prefix = self.container + "."
        return [name for name in self.keys if not name.startswith(prefix)]

    def parameters_of(self, module_name: str) -> list[str]:
        """The parameter names of a module and its children."""
        prefix = module_name + "."
        return [name for name in self.keys if name.startswith(prefix)]

    def materialize(self, names: list[str], device: torch.device | str = "cpu") -> None:
        """Read these parameters from the checkpoint (float32 for computing on CPU, the checkpoint's dtype
        on GPUs) and put them into the module."""
        for name in names:
            twin = self._resident_twin(name, device)
            if twin is not None:  # a tied parameter (an LM head sharing the embedding): one tensor, not two
                _set(self.module, name, twin)
                continue
            tensor = self.shards.read(self.keys[name])
            if tensor.is_floating_point():
                tensor = tensor.to(torch.float32 if torch.device(device).type == "cpu" else self.dtype)
            _set(self.module, name, nn.Parameter(tensor.to(device), requires_grad=False))

    @cached_property
    def params_reading(self) -> dict[str, list[str]]:
        """Checkpoint tensor name → the parameters read from it (several for a tied tensor), in module order."""
        out: dict[str, list[str]] = {}
        for param, key in self.keys.items():
            out.setdefault(key, []).append(param)
        return out

    def _resident_twin(self, name: str, device) -> nn.Parameter | None:
        """A resident parameter read from the same checkpoint tensor on the same device, if any."""
        for other in self.params_reading[self.keys[name]]:
            if other != name and self.is_resident(other):
                param = self.module.get_parameter(other)
                if param.device == torch.device(device):
                    return param
        return None

    def release(self, names: list[str]) -> None:
        """Back to meta: the memory of these parameters is freed."""
        for name in names:
            old = self.module.get_parameter(name)
            _set(self.module, name, nn.Parameter(torch.empty(old.shape, dtype=old.dtype, device="meta"),
                                                 requires_grad=False))

    @contextmanager
    def read_on_use(self, names: list[str], release: bool):
        """These parameters are read from the checkpoint when their module first runs (a forward pre-hook),
        and, with `release`, back on meta at the end: what runs before the first block is not known from
        module order alone (Gemma 4's per-layer embeddings are registered after the blocks)."""
        by_module: dict[str, list[str]] = {}
        for name in names:
            by_module.setdefault(name.rpartition(".")[0], []).append(name)
        read: list[str] = []

        def load(params: list[str]) -> None:
            missing = [p for p in params if not self.is_resident(p)]
            self.materialize(missing)
            read.extend(missing)

        handles = [self.module.get_submodule(m).register_forward_pre_hook(
            lambda module, args, kwargs, params=params: load(params), with_kwargs=True) for m, params in by_module.items()]
        for m, params in by_module.items():  # read now: the first module to run, and some models read its
            if isinstance(self.module.get_submodule(m), nn.Embedding):  # weight's device before it runs
                load(params)  # (Llama 4: `input_ids.to(embed_tokens.weight.device)` sent them to meta)
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()
            if release:
                self.release([p for p in read if self.is_resident(p)])

    def is_resident(self, name: str) -> bool:
        """Whether a parameter holds real data (not the meta device)."""
        return not self.module.get_parameter(name).is_meta

    def weight_now(self, module: str, checkpoint_name: str) -> torch.Tensor:
        """A Linear's weight as it stands: the module's own where it is loaded (a transform may have folded
        scales into it), else the checkpoint's tensor (file to file: nothing is loaded)."""
        try:
            parameter = self.module.get_parameter(module + ".weight")
        except AttributeError:  # file to file: a stand-in without the model's modules; mapped, not copied (the
            return self.shards.mapped(checkpoint_name)  # page cache keeps it for its rounding a moment later)
        return self.shards.read(checkpoint_name) if parameter.is_meta else parameter.detach()


    def module_computing(self, weight: str) -> str:
        """The module that computes with checkpoint tensor `weight`: the Linear reading it (an LM head tied
        to the embedding reads the embedding's tensor), else the first module holding it."""
        holders = [p.rpartition(".")[0] for p in self.params_reading[weight]]
        linears = [m for m in holders if isinstance(_submodule(self.module, m), nn.Linear)]
        return (linears or holders)[0]

    @cached_property
    def head(self) -> str | None:
        """The module name of the output head (`lm_head`) when the model keeps only the last position's logits
        on request (transformers' `logits_to_keep`), else None."""
        if "logits_to_keep" not in inspect.signature(self.module.forward).parameters:
            return None
        get_head = getattr(self.module, "get_output_embeddings", None)
        head = get_head() if callable(get_head) else None
        if head is None:
            return None
        return next((name for name, sub in self.module.named_modules() if sub is head), None)

    def forward(self, feed: dict, last_logits_only: bool = False) -> torch.Tensor:
        """The model's first output for one chunk (logits, or hidden states of an encoder); gradients are
        recorded only where the caller enables them. `last_logits_only`: a pass whose output nobody reads (its
        hooks gather statistics) computes the head for the last position only, where the model can: on a small
        model with a large vocabulary the head is a tenth of the pass (SmolLM2: 576 × 49,152)."""
        kwargs = dict(feed)
        if self.accepts_use_cache:
            kwargs["use_cache"] = False
        if last_logits_only and self.head is not None:
            kwargs["logits_to_keep"] = 1
        try:
            out = self.module(**kwargs)
        except Exception as exc:
            if isinstance(exc, (StandInSignal, StageError)) or _raised_in_qrc(exc):
                raise  # qrc's own stand-ins and hooks: not the model's failure
            first = (str(exc).strip().splitlines() or [""])[0][:200]
            raise BackendError(error("Q452", f"transformers' {type(self.module).__name__} fails to run on the samples "
                                     f"({type(exc).__name__}: {first})", self.span, "the model does not run",
                                     help="the model class fails here itself (a transformers bug, or a config it "
                                     "does not support): another transformers version, or data-free rounding "
                                     "without `verify`, which runs no model")) from exc
        return out[0] if isinstance(out, (tuple, list)) or hasattr(out, "to_tuple") else out


class StandInSignal(Exception):
    """Raised by qrc's stand-ins for a model's blocks to stop its forward (torch/streams.py): passes through
    `TorchModel.forward` as it is."""


_PACKAGE = str(Path(__file__).resolve().parents[2])  # the compiler package


def _raised_in_qrc(exc: BaseException) -> bool:
    """Whether qrc's own code ran where the error was raised inside the model's forward (a hook, a stand-in
    module, a torch call of theirs): a qrc problem, never reported as the model's."""
    tb = exc.__traceback__
    tb = tb.tb_next if tb is not None else None  # the first frame is TorchModel.forward itself
    while tb is not None:
        if str(Path(tb.tb_frame.f_code.co_filename).resolve()).startswith(_PACKAGE):
            return True
        tb = tb.tb_next
    return False


def _submodule(root: nn.Module, name: str) -> nn.Module | None:
    """`root`'s submodule `name`, or None (a file-to-file run's stand-in module has none)."""
    try:
        return root.get_submodule(name)
    except AttributeError:
        return None


def _set(root: nn.Module, name: str, value: nn.Parameter) -> None:
    owner, _, leaf = name.rpartition(".")
    (root.get_submodule(owner) if owner else root)._parameters[leaf] = value


@contextmanager
def parameters_on_meta():
    """Build modules with their parameters on the meta device and their buffers real (rotary
    frequencies, position ids): nothing is allocated for weights, and no initialiser touches memory."""
    original = nn.Module.register_parameter

    def register(module, name, param):
        original(module, name, param)
        if param is not None:
            module._parameters[name] = nn.Parameter(module._parameters[name].to("meta"), requires_grad=False)

    nn.Module.register_parameter = register
    try:
        yield
    finally:
        nn.Module.register_parameter = original


def open_files(ref: str, rotation: RotationSource = None, split_experts: bool = False) -> TorchModel:
    """The checkpoint alone, without a model definition: for data-free rounding that never runs the model
    (file to file, tensor by tensor), so even an architecture transformers cannot build here compiles.
    Each tensor is its own parameter name; the module is an empty stand-in. `rotation`: the (hidden, head)
    widths of a rotation every tensor is read through (torch/rotation.py). `split_experts`: the index's
    (ModelIndex.experts_split: fused experts per expert for a GGUF output)."""
    if ref.startswith(builtin.PREFIX):
        folder_ckpt, config, folder = builtin_checkpoint(ref), {"qrc_builtin": ref}, None
    else:
        folder = _folder(ref)
        folder_ckpt, config = folder, json.loads((folder / "config.json").read_text(encoding="utf-8"))
    shards = _rotated(_shards(ref, folder_ckpt, config, split_experts), rotation, config)
    keys = {name: name for name in shards.entries if name not in shards.scales}
    return TorchModel(nn.Module(), shards, keys, "", (), _float_dtype(shards, keys), False, config, folder)


def _folder(ref: str) -> Path:
    """The HF-style folder of `ref`: the folder itself, or a GGUF file's side folder (models.model_dir)."""
    folder = model_dir(ref)
    return folder if folder is not None else resolve_path(ref)


def _shards(ref: str, folder: Path, config: dict, split_experts: bool = False):
    """The checkpoint's tensors: a single-file source's (a GGUF file's, dequantized as they are read), else the
    folder's safetensors (a compressed-tensors folder's decompressed as they are read, an MXFP4 checkpoint's experts
    decoded); fused experts of a family transformers loads per expert (or, `split_experts`, whose GGUF is written
    from per-expert layers) read per expert."""
    single = single_file_shards(ref)
    if single is not None:
        shards = single
    else:
        shards = with_packed_experts(with_decompression(Shards(folder, block_fp8.block_size(config)), config), config)
    return with_experts(shards, config.get("model_type", ""), split_experts)


def _float_dtype(shards: Shards, keys: dict[str, str]) -> torch.dtype:
    """The checkpoint's float dtype: the most common among its float tensors."""
    floats = [shards.entries[k].dtype for k in keys.values() if shards.entries[k].dtype in ("F32", "F16", "BF16")]
    return {"F16": torch.float16, "BF16": torch.bfloat16}.get(max(set(floats), key=floats.count) if floats else "F32",
                                                              torch.float32)


def open_model(ref: str, blocks: tuple[str, ...], span: Span | None,
               attention: AttentionKernel = AttentionKernel.MODEL,
               rotation: RotationSource = None, split_experts: bool = False) -> TorchModel:
    """The skeleton of a built-in or an HF folder, its parameters mapped to the safetensors tensors, running
    the `attention` kernel the recipe asks for. `blocks` are the index's (checkpoint) block names; the model's
    are its module paths. `rotation`: the (hidden, head) widths of a rotation every weight is read through
    (torch/rotation.py): the skeleton's LM head is then untied from the embeddings. `split_experts`: as
    open_files'."""
    renamed: dict[str, str] = {}
    if ref.startswith(builtin.PREFIX):
        module, folder_ckpt, config, folder = _builtin(ref), builtin_checkpoint(ref), {"qrc_builtin": ref}, None
        checkpoint = _rotated(Shards(folder_ckpt), rotation, config)
    else:
        folder = _folder(ref)
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        module = hf_skeleton(folder, span, untied=rotation is not None and not _online_only(rotation))
        set_attention(module, attention, span)
        checkpoint = _rotated(_shards(ref, folder, config, split_experts), rotation, config)
        renamed = checkpoint_names.module_names(module, list(checkpoint.entries),
                                                checkpoint_names.adapt(module, ref, span, split_experts))
    keys = _checkpoint_keys(module, checkpoint, renamed, ref, span)
    _attach_online(module, checkpoint)
    module_blocks = tuple(checkpoint_names.module_block(b, keys) for b in blocks)
    container = _container(module, module_blocks, ref, span)
    dtype = _float_dtype(checkpoint, keys)
    accepts = "use_cache" in inspect.signature(module.forward).parameters
    return TorchModel(module.eval(), checkpoint, keys, container, module_blocks, dtype, accepts, config, folder, span)


def set_attention(module: nn.Module, attention: AttentionKernel, span: Span | None) -> None:
    """Run a transformers model with `attention` (transformers' own switch: every layer and the mask builder
    read the config it sets), unless the recipe leaves the model's choice."""
    if attention is AttentionKernel.MODEL:
        return
    try:
        module.set_attn_implementation(attention.value)  # type: ignore[operator]
    except (AttributeError, ValueError, ImportError) as exc:  # a class without the switch, or that kernel
        raise BackendError(error("Q270", f"{type(module).__name__} cannot run `attention {attention.value}` ({exc})",
                                 span, "no such kernel here", help="remove `attention`, or pick the other kernel")) from None


def _builtin(ref: str) -> nn.Module:
    from compiler.models.builtin.torch_forms import skeleton

    with parameters_on_meta():
        return skeleton(ref)


def builtin_checkpoint(ref: str) -> Path:
    """The built-in's weights as a cached safetensors folder (written atomically on first use)."""
    from safetensors.numpy import save_file

    name, spec = builtin.parse_ref(ref)
    folder = builtin.cache_dir() / "builtin" / f"{builtin.cached_name(ref, 'torch-v1')}-torch"
    if not (folder / "model.safetensors").exists():
        own_folder(folder)
        fd, temp = tempfile.mkstemp(dir=folder, prefix=".model.", suffix=".qrc-tmp")  # a name no one planted
        os.close(fd)
        try:
            save_file(builtin.module(name).weights(spec), temp)
            os.replace(temp, folder / "model.safetensors")
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise
    return folder


def _rotated(shards, rotation: RotationSource, config: dict):
    """The checkpoint read through the rotation (torch/rotation.py: QuaRot's, seeded from its widths, or a learned
    one as it is), its LM head untied in the output's config; as it is without one."""
    if rotation is None:
        return shards
    from compiler.backends.torch.rotation import RotatedShards, Rotation

    if _online_only(rotation) and rotation[2]:  # R4 alone: the weights as they are, D's
        return RotatedShards(shards, Rotation.online_only(rotation[2]))  # entry added
    if "qrc_builtin" not in config:  # a built-in's head is its own already
        config["tie_word_embeddings"] = False  # the final norm folds into the head alone
    if not isinstance(rotation, tuple):
        return RotatedShards(shards, rotation)
    hidden, head, down, block = rotation
    return RotatedShards(shards, Rotation.seeded(hidden, head, down=down, block=block))


def _online_only(rotation: RotationSource) -> TypeGuard[tuple[int, int | None, int | None, int | None]]:
    """R4 alone (`transform smoothquant { online r4 }`): the model's head stays as it is."""
    return isinstance(rotation, tuple) and not rotation[0]


def _attach_online(module: nn.Module, checkpoint) -> None:
    """The rotation's online part (R4) as hooks on the skeleton's down projections (torch/rotation.py)."""
    rotation = getattr(checkpoint, "rotation", None)
    if rotation is not None and rotation.down is not None and not rotation.after_fold:
        from compiler.backends.torch.rotation import attach_online

        attach_online(module, rotation.down)


def hf_skeleton(folder: Path, span: Span | None, untied: bool = False) -> nn.Module:
    """The model class of `folder`'s config (its `architectures`, else AutoModel), parameters on meta; with
    `untied`, the LM head its own parameter (a rotation folds the final norm into it alone)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing reaches the network: the folder is the model
    try:
        import transformers
    except ImportError:
        raise BackendError(error("Q400", "the torch backend needs transformers to open an HF-style folder", span,
                                 "transformers missing", help="pip install -e '.[hf]'")) from None
    try:
        config = transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:  # transformers raises several types for unknown or broken configs
        raise BackendError(error("Q404", f"transformers cannot read `{folder}/config.json` ({type(exc).__name__})",
                                 span, "unreadable config", help="a config.json that transformers knows")) from None
    if untied:
        config.tie_word_embeddings = False
    named = getattr(config, "architectures", None)
    architecture = named[0] if isinstance(named, list | tuple) and named and isinstance(named[0], str) else ""
    cls = getattr(transformers, architecture, None) if architecture else None
    with parameters_on_meta():
        if cls is not None and hasattr(cls, "_from_config"):
            return cls._from_config(config)
        return transformers.AutoModel.from_config(config)


def _checkpoint_keys(module: nn.Module, checkpoint: Shards, renamed: dict[str, str], ref: str,
                     span: Span | None) -> dict[str, str]:
    """Each parameter's tensor in the checkpoint: the tensor transformers' renamings give this name, the
    same name, the name under a prefix (`bert.`), or, for tied parameters (an LM head sharing the embedding
    table), the tensor of a twin."""
    by_identity: dict[int, list[str]] = {}
    by_name: dict[str, nn.Parameter] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        by_identity.setdefault(id(param), []).append(name)
        by_name[name] = param
    tied = _tied(module)

    def lookup(name: str) -> str | None:
        return renamed.get(name) or _lookup(name, checkpoint)
    keys = {}
    for names in by_identity.values():
        found = next((k for k in map(lookup, names) if k), None)
        if found is None:  # tied by transformers (tie_word_embeddings): the checkpoint stores the source only
            found = next((k for k in (lookup(tied[n]) for n in names if n in tied) if k), None)
        if found is None:
            raise BackendError(error("Q404", f"`{ref}` has no tensor for parameter `{names[0]}`", span,
                                     "missing weight", help="the checkpoint does not match its config.json"))
        _refuse_other_shape(by_name[names[0]], names[0], found, checkpoint, ref, span)
        for name in names:
            keys[name] = found
    return keys


def _refuse_other_shape(param: nn.Parameter, name: str, key: str, checkpoint, ref: str, span: Span | None) -> None:
    """Q404 when a tensor has another shape of the same rank than the parameter config.json builds: the config
    and the weights disagree (a head count or a size edited), and the model would fail mid-run or compute with
    the wrong layout. (A conversion of transformers' changes the rank: per-expert tensors fused into 3-D.)"""
    entries = getattr(checkpoint, "entries", None)
    entry = entries.get(key) if entries is not None else None
    if entry is None or len(entry.shape) != len(param.shape) or tuple(entry.shape) == tuple(param.shape):
        return
    raise BackendError(error("Q404", f"`{ref}`: tensor `{key}` is {list(entry.shape)}, but config.json builds "
                             f"`{name}` as {list(param.shape)}", span, "config and weights disagree",
                             help="the checkpoint does not match its config.json (a size or head count edited?): "
                             "use the config the weights were saved with"))


def _tied(module: nn.Module) -> dict[str, str]:
    """transformers' active ties, target → source (`lm_head.weight` → `model.embed_tokens.weight` when the
    config ties word embeddings). The meta-device build gives each tied parameter its own object, so
    identity alone cannot find them."""
    tied = getattr(module, "all_tied_weights_keys", None)
    if tied is None:  # transformers before 5: the class's keys, when the config ties embeddings
        config = getattr(module, "config", None)
        keys = getattr(module, "_tied_weights_keys", None)
        tied = keys if isinstance(keys, dict) and getattr(config, "tie_word_embeddings", False) else {}
    return dict(tied) if isinstance(tied, dict) else {}


def _lookup(name: str, checkpoint: Shards) -> str | None:
    if name in checkpoint:
        return name
    suffix = "." + name
    found = [k for k in checkpoint.entries if k.endswith(suffix)]
    if len(found) == 1:
        return found[0]
    stripped = name.partition(".")[2]
    return stripped if stripped in checkpoint else None


def _container(module: nn.Module, blocks: tuple[str, ...], ref: str, span: Span | None) -> str:
    if not blocks:
        return ""  # no repeated blocks (a small CNN): the model runs whole
    parents = {b.rpartition(".")[0] for b in blocks}
    if len(parents) == 1:
        parent = parents.pop()
        found = dict(module.named_modules()).get(parent)
        if isinstance(found, nn.ModuleList) and len(found) == len(blocks):
            return parent
    raise BackendError(error("Q404", f"`{ref}`: the repeated blocks ({', '.join(blocks[:2])}, …) are not one "
                             "ModuleList of the torch model", span, "no block list",
                             help="block-wise execution needs the blocks in one nn.ModuleList"))
