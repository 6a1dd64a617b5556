"""A GGUF file as a source model: read from its header alone (no weight bytes), seen as the Hugging Face folder it
was converted from. llama.cpp's converter wrote the file from such a folder; this goes the other way for the
families whose layout is plain (Llama, Mistral, Qwen2, Qwen3 and their byte-level BPE tokenizers):

- `read_header` parses the key-values and tensor infos (our own reader: `gguf.GGUFReader` builds a numpy array
  for every one of 100k vocabulary strings, 8 s for SmolLM2's header, where this takes a fraction of a second);
- `hf_config` gives config.json's numbers from the key-values, `hf_name` each tensor's transformers name and
  shape (GGUF lists dimensions innermost first);
- `side_folder` writes config.json, the tokenizer (tokenizer.json from the vocabulary and merges, through the
  `tokenizers` library), tokenizer_config.json with the chat template, and generation_config.json into qrc's
  cache, once per file version: the folder the rest of qrc reads as the model's, with the weights left in the
  GGUF file (the torch backend dequantizes them one tensor at a time, backends/torch/gguf_shards.py).

What the file holds that this does not know (another architecture, a sentencepiece vocabulary) is Q271 naming
it, before any work."""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import struct
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from compiler.models import cache_entries
from compiler.models.errors import ModelError

MAGIC = b"GGUF"
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_MAX_COUNT = 1 << 26  # tensors, key-values, or elements of one array: beyond any real model's
_MAX_STRING = 1 << 26
FORMAT = "qrc-gguf-source-v1"
DEQUANTIZED_SLICE = 8 << 20  # bytes of float32 values dequantized at a time (read_tensor)

# llama.cpp's architecture name → the transformers model whose layout the file has
ARCHITECTURES = {"llama": ("llama", "LlamaForCausalLM"), "mistral": ("mistral", "MistralForCausalLM"),
                 "qwen2": ("qwen2", "Qwen2ForCausalLM"), "qwen3": ("qwen3", "Qwen3ForCausalLM")}
# the block tensors: GGUF name → transformers name (under model.layers.N)
_BLOCK = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
          "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
          "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
          "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


@dataclass(frozen=True, slots=True)
class GgufTensor:
    """One tensor of the file: its GGUF name, its shape as torch has it (outermost first), its GGML type and
    where its bytes are."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    start: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class GgufHeader:
    """The file's key-values (arrays of strings in full, other arrays as their length) and tensors."""

    path: Path
    values: dict
    tensors: tuple[GgufTensor, ...]

    @property
    def architecture(self) -> str:
        """llama.cpp's name of the model's architecture (`llama`, `qwen2`, …)."""
        return str(self.values.get("general.architecture", ""))

    def number(self, key: str, default=None):
        """`ARCH.key` (e.g. `llama.block_count`)."""
        return self.values.get(f"{self.architecture}.{key}", default)


class _Reader:
    def __init__(self, handle):
        self.handle = handle

    def take(self, fmt: str):
        width = struct.calcsize(fmt)
        data = self.handle.read(width)
        if len(data) != width:
            raise ValueError("the header ends early")
        return struct.unpack(fmt, data)[0]

    def string(self) -> str:
        length = self.take("<Q")
        if length > _MAX_STRING:
            raise ValueError(f"a string of {length:,} bytes")
        data = self.handle.read(length)
        if len(data) != length:
            raise ValueError("the header ends early")
        return data.decode("utf-8", errors="replace")

    def value(self, kind: int, keep_strings: bool):
        if kind in _SCALARS:
            return self.take(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind != _ARRAY:
            raise ValueError(f"a value of unknown type {kind}")
        inner, count = self.take("<I"), self.take("<Q")
        if count > _MAX_COUNT:
            raise ValueError(f"an array of {count:,} elements")
        if inner == _STRING:
            return [self.string() for _ in range(count)]
        if inner in _SCALARS and inner != 7:
            width = struct.calcsize(_SCALARS[inner])
            data = self.handle.read(width * count)
            if len(data) != width * count:
                raise ValueError("the header ends early")
            return list(struct.unpack(f"<{count}{_SCALARS[inner][1]}", data)) if keep_strings else count
        return [self.value(inner, keep_strings) for _ in range(count)]


# the last file's header, parsed once a process: check, plan and the compile's reads each ask for it
_parsed: dict[tuple, GgufHeader] = {}


def read_header(path: Path, ref: str) -> GgufHeader:
    """The key-values and tensor infos of the GGUF file at `path` (Q271 for a file that is not one)."""
    from compiler.safe_files import regular_input

    if not regular_input(path):
        raise ModelError("Q271", f"`{ref}` is not a regular file", "give the path of a .gguf file")
    try:
        with open(path, "rb") as handle:
            stat = os.fstat(handle.fileno())
            size, version_key = stat.st_size, (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
            if (parsed := _parsed.get(version_key)) is not None:
                return parsed if parsed.path == path else replace(parsed, path=path)
            reader = _Reader(handle)
            if handle.read(4) != MAGIC:
                raise ValueError("it does not begin with GGUF's magic bytes")
            version, count, kv_count = reader.take("<I"), reader.take("<Q"), reader.take("<Q")
            if version not in (2, 3) or count > _MAX_COUNT or kv_count > _MAX_COUNT:
                raise ValueError(f"version {version} with {count:,} tensors and {kv_count:,} key-values")
            values = {}
            for _ in range(kv_count):
                key = reader.string()
                values[key] = reader.value(reader.take("<I"), keep_strings=key.startswith("tokenizer.ggml."))
            infos = []
            for _ in range(count):
                name, dims = reader.string(), reader.take("<I")
                if dims > 4:
                    raise ValueError(f"tensor `{name}` has {dims} dimensions")
                shape = tuple(reader.take("<Q") for _ in range(dims))
                infos.append((name, shape, reader.take("<I"), reader.take("<Q")))
            alignment = int(values.get("general.alignment", 32)) or 32
            data_start = -(-handle.tell() // alignment) * alignment
    except (OSError, ValueError, UnicodeDecodeError, struct.error) as exc:
        raise ModelError("Q271", f"`{ref}` is not a readable GGUF file ({exc})", "give a .gguf file llama.cpp "
                         "wrote (GGUF version 2 or 3)") from None
    tensors = tuple(_tensor(name, shape, kind, data_start + offset, ref, size) for name, shape, kind, offset in infos)
    header = GgufHeader(path, values, tensors)
    _parsed.clear()  # one file's at a time: a header holds its whole vocabulary
    _parsed[version_key] = header
    return header


def _tensor(name: str, dims: tuple[int, ...], kind: int, start: int, ref: str, size: int) -> GgufTensor:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        ggml = GGMLQuantizationType(kind)
        block, width = GGML_QUANT_SIZES[ggml]
    except (ValueError, KeyError):
        raise ModelError("Q271", f"`{ref}`: tensor `{name}` has GGML type {kind}, which the gguf package does not "
                         "know", "update the gguf package, or convert the file with a llama.cpp of its time") from None
    count = math.prod(dims)
    if dims and dims[0] % block:
        raise ModelError("Q271", f"`{ref}`: tensor `{name}` rows of {dims[0]} are no whole {ggml.name} blocks of "
                         f"{block}", "the file is damaged")
    nbytes = count // block * width
    if start + nbytes > size:
        raise ModelError("Q271", f"`{ref}`: tensor `{name}` lies past the end of the file", "the file is truncated")
    return GgufTensor(name, tuple(reversed(dims)), kind, start, nbytes)


def hf_name(header: GgufHeader, tensor: GgufTensor) -> str | None:
    """The transformers name of a tensor (None for one this layout does not have)."""
    stem, _, leaf = tensor.name.rpartition(".")
    if stem in _TOP:
        return f"{_TOP[stem]}.{leaf}"
    parts = stem.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _BLOCK:
        return f"model.layers.{int(parts[1])}.{_BLOCK[parts[2]]}.{leaf}"
    return None


def permuted_heads(header: GgufHeader, name: str) -> int | None:
    """For a Llama-layout Q or K projection, the head count llama.cpp's converter permuted its rows by (to its
    rotary layout), which reading it back undoes; None for every other tensor."""
    if header.architecture not in ("llama", "mistral"):
        return None
    if name.endswith("self_attn.q_proj.weight"):
        return int(header.number("attention.head_count"))
    if name.endswith("self_attn.k_proj.weight"):
        return int(header.number("attention.head_count_kv") or header.number("attention.head_count"))
    return None


def hf_config(header: GgufHeader, ref: str) -> dict:
    """config.json's numbers from the key-values (Q271 for an architecture this does not know)."""
    arch = header.architecture
    if arch not in ARCHITECTURES:
        raise ModelError("Q271", f"`{ref}` holds a `{arch}` model; qrc reads GGUF files of "
                         f"{', '.join(sorted(ARCHITECTURES))}", "convert the original folder instead, or a file of one "
                         "of those architectures")
    model_type, architecture = ARCHITECTURES[arch]
    heads = int(header.number("attention.head_count"))
    hidden = int(header.number("embedding_length"))
    names = {t.name for t in header.tensors}
    config = {
        "architectures": [architecture], "model_type": model_type,
        "hidden_size": hidden, "intermediate_size": int(header.number("feed_forward_length")),
        "num_hidden_layers": int(header.number("block_count")), "num_attention_heads": heads,
        "num_key_value_heads": int(header.number("attention.head_count_kv", heads)),
        "head_dim": int(header.number("attention.key_length", header.number("rope.dimension_count", hidden // heads))),
        "max_position_embeddings": int(header.number("context_length", 4096)),
        "rms_norm_eps": float(header.number("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(header.number("rope.freq_base", 10000.0)),
        "vocab_size": int(header.number("vocab_size") or _vocabulary_size(header)),
        "tie_word_embeddings": "output.weight" not in names,
        "torch_dtype": "float32",  # dequantized: every GGML grid's values are float32's
        "attention_bias": any(n.endswith("attn_q.bias") for n in names),
    }
    for key, name in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                      ("pad_token_id", "padding_token_id")):
        if isinstance(header.values.get(f"tokenizer.ggml.{name}"), int):
            config[key] = header.values[f"tokenizer.ggml.{name}"]
    return config


def _vocabulary_size(header: GgufHeader) -> int:
    tokens = header.values.get("tokenizer.ggml.tokens")
    return len(tokens) if isinstance(tokens, list) else 0


def side_folder(path: Path, ref: str) -> Path:
    """The folder qrc reads a GGUF file's model as: config.json, the tokenizer and generation config, written
    into qrc's cache on first use (one per file version); the weights stay in the file."""
    from compiler.models.builtin import cache_dir

    stat = path.stat()
    key = hashlib.sha256(f"{FORMAT}|{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:20]
    folder = cache_dir() / "gguf" / f"{path.stem[:60]}-{key}"
    if (folder / "config.json").is_file() and not folder.is_symlink() and cache_entries.use(folder):
        return folder  # held until the compile ends: no other run's pruning removes it
    header = read_header(path, ref)
    files = {"config.json": json.dumps(hf_config(header, ref), indent=2, sort_keys=True) + "\n"}
    files.update(_tokenizer_files(header, ref))
    files[cache_entries.ENTRY_FILE] = "a GGUF file's side folder, made by qrc: removed past $QRC_CACHE_LIMIT\n"
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.qrc-"))
    try:
        for name, text in files.items():
            (staging / name).write_text(text, encoding="utf-8")
        try:
            os.replace(staging, folder)
        except OSError:  # another compile made it meanwhile: theirs is the same
            if not (folder / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return cache_entries.made(folder)


def _tokenizer_files(header: GgufHeader, ref: str) -> dict[str, str]:
    """tokenizer.json, tokenizer_config.json (special tokens, chat template) and generation_config.json for a
    byte-level BPE vocabulary (`tokenizer.ggml.model` gpt2: Llama 3, Qwen, SmolLM)."""
    values = header.values
    kind = values.get("tokenizer.ggml.model")
    tokens, merges = values.get("tokenizer.ggml.tokens"), values.get("tokenizer.ggml.merges")
    if kind != "gpt2" or not isinstance(tokens, list) or not isinstance(merges, list):
        raise ModelError("Q271", f"`{ref}` has a `{kind}` vocabulary; qrc rebuilds byte-level BPE ones (gpt2) from "
                         "a GGUF file", "convert the original folder instead")
    from compiler.models.gguf_tokenizer import byte_level_bpe

    tokenizer = byte_level_bpe(tokens, merges, values.get("tokenizer.ggml.token_type"),
                               str(values.get("tokenizer.ggml.pre", "")))
    special = {}
    for name, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"), ("unk_token", "unknown_token_id"),
                      ("pad_token", "padding_token_id")):
        index = values.get(f"tokenizer.ggml.{key}")
        if isinstance(index, int) and 0 <= index < len(tokens):
            special[name] = tokens[index]
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": int(header.number("context_length",
                                                                                                    4096)),
              "add_bos_token": bool(values.get("tokenizer.ggml.add_bos_token", False)),
              "add_eos_token": bool(values.get("tokenizer.ggml.add_eos_token", False)), **special}
    files = {"tokenizer.json": tokenizer, "tokenizer_config.json": json.dumps(config, indent=2, sort_keys=True) + "\n"}
    template = values.get("tokenizer.chat_template")
    if isinstance(template, str) and template:
        files["chat_template.jinja"] = template
    generation = {k: values[f"tokenizer.ggml.{v}"] for k, v in (("bos_token_id", "bos_token_id"),
                                                                ("eos_token_id", "eos_token_id"))
                  if isinstance(values.get(f"tokenizer.ggml.{v}"), int)}
    files["generation_config.json"] = json.dumps(generation, indent=2, sort_keys=True) + "\n"
    return files


def gguf_in(folder: Path) -> Path | None:
    """The one .gguf file of a folder that has no config.json (a folder holding a GGUF model), else None."""
    if (folder / "config.json").exists():
        return None
    found = sorted(folder.glob("*.gguf"))
    return found[0] if len(found) == 1 else None


def hf_headers(header: GgufHeader, ref: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Every tensor as the side folder's model names it, with the dtype qrc reads it in (float32, dequantized)
    and its shape; Q271 for a tensor this layout has no name for (its meaning would be lost)."""
    found = {}
    for tensor in header.tensors:
        name = hf_name(header, tensor)
        if name is None:
            raise ModelError("Q271", f"`{ref}`: tensor `{tensor.name}` has no place in the {header.architecture} "
                             "layout qrc reads GGUF files as", "convert the original folder instead")
        found[name] = ("float32", tensor.shape)
    return found


# GGML types whose values are stored as they are read (F32, F16, BF16); every other type is blocks to decode
UNBLOCKED_TYPES = frozenset({0, 1, 30})


def block_stored(header: GgufHeader) -> tuple[str, ...]:
    """The tensors (as the side folder's model names them) stored in GGML blocks, which every read decodes (the
    plan's time counts them)."""
    return tuple(name for tensor in header.tensors if tensor.ggml_type not in UNBLOCKED_TYPES
                 and (name := hf_name(header, tensor)) is not None)


def read_tensor(header: GgufHeader, tensor: GgufTensor, name: str):
    """One tensor's values as transformers has them: its GGML blocks dequantized to float32 by the gguf package
    (every type it knows; NotImplementedError for one it cannot), Q/K rows put back in transformers' order.
    Reads that tensor's bytes only."""
    import numpy as np

    rows = tensor.shape[0] if len(tensor.shape) > 1 else 1
    flat = np.empty((rows, math.prod(tensor.shape) // rows), np.float32)
    for start, values in _dequantized_rows(header, tensor, name):
        flat[start:start + len(values)] = values
    values = flat.reshape(tensor.shape)
    heads = permuted_heads(header, name)
    return _unpermuted(values, heads) if heads else values


def row_slices(header: GgufHeader, tensor: GgufTensor, name: str):
    """The tensor as read_tensor gives it, a slice of rows at a time: (first row, float32 rows), so a tensor only
    copied is never whole in memory (SmolLM2-135M's 108 MiB embedding, written file to file beside the rounding).
    A Q/K weight, whose heads' rows are reordered, comes whole."""
    if permuted_heads(header, name) or len(tensor.shape) < 2:
        yield 0, read_tensor(header, tensor, name)
        return
    for start, values in _dequantized_rows(header, tensor, name):
        yield start, values.reshape(len(values), *tensor.shape[1:])


def _dequantized_rows(header: GgufHeader, tensor: GgufTensor, name: str):
    """(first row, float32 values of a slice of rows as a rows × width array), DEQUANTIZED_SLICE bytes of them at a
    time: the gguf package's dequantization makes several temporaries of its input's size (SmolLM2-135M's 108 MiB
    embedding peaked 308 MiB above the run whole, against its own float32 copy). Each slice's bytes are read as
    it comes."""
    import numpy as np
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize

    rows = tensor.shape[0] if len(tensor.shape) > 1 else 1
    width = math.prod(tensor.shape) // rows
    row_bytes = tensor.nbytes // rows  # GGML blocks never straddle rows
    kind = GGMLQuantizationType(tensor.ggml_type)
    step = max(1, DEQUANTIZED_SLICE // max(width * 4, 1))
    fd = os.open(header.path, os.O_RDONLY)
    try:
        for start in range(0, rows, step):
            count = min(step, rows - start)
            data = os.pread(fd, count * row_bytes, tensor.start + start * row_bytes)
            if len(data) != count * row_bytes:
                raise OSError(f"`{header.path.name}` ends inside tensor `{name}`")
            raw = np.frombuffer(data, np.uint8).reshape(count, row_bytes)
            yield start, dequantize(raw, kind).reshape(count, width)
    finally:
        os.close(fd)


def _unpermuted(weight, heads: int):
    """llama.cpp's converter stores each head's rows with the two rotary halves interleaved (it reshapes to
    heads × 2 × half and swaps the middle axes); the inverse swap gives transformers' order back."""
    rows = weight.shape[0]
    return weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def float_folder(path: Path, ref: str, create: bool = True) -> Path | None:
    """The GGUF model as a float32 safetensors folder (the side folder's files and model.safetensors), for
    what needs one on disk: the ONNX export loads a folder whole with transformers. Written once per file version
    into qrc's cache, one tensor at a time (safetensors' layout written by hand: its own writer takes the whole
    dict at once); None when it is not there and `create` is False (planning reads no weights)."""
    side = side_folder(path, ref)
    folder = side.with_name(side.name + "-float32")
    if (folder / "model.safetensors").is_file() and not folder.is_symlink() and (not create or cache_entries.use(folder)):
        return folder  # planning only looks; a compile holds it until it ends
    if not create:
        return None
    header = read_header(path, ref)
    named = [(hf_name(header, t), t) for t in header.tensors]
    staging = Path(tempfile.mkdtemp(dir=side.parent, prefix=f".{folder.name}.qrc-"))
    try:
        for item in side.iterdir():
            shutil.copyfile(item, staging / item.name)
        _write_safetensors(staging / "model.safetensors", header, [(n, t) for n, t in named if n is not None])
        try:
            os.replace(staging, folder)
        except OSError:  # another compile made it meanwhile
            if not (folder / "model.safetensors").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return cache_entries.made(folder)


def _write_safetensors(target: Path, header: GgufHeader, tensors: list[tuple[str, GgufTensor]]) -> None:
    """safetensors' format: an 8-byte header length, the JSON header (names sorted, float32), then each tensor's
    bytes in that order; every tensor is read, dequantized and written before the next."""
    ordered = sorted(tensors, key=lambda item: item[0])
    described: dict[str, dict] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, tensor in ordered:
        size = 4 * math.prod(tensor.shape)
        described[name] = {"dtype": "F32", "shape": list(tensor.shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(described, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(target, "wb") as handle:
        handle.write(struct.pack("<Q", len(text)) + text)
        for name, tensor in ordered:
            handle.write(read_tensor(header, tensor, name).tobytes())
