"""Index an HF-style folder: config.json plus safetensors headers only (no tensor data is read)."""

from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import replace
from pathlib import Path

from compiler.models import block_fp8, compressed_source, expert_slices, families, mxfp4_source, names
from compiler.models.errors import ModelError
from compiler.models.index import (
    DTYPE_BYTES,
    ROUTER_OP,
    Layer,
    LayerKind,
    ModelFormat,
    ModelIndex,
    Norm,
    TensorInfo,
    norm_module,
)
from compiler.models.safetensors_dtypes import SAFETENSORS_DTYPES
from compiler.models.weight_files import weight_files
from compiler.safe_files import read_json

_MAX_HEADER = 100 << 20
_CONFIG_NUMBERS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                   "intermediate_size", "vocab_size", "max_position_embeddings", "type_vocab_size",
                   "num_experts_per_tok")  # the experts an MoE token is routed to (the plan's time counts them)


def index_hf(folder: Path, ref: str, headers: dict[str, tuple[str, tuple[int, ...]]] | None = None,
             gguf_output: bool = False) -> ModelIndex:
    """Index an HF-style folder from config.json and the safetensors headers (no weights read). `headers`: the
    tensors as another source gives them (a GGUF file's, models/gguf_source.py), in place of the folder's.
    `gguf_output`: the index a GGUF output is written from (models/expert_slices.py: gpt-oss's fused experts
    per expert)."""
    config = _config(folder, ref)
    headers = _headers(folder, ref) if headers is None else headers
    pickled = sorted(p.name for pattern in ("*.bin", "*.pt", "*.pth") for p in folder.glob(pattern))
    if pickled and not headers:  # torch pickles run code when loaded: qrc reads safetensors only
        raise ModelError("Q252", f"`{ref}` has its weights as {', '.join(pickled[:2])} (a torch pickle), not safetensors",
                         "convert them once: transformers' `save_pretrained(..., safe_serialization=True)` writes "
                         "model.safetensors")
    planned = _layout(config, ref) if config else None
    if planned is None and not headers:
        family = (config or {}).get("model_type", "unknown")
        raise ModelError("Q252", f"`{ref}` has no safetensors weights and its family `{family}` is not known",
                         f"qrc indexes from config.json alone for: {', '.join(families.DECODERS + families.ENCODERS)}")
    dtype = _config_dtype(config)
    _refuse_unreadable(block_fp8.grid_mismatch(headers, block_fp8.block_size(config)), ref,
                       "the FP8 weight `{name}` does not match its block scales", _FP8_GRID_HELP)
    headers = block_fp8.as_dequantized(headers, dtype)  # an FP8 source checkpoint: its weights as qrc reads them
    compressed = compressed_source.compressed_layers(headers, config)
    fp4, mxfp4 = compressed_source.fp4_weights(compressed), compressed_source.fp4_weights(compressed, ("mxfp4-pack-quantized",))
    headers = compressed_source.as_dequantized(headers, config, dtype)  # a compressed-tensors folder's, likewise
    _refuse_unreadable(mxfp4_source.pair_problem(headers, config), ref, "the MXFP4 tensor `{name}` cannot be decoded",
                       _MXFP4_HELP)
    packed = tuple(sorted(mxfp4_source.packed_pairs(headers, config), key=_model_order))
    headers = mxfp4_source.as_dequantized(headers, config, dtype)  # gpt-oss's MXFP4 experts, likewise
    # fused experts of a family transformers loads per expert (or, for a GGUF, llama.cpp merges from per-expert
    # tensors): one Linear per expert, as the output holds them; an MXFP4 source's then packed per expert
    slices = expert_slices.per_expert(headers, (config or {}).get("model_type", ""), gguf_output)
    split = {piece.source for piece in slices.values()}
    packed = tuple(n for n in packed if n not in split) + tuple(n for n, p in slices.items() if p.source in packed)
    headers = expert_slices.as_per_expert(headers, slices)
    if planned and headers:
        _check_experts(planned, headers, ref)
    layers = _from_layout(planned, headers, dtype) if planned else []
    layers += _extra_layers(headers, {layer.weight for layer in layers}, (config or {}).get("model_type", ""))
    if headers:
        total = sum(math.prod(shape) * DTYPE_BYTES.get(dt, 4) for dt, shape in headers.values())
    else:
        total = sum(math.prod(t.shape) for t in planned or ()) * DTYPE_BYTES.get(dtype, 4)
    if isinstance((config or {}).get("vision_config"), dict):
        layers = [_as_tower(layer) for layer in layers]
    counts = _expert_counts(config or {})
    layers = [_as_router(layer, counts) for layer in layers]
    layers += _tied_head(config or {}, layers, headers)
    numbers = _numbers(config or {})
    family = (config or {}).get("model_type", "hf")
    shapes = headers or {t.name: (dtype, t.shape) for t in planned or ()}
    fused = tuple(name for name, (_, shape) in shapes.items()
                  if len(shape) == 3 and (name.endswith(_FUSED_EXPERTS) or shape[0] in counts))
    return ModelIndex(ref, ModelFormat.HF, family, tuple(layers), _inputs(config or {}), (), total, numbers,
                      norms=_norms(shapes), fused_experts=tuple(sorted(fused, key=_model_order)),
                      compressed_source=compressed_source.quantization(config) is not None, packed_experts=packed,
                      fp4_compressed=fp4, mxfp4_compressed=mxfp4,
                      experts_split=gguf_output and expert_slices.split_for_gguf(family) and bool(slices))


def _norms(shapes: dict[str, tuple[str, tuple[int, ...]]]) -> tuple[Norm, ...]:
    """The normalisations' per-channel weights, from tensor names and 1-D shapes (no bytes read)."""
    out = []
    for tensor, (_, shape) in shapes.items():
        module = norm_module(tensor)
        if module is not None and len(shape) == 1:
            bias = f"{module}.bias" if f"{module}.bias" in shapes else None
            out.append(Norm(module, tensor, bias, shape[0], names.block_of(module)))
    return tuple(sorted(out, key=lambda n: names.natural_key(n.name)))


# Source checkpoints whose stored form qrc reads through a decoding, refused (Q252) where a tensor does not fit it:
# an FP8 source whose block scales do not tile its weights by `weight_block_size` (read anyway, most tiles would
# take another tile's scale: 11-23% weight error, and a verification against the same misread float would pass);
# an MXFP4 checkpoint whose packed expert tensor lacks its other half or disagrees with it (read as it is, its
# bytes would be copied into an output no loader reads)
_FP8_GRID_HELP = ("the checkpoint's `quantization_config.weight_block_size` must give the tile its "
                  "`weight_scale_inv` tensors were made with; fix config.json or re-export the checkpoint")
_MXFP4_HELP = ("an MXFP4 checkpoint (`quant_method: mxfp4`, as gpt-oss ships) stores each expert projection as "
               "`_blocks` and `_scales` of matching shapes; re-export the checkpoint")


def _refuse_unreadable(found: tuple[str, str] | None, ref: str, subject: str, help: str) -> None:
    """Q252 for the source tensor `found` names (with why it cannot be read as stored; None: every one can);
    `subject` says what it is, `{name}` standing for its name."""
    if found is not None:
        name, what = found
        raise ModelError("Q252", f"`{ref}`: {subject.format(name=name)}: {what}", help)


# Module names of a VLM's vision side (checkpoint and transformers names): its layers are `named_only`.
_TOWER_PARTS = ("vision_tower", "visual", "vision_model", "vision_encoder", "multi_modal_projector", "mm_projector",
                "vision_embed_tokens", "image_newline", "vision_projection")
# Token ids that stand for images or video: synthetic ids stay below the first (no image without its pixels).
_MEDIA_TOKENS = ("image_token_id", "image_token_index", "video_token_id", "vision_start_token_id",
                 "vision_end_token_id", "boi_token_index", "eoi_token_index", "vision_token_id")


def _as_tower(layer: Layer) -> Layer:
    if not set(layer.name.split(".")) & set(_TOWER_PARTS):
        return layer
    return replace(layer, block=None, named_only=True)  # the blocks block-wise execution walks are the language model's


# An MoE block's router: the Linear-shaped module whose logits pick the experts (one output per expert).
# (GraniteMoE's `block_sparse_moe.router.layer`: its router module holds the Linear as `layer`)
_ROUTER_NAMES = ("mlp.gate", "block_sparse_moe.gate", "mlp.router", "moe.gate", "feed_forward.router", "router.proj",
                 "router.layer")
# A checkpoint that stores an MoE block's experts as 3-D tensors (Gemma 4, gpt-oss, Llama 4), as transformers 5
# holds them; under other names too (GraniteMoE's `input_linear`/`output_linear`): any 3-D tensor whose first
# axis counts the config's experts
_FUSED_EXPERTS = (".experts.gate_up_proj", ".experts.down_proj")
_EXPERT_COUNTS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")  # the last ERNIE 4.5's


def _expert_counts(config: dict) -> set[int]:
    """The experts an MoE block of this config has (empty for a dense model)."""
    merged = {**config, **_text_config(config)}
    return {merged[k] for k in _EXPERT_COUNTS if isinstance(merged.get(k), int) and merged[k] > 1}


def _as_router(layer: Layer, experts: set[int]) -> Layer:
    """MoE routers are a kind of their own (op `Router`, `named_only`): transformers 5 builds them as router
    modules, not nn.Linear, and no serving stack quantizes them, so `type Linear` leaves them in float; a
    name rule still selects one (data-free rounding writes it; a calibrating run refuses it, Q411). `experts`:
    the config's expert counts."""
    if layer.kind is LayerKind.LINEAR and layer.name.endswith(_ROUTER_NAMES) and layer.out_features in experts:
        return replace(layer, op=ROUTER_OP, named_only=True)
    return layer


def _text_config(config: dict) -> dict:
    """A VLM's `text_config` (its language model's numbers), or {}."""
    text = config.get("text_config")
    return text if isinstance(text, dict) else {}


def _tied_head(config: dict, layers: list[Layer], headers) -> list[Layer]:
    """An LM head tied to the input embedding has no tensor of its own; it is still a layer, named as the
    checkpoint would name it (`lm_head`, `language_model.lm_head`), whose weight is the embedding's tensor.
    `named_only`: it stays tied and float unless a rule names it."""
    text = _text_config(config)
    if not (config.get("tie_word_embeddings") or text.get("tie_word_embeddings")):
        return []
    embedding = next((x for x in layers if x.kind is LayerKind.EMBEDDING and not x.named_only
                      and x.name.rpartition(".")[2] in ("embed_tokens", "wte", "word_embeddings")), None)
    if embedding is None:
        return []
    base = re.search(r"(?:^|\.)(?:model|transformer)\.", embedding.name)  # the base model under a head model
    head = (embedding.name[:base.start() + (base.group(0).startswith("."))] if base else "") + "lm_head"
    if head + ".weight" in headers or any(x.name == head for x in layers):
        return []
    vocab, hidden = embedding.shape[0], embedding.shape[1]
    return [Layer(head, LayerKind.LINEAR, "Linear", embedding.weight, f"{head}:input", (vocab, hidden), embedding.dtype,
                  hidden, vocab, None, named_only=True)]


def _numbers(config: dict) -> tuple[tuple[str, int], ...]:
    """The architecture numbers (a VLM's are its text model's), and for a VLM the first media token id as
    `text_tokens`: token ids synthetic data may draw lie below it."""
    text = _text_config(config)
    merged = {**config, **text}
    numbers = [(k, merged[k]) for k in _CONFIG_NUMBERS if isinstance(merged.get(k), int)]
    media = [v for k in _MEDIA_TOKENS for v in (config.get(k), text.get(k)) if isinstance(v, int) and v > 0]
    if media:
        numbers.append(("text_tokens", min(media)))
    if "eager" in (merged.get("attn_implementation"), merged.get("_attn_implementation")):
        numbers.append(("eager_attention", 1))  # the attention scores are held (compiler/plan/memory.py)
    return tuple(numbers)


def _inputs(config: dict) -> tuple[TensorInfo, ...]:
    """What the folder's model takes, as transformers calls it: token ids and their attention mask, and
    token types where the config has them (BERT-style)."""
    names = ["input_ids", "attention_mask"] + (["token_type_ids"] if config.get("type_vocab_size") else [])
    return tuple(TensorInfo(n, "int64", ("batch", "sequence")) for n in names)


_LIMITS = {"num_hidden_layers": 4096, "hidden_size": 1 << 20, "intermediate_size": 1 << 22, "vocab_size": 1 << 24,
           "num_attention_heads": 1 << 14, "num_key_value_heads": 1 << 14, "head_dim": 1 << 14,
           "num_local_experts": 4096, "num_experts": 4096, "n_routed_experts": 4096, "moe_intermediate_size": 1 << 22}


_EXPERTS = ("num_local_experts", "num_experts", "n_routed_experts")


def _check_numbers(config: dict, ref: str) -> None:
    """Every size of the config and of its nested text and vision configs a whole number within qrc's limits;
    an MoE's experts per token from 1 to its number of experts (Q250 otherwise)."""
    for where, part in (("", config), ("text_config.", config.get("text_config")),
                        ("vision_config.", config.get("vision_config"))):
        if not isinstance(part, dict):
            continue
        for key, limit in _LIMITS.items():
            value = part.get(key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= limit):
                shown = json.dumps(value)[:40]  # `"2"` (a string) must not read as the number 2
                kind = "a string" if isinstance(value, str) else "a whole number out of range" \
                    if isinstance(value, int) and not isinstance(value, bool) else f"a JSON {type(value).__name__}"
                raise ModelError("Q250", f"`{ref}/config.json` has `{where}{key}: {shown}` ({kind}), not a size qrc "
                                 f"can plan (a whole number from 1 to {limit:,})", "fix config.json")
        experts = next((part[k] for k in _EXPERTS if isinstance(part.get(k), int)), None)
        top = part.get("num_experts_per_tok")
        if experts is not None and top is not None and (not isinstance(top, int) or isinstance(top, bool)
                                                         or not 0 < top <= experts):
            raise ModelError("Q250", f"`{ref}/config.json` has `{where}num_experts_per_tok: {str(top)[:40]}` for "
                             f"{experts} experts", f"each token is routed to 1 to {experts} experts: fix config.json")


def _layout(config: dict, ref: str):
    """The family's layout from config.json, after its numbers are checked: a missing or implausible one is a
    diagnostic (Q250), never a KeyError or a layout of 10⁸ blocks built in memory."""
    _check_numbers(config, ref)
    if config.get("model_type") not in families.DECODERS + families.ENCODERS:
        return None
    try:
        return families.layout(config)
    except KeyError as exc:
        raise ModelError("Q250", f"`{ref}/config.json` of a `{config.get('model_type')}` model has no `{exc.args[0]}`",
                         "add it to config.json (transformers writes it with save_pretrained)") from None
    except (TypeError, ValueError) as exc:
        raise ModelError("Q250", f"`{ref}/config.json` cannot be read as a `{config.get('model_type')}` config ({exc})",
                         "fix config.json") from None


MAX_CONFIG_BYTES = 64 << 20


def _config(folder: Path, ref: str) -> dict | None:
    path = folder / "config.json"
    if not path.exists():
        return None
    try:  # a FIFO or a device as config.json is refused, never waited on; a config is never 64 MiB
        config = read_json(path, MAX_CONFIG_BYTES)
    except (OSError, ValueError) as exc:  # UnsafePath, too large, not UTF-8, not JSON, nested too deep
        raise ModelError("Q250", f"`{ref}/config.json` is not valid JSON ({exc})", "fix or replace config.json") from None
    if not isinstance(config, dict):
        raise ModelError("Q250", f"`{ref}/config.json` is not a JSON object", "fix or replace config.json")
    return config


def _config_dtype(config: dict | None) -> str:
    name = str((config or {}).get("torch_dtype") or (config or {}).get("dtype") or "float32")
    return name.removeprefix("torch.") if name.removeprefix("torch.") in DTYPE_BYTES else "float32"



def tensor_shapes(folder: Path, ref: str) -> dict[str, tuple[int, ...]]:
    """Every safetensors tensor of `folder` and its shape (headers only; Q250 for a damaged file)."""
    return {name: shape for name, (_, shape) in _headers(folder, ref).items()}


def _headers(folder: Path, ref: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name → (dtype, shape) from the header of each file the folder's weights are in (models/weight_files.py),
    each checked against its file: known dtypes, byte ranges that match the shape, lie inside the file and do not
    overlap."""
    found: dict[str, tuple[str, tuple[int, ...]]] = {}
    for path in weight_files(folder, ref):
        if not path.is_file():
            raise ModelError("Q250", f"`{path.name}` in `{ref}` is not a file", "a .safetensors path must be a file")
        with path.open("rb") as handle:
            head = handle.read(8)
            size = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
            if not 0 < size <= _MAX_HEADER:
                raise ModelError("Q250", f"`{path.name}` in `{ref}` is not a safetensors file",
                                 "the header length is missing or implausible")
            try:
                header = json.loads(handle.read(size))
            except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
                raise ModelError("Q250", f"`{path.name}` in `{ref}` has a corrupt header", "re-save the file") from None
        if not isinstance(header, dict):
            raise ModelError("Q250", f"`{path.name}` in `{ref}` has a header that is not a JSON object", "re-save the file")
        payload = path.stat().st_size - 8 - size
        ranges = []
        _refuse_odd_entries(path.name, ref, header)
        for name, info in header.items():
            if name != "__metadata__":
                shape, start, end = _tensor_entry(path.name, ref, name, info, payload)
                ranges.append((start, end, name))
                dtype = SAFETENSORS_DTYPES[info["dtype"]]
                found[name] = (dtype.torch_name or dtype.code.lower(), shape)
        _refuse_overlaps(path.name, ref, ranges)
    return found


def _refuse_odd_entries(file: str, ref: str, header: dict) -> None:
    """Q250 for what the safetensors format does not allow or no model has: `__metadata__` other than text
    keys and values, a tensor entry that is not an object, a tensor name that is not a module path (empty,
    with a path separator, `..`, whitespace or control characters: it could be no parameter, and would be
    printed and written into the output as it is)."""
    metadata = header.get("__metadata__", {})
    if not (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())):
        raise ModelError("Q250", f"`{file}` in `{ref}` has `__metadata__` {str(metadata)[:40]}, which safetensors "
                         "allows only as text keys and values", "re-save the file")
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(info, dict):
            raise ModelError("Q250", f"`{file}` in `{ref}`: tensor `{name[:80]}` is described by "
                             f"{type(info).__name__}, not an object", "re-save the file")
        if not _MODULE_PATH.fullmatch(name) or ".." in name:
            raise ModelError("Q250", f"`{file}` in `{ref}` has a tensor named {name[:80]!r}, which is not a module "
                             "path", "tensor names are parameter paths such as `model.layers.0.mlp.up_proj.weight`; "
                             "re-save the file")


_MODULE_PATH = re.compile(r"[^\s/\\\x00-\x1f\x7f]+")


def _tensor_entry(file: str, ref: str, name: str, info: dict, payload: int) -> tuple[tuple[int, ...], int, int]:
    """One header entry's shape and byte range, or Q250 naming what is wrong with it."""
    where = f"`{file}` in `{ref}`: tensor `{name[:80]}`"
    shape = info.get("shape", ())
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise ModelError("Q250", f"{where} has shape {str(shape)[:40]}",
                         "re-save the file: shapes are lists of whole numbers")
    dtype = SAFETENSORS_DTYPES.get(str(info.get("dtype")))
    if dtype is None:
        raise ModelError("Q250", f"{where} has dtype `{str(info.get('dtype'))[:20]}`, which safetensors does not define",
                         "re-save the file")
    offsets = info.get("data_offsets")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
            and 0 <= offsets[0] <= offsets[1] <= payload):
        raise ModelError("Q250", f"{where} has data offsets {str(offsets)[:40]} outside the file's {payload:,} bytes",
                         "the file is truncated or its header is wrong: re-save or re-download it")
    if offsets[1] - offsets[0] != dtype.nbytes(math.prod(shape)):
        raise ModelError("Q250", f"{where}: {offsets[1] - offsets[0]:,} bytes for a {dtype.code} tensor of "
                         f"shape {shape} ({dtype.nbytes(math.prod(shape)):,} bytes)", "re-save the file")
    return tuple(shape), offsets[0], offsets[1]


def _refuse_overlaps(file: str, ref: str, ranges: list[tuple[int, int, str]]) -> None:
    """Two tensors sharing bytes would be read as each other's data."""
    ranges.sort()
    for (_, end, name), (start, _, other) in zip(ranges, ranges[1:], strict=False):
        if start < end:
            raise ModelError("Q250", f"`{file}` in `{ref}`: tensors `{name[:60]}` and `{other[:60]}` overlap in the "
                             "file", "re-save the file")


def _from_layout(planned, headers, dtype: str) -> list[Layer]:
    layers = []
    for tensor in planned:
        if tensor.kind is None:
            continue
        weight = _find(tensor.name, headers)
        if headers and weight is None:
            continue  # e.g. lm_head tied to the embeddings: not stored, not a layer of its own
        w_dtype, shape = headers[weight] if weight else (dtype, tensor.shape)
        layers.append(_layer(weight or tensor.name, tensor.kind, shape, w_dtype))
    return layers


def _check_experts(planned, headers, ref: str) -> None:
    """Every expert projection the config describes is in the checkpoint with the config's shape (Q252):
    otherwise a missing expert is silently not a layer, and a wrong-shaped one is rounded as found, and either
    is written through file to file with exit 0."""
    for tensor in planned:
        if tensor.kind is None or ".experts." not in tensor.name:
            continue
        found = _find(tensor.name, headers)
        if found is None:
            raise ModelError("Q252", f"`{ref}` has no tensor `{tensor.name}`, an expert its config.json describes",
                             "the checkpoint is incomplete (a shard missing from the index?) or config.json counts "
                             "other experts; fix the folder")
        shape = tuple(headers[found][1])
        if shape != tuple(tensor.shape):
            raise ModelError("Q252", f"`{ref}`: the expert tensor `{found}` is {list(shape)}, where config.json "
                             f"gives {list(tensor.shape)}", "the checkpoint does not match its config.json; fix "
                             "the folder")


def _find(name: str, headers) -> str | None:
    if not headers:
        return None
    if name in headers:
        return name
    return next((k for k in headers if k.endswith("." + name)), None)  # `bert.` and similar prefixes


# Families whose projections are transformers' Conv1D: a Linear whose weight is stored [in, out].
CONV1D_FAMILIES = ("gpt2", "openai-gpt", "imagegpt", "decision_transformer")
_CONV1D_LEAVES = ("c_attn", "q_attn", "c_proj", "c_fc")


def _model_order(name: str) -> tuple:
    """Headers list tensors alphabetically (`lm_head` before `model.layers`); layers are in the order the
    forward pass meets them: embeddings, then the blocks, then what follows (final norm, LM head). Outside the
    blocks, Gemma 3n/4's per-layer input path (`per_layer_model_projection`) is computed from the embeddings
    before the first block, so it is in the embeddings' stage."""
    block = names.block_of(name)
    first = "embed" in name or name.split(".")[-2:-1] in (["wte"], ["wpe"]) or (not block and "per_layer_" in name)
    stage = 0 if first else (1 if block else 2)
    return (stage, names.natural_key(name))


def _extra_layers(headers, taken: set[str], family: str = "") -> list[Layer]:
    extra = []
    for name in sorted(headers, key=_model_order):
        dtype, shape = headers[name]
        if name in taken or not name.endswith(".weight") or len(shape) not in (2, 3, 4, 5):
            continue
        kind = LayerKind.CONV if len(shape) > 2 else (LayerKind.EMBEDDING if "embed" in name else LayerKind.LINEAR)
        layer = _layer(name, kind, shape, dtype)
        if family in CONV1D_FAMILIES and len(shape) == 2 and name.removesuffix(".weight").rpartition(".")[2] in _CONV1D_LEAVES:
            layer = replace(layer, op="Conv1D", in_features=shape[0], out_features=shape[1])
        extra.append(layer)
    return extra


def _layer(weight: str, kind: LayerKind, shape: tuple[int, ...], dtype: str) -> Layer:
    name = weight.removesuffix(".weight")
    if kind is LayerKind.EMBEDDING:
        in_f, out_f = shape[0], shape[1]
    elif kind is LayerKind.CONV:
        in_f, out_f = math.prod(shape[1:]), shape[0]
    else:
        in_f, out_f = shape[1], shape[0]
    op = kind.value if kind is not LayerKind.CONV else f"Conv{len(shape) - 2}d"
    return Layer(name, kind, op, weight, f"{name}:input", tuple(shape), dtype, in_f, out_f, names.block_of(name))
