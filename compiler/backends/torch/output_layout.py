"""What the torch backend's output folder holds: each checkpoint tensor as it was, or the compressed-tensors
tensors of the layer that replaces it; config.json with its `quantization_config`; the recipe; the model
folder's other files. A head tied to the embedding that a rule quantizes gets tensors of its own (untied)."""

from __future__ import annotations

import json
from pathlib import Path

from compiler.backends.emitter import Spec
from compiler.backends.torch.compressed import TensorSpec, layer_specs, quantization_config
from compiler.backends.torch.config_schema import check_config, require_package
from compiler.backends.torch.kv_cache import kv_specs
from compiler.backends.torch.layers import Job
from compiler.backends.torch.loader_names import loader_names
from compiler.backends.torch.model import TorchModel
from compiler.backends.torch.quant_args import DECOMPRESSED_TO_BFLOAT16, input_args
from compiler.backends.torch.shards import DTYPES
from compiler.backends.torch.writer import FolderWriter, RankCollector
from compiler.diagnostics import Diagnostic
from compiler.ir.types import KvCache
from compiler.models.index import LayerKind
from compiler.models.side_files import copyable
from compiler.resolve.assignment import Assignment
from compiler.source import Span

# the model folder's files that are weights (written from the rounded tensors, not copied)
SKIPPED_FILES = (".safetensors", ".safetensors.index.json", ".bin", ".pt", ".pth", ".onnx", ".onnx.data", ".h5",
                 ".msgpack")


def output_specs(model: TorchModel, jobs: list[Job]) -> list[TensorSpec]:
    """Every tensor of the output, known before any weight is read (the writer lays the files out first)."""
    replaced = {j.layer.weight: j for j in jobs if not j.tied}
    specs = []
    shards = model.shards
    for key, entry in shards.entries.items():
        job = replaced.get(key)
        if key in shards.scales:  # an FP8 source's block scales: every weight is written anew
            continue
        if job is None:  # kept as it was (an FP8 source's weight: dequantized, in the model's dtype)
            specs.append(Spec(key, model.dtype if not shards.stored_as_is(key) else DTYPES[entry.dtype], entry.shape))
        else:
            specs += layer_specs(job.layer, job.scheme, model.dtype)
    for job in jobs:
        if job.tied:
            specs += layer_specs(job.layer, job.scheme, model.dtype)
    return specs


def copy_unquantized(writer: FolderWriter, model: TorchModel, jobs: list[Job]) -> None:
    """Every checkpoint tensor no layer replaced and no transform rewrote, copied as bytes (an FP8 source's
    weight dequantized)."""
    replaced = {j.layer.weight for j in jobs if not j.tied}
    shards = model.shards
    for key, entry in shards.entries.items():
        if key in replaced or key in shards.scales or key not in writer.missing:  # written already (a transform)
            continue
        if not shards.stored_as_is(key):  # an FP8 source's weight, a GGUF tensor: decoded first, a slice of rows
            # at a time where the source gives it so
            for first, rows in shards.slices(key):
                writer.put_rows(key, first, rows.to(model.dtype))
        else:
            writer.copy_raw(key, entry.file, entry.start, entry.end)


def output_config(model: TorchModel, jobs: list[Job], assignment: Assignment, kv_cache_scheme: dict | None = None,
                  provisional: bool = False) -> dict:
    """config.json as the output folder has it: the quantization config (one group per scheme, the Linear
    layers left in float ignored, named so that every loader matches them: loader_names.py; the KV cache's
    scheme), untied where a tied head was quantized. `provisional`: names made without waiting for a
    model class's base-model prefix (loader_names), for the check before any work."""
    done = {j.layer.name for j in jobs}
    floating = [a.layer.name for a in assignment.layers if a.layer.kind is LayerKind.LINEAR and a.layer.name not in done]
    names = loader_names(model, {j.layer.name: j.module for j in jobs}, floating,
                         {j.layer.name: j.scheme.name for j in jobs}, (a.layer.name for a in assignment.layers),
                         provisional)
    config = dict(model.config)
    config["quantization_config"] = quantization_config([(j.layer, j.scheme) for j in jobs], list(names.ignore),
                                                        names.targets)
    config["quantization_config"]["kv_cache_scheme"] = kv_cache_scheme
    online = _online_transforms(model)
    if online is not None:
        config["quantization_config"]["transform_config"] = online
    if any(j.tied for j in jobs):  # the head now has tensors of its own
        config = _untied(config)
    return _fp4_dtype(config, jobs)


def _online_transforms(model: TorchModel) -> dict | None:
    """The transform_config of a rotation with an online part (torch/rotation.py), else None."""
    rotation = getattr(model.shards, "rotation", None)
    if rotation is None:
        return None
    from compiler.backends.torch.rotation import transform_config

    return transform_config(rotation)


def _fp4_dtype(config: dict, jobs: list[Job]) -> dict:
    """A float32 model's folder with FP4 or MX weights says bfloat16: compressed-tensors decompresses them to
    bfloat16 (quant_args.DECOMPRESSED_TO_BFLOAT16). Its other tensors stay float32 in the files; transformers
    casts them as it loads."""
    dtype = config.get("dtype", config.get("torch_dtype"))
    if "qrc_builtin" in config or dtype not in (None, "float32") or \
            not any(j.scheme.quantized_weights.qtype in DECOMPRESSED_TO_BFLOAT16 for j in jobs):
        return config
    return {**config, "dtype": "bfloat16", **({"torch_dtype": "bfloat16"} if "torch_dtype" in config else {})}


def open_output(output: Path, model: TorchModel, jobs: list[Job], assignment: Assignment, kv: KvCache | None,
                attention: list[str], span: Span | None, writes: bool = True, provisional: bool = False,
                staged: Path | None = None, reopen: bool = False
                ) -> tuple[dict, FolderWriter | RankCollector, Diagnostic | None]:
    """Before any work: config.json's content, checked with compressed-tensors' schema (Q420; Q400 when the
    package is missing but the floating formats or a KV cache need it), and the writer with every output
    tensor laid out (`attention`: the modules whose KV scales `kv_cache` adds). Also returns Q421 when the
    schema check was skipped; its diagnostics point at `span`. `writes` False (a rank but the first under
    torchrun): a collector that hands its tensors on, and no file. `provisional` (file to file): the config's
    names are made again, and checked, once the model class's prefix is known (final_config, early_check.py);
    here only Q400. `staged`, `reopen`: a resumable run's staging folder, and whether an earlier run began it
    (FolderWriter)."""
    # the KV cache's arguments are those of an activation spec (vLLM takes float 8-bit symmetric per tensor)
    config = output_config(model, jobs, assignment, input_args(kv.quant) if kv else None, provisional)
    floats = needs_package(jobs, config)
    if provisional:  # checked later (final_config), on the names then made
        skipped = None
        if floats:
            require_package(span)
    else:
        skipped = check_config(config["quantization_config"], span, floats)
    if not writes:
        return config, RankCollector(), skipped
    writer = FolderWriter(output, output_specs(model, jobs) + kv_specs(attention, model.dtype), staged=staged,
                          reopen=reopen)
    return config, writer, skipped


def final_config(model: TorchModel, jobs: list[Job], assignment: Assignment, provisional: dict,
                 span: Span | None) -> tuple[dict, Diagnostic | None]:
    """A file-to-file run's config.json with its final names and compressed-tensors' check of it, as
    open_output does for the others: Q420 raised, Q421 returned."""
    config = renamed_config(model, jobs, assignment, provisional)
    return config, check_config(config["quantization_config"], span, needs_package(jobs, config))


def renamed_config(model: TorchModel, jobs: list[Job], assignment: Assignment, provisional: dict) -> dict:
    """A file-to-file run's config.json with its final names (made with the model class's base-model prefix,
    which a check process reported or this process imports now: loader_names)."""
    return output_config(model, jobs, assignment, provisional["quantization_config"]["kv_cache_scheme"])


def needs_package(jobs: list[Job], config: dict) -> bool:
    """Whether compressed-tensors writes part of the output: the floating formats, a KV cache's scales."""
    return (any(j.scheme.quantized_weights.qtype.is_float for j in jobs)
            or config["quantization_config"]["kv_cache_scheme"] is not None)


def config_text(config: dict) -> str:
    """config.json as written."""
    return json.dumps(config, indent=2, sort_keys=True) + "\n"


def write_metadata(writer: FolderWriter, model: TorchModel, config: dict, recipe_text: str) -> list[str]:
    """config.json (from output_config), the recipe, and the model folder's other files (tokenizer,
    generation config, …): regular files resolving inside the folder only (models/side_files.py). Returns
    the side files not copied because they link outside it."""
    writer.metadata("config.json", config_text(config))
    writer.metadata("qrc.recipe", recipe_text)
    folder = model.folder
    refused: list[str] = []
    if folder is not None:
        for path in sorted(folder.rglob("*")):
            relative = path.relative_to(folder).as_posix()
            if relative == "config.json" or relative.endswith(SKIPPED_FILES) or path.is_dir():
                continue
            if copyable(folder, path):
                writer.copy_file(path, relative)
            elif path.is_symlink():
                refused.append(relative)
    return refused


def _untied(config: dict) -> dict:
    """config.json with `tie_word_embeddings` false (a VLM's text config too)."""
    config = {**config, "tie_word_embeddings": False}
    if isinstance(config.get("text_config"), dict):
        config["text_config"] = {**config["text_config"], "tie_word_embeddings": False}
    return config
