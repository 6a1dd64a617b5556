"""Streaming GGUF output: the header, key-values and every tensor's name, type, shape and offset are written
first (all known from the plan), then each tensor goes to its offset as soon as it exists, one at a time, like
the safetensors writer. The file appears atomically.

The header is the `gguf` package's (llama.cpp's own writer); the tensor data is written here, at the offsets
that writer gives (data aligned to `general.alignment`), because the package writes tensors in one pass in
header order and so would hold every rounded tensor until the last is done."""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import torch

from compiler.backends.emitter import Emitter, Spec
from compiler.backends.torch.float_formats import FloatQuantized
from compiler.backends.torch.gguf_metadata import add_hparams, add_tokenizer, text_config
from compiler.backends.torch.gguf_types import ARCHITECTURES, UNSCALED_EXPERTS, GgufType, gguf_type, merged_expert
from compiler.backends.torch.gguf_views import FilePart, file_parts
from compiler.backends.torch.layers import Job
from compiler.backends.torch.model import TorchModel
from compiler.ir.types import Rounding
from compiler.quant.kquants import GgufBlocks, quantize_reference
from compiler.quant.weights import QuantizedWeight
from compiler.safe_files import file_mode, open_regular

_GGML = {t: gguf.GGMLQuantizationType[t.value] for t in GgufType}
_FLOATS = {torch.float32: GgufType.F32, torch.float16: GgufType.F16, torch.bfloat16: GgufType.BF16}
_TORCH = {GgufType.F32: torch.float32, GgufType.F16: torch.float16, GgufType.BF16: torch.bfloat16}
_FILE_TYPES = {GgufType.F32: gguf.LlamaFileType.ALL_F32, GgufType.F16: gguf.LlamaFileType.MOSTLY_F16,
               GgufType.BF16: gguf.LlamaFileType.MOSTLY_BF16, GgufType.Q8_0: gguf.LlamaFileType.MOSTLY_Q8_0,
               GgufType.Q4_0: gguf.LlamaFileType.MOSTLY_Q4_0, GgufType.Q4_K: gguf.LlamaFileType.MOSTLY_Q4_K_M,
               GgufType.Q5_K: gguf.LlamaFileType.MOSTLY_Q5_K_M, GgufType.Q6_K: gguf.LlamaFileType.MOSTLY_Q6_K,
               GgufType.MXFP4: gguf.LlamaFileType.MOSTLY_MXFP4_MOE, GgufType.NVFP4: gguf.LlamaFileType.MOSTLY_NVFP4}
# an NVFP4 tensor's per-tensor scale (compressed-tensors' global scale, inverted: llama.cpp multiplies by it), by
# the weight's transformers name with this suffix
SCALE = ".scale"


@dataclass(frozen=True)
class GgufTensor:
    """One tensor of the file: its GGUF name, type, [rows, columns] (or [n]; [experts, rows, columns] merged)
    shape, and whether its rows are reordered for llama.cpp's RoPE (the heads of a Llama q/k projection). An MoE
    expert's projection is `part` of the `parts` equal slices of a merged tensor (`ffn_gate_exps`: each
    expert's rows one after the other)."""
    name: str
    type: GgufType
    shape: tuple[int, ...]
    heads: int | None = None
    part: int = 0
    parts: int = 1

    @property
    def nbytes(self) -> int:
        """Its bytes in the file (whole blocks; the whole merged tensor)."""
        block, size = gguf.GGML_QUANT_SIZES[_GGML[self.type]]
        return int(np.prod(self.shape)) // block * size

    @property
    def part_bytes(self) -> int:
        """The bytes of this tensor's slice (all of them, unless it is one expert of a merged tensor)."""
        return self.nbytes // self.parts


class GgufLayout:
    """Every tensor of a Llama/Qwen decoder's (or Mixtral's, Qwen3-MoE's) GGUF file by its transformers name (checkpoint tensors, and the
    rounded layers by their job), and each one's bytes there. It opens no file, so every torchrun rank has one:
    the ranks but the first encode what they round and hand the bytes to the first, whose GgufWriter writes
    them where the layout puts them (the bytes of one process)."""

    def __init__(self, model: TorchModel, jobs: list[Job], packed: tuple[str, ...] = ()):
        """`packed`: the checkpoint's tensors an MXFP4 source stores packed (the index's `packed_experts`), which
        the file keeps MXFP4."""
        assert model.folder is not None  # gguf_check: an HF folder
        self.config = text_config(model.config)
        self.arch = ARCHITECTURES[model.config["model_type"]]
        # transformers name → its GGUF tensor; a checkpoint tensor → the file tensors made from it (gguf_views.py)
        self.tensors, self.parts = _layout(model, jobs, self.config, self.arch, frozenset(packed))
        # NVFP4 layers without a `.scale` in the file (gguf_types.UNSCALED_EXPERTS): rounded with a global scale of 1
        self.unit_global = frozenset(j.layer.name for j in jobs if self.tensors[j.output_weight].type is GgufType.NVFP4
                                     and j.output_weight + SCALE not in self.tensors)

    def float_bytes(self, name: str, tensor: torch.Tensor) -> np.ndarray:
        """A float tensor of the checkpoint (by its transformers name) in its GGUF type, as bytes: a float type, or
        MXFP4 for an MXFP4 source's experts (their values exactly: each block's scale the power of two that puts
        its largest magnitude on e2m1's [4, 6], the gguf package's encoding)."""
        t = self.tensors[name]
        if t.type is GgufType.MXFP4:
            encoded = gguf.quants.quantize(tensor.detach().float().cpu().contiguous().numpy(), _GGML[t.type])
            return encoded.reshape(-1)
        assert t.type in _TORCH, f"{name}: a float tensor where the layout has {t.type.value}"
        data = tensor.detach().cpu().to(_TORCH[t.type]).contiguous()
        if t.heads:
            data = _rope_rows(data, t.heads)
        return data.reshape(-1).view(torch.uint8).numpy()

    def rounded_tensors(self, job: Job, q: QuantizedWeight | GgufBlocks | FloatQuantized) -> dict[str, np.ndarray]:
        """A rounded layer's file tensors as bytes, by transformers name: its blocks (the values qrc's model
        computes with: float16 scales and integers, or e2m1 codes and their scales) and, for NVFP4, its `.scale`."""
        t = self.tensors[job.output_weight]
        scale = None
        if isinstance(q, FloatQuantized):
            rows, scale = _float_blocks(q, t.type)
        else:
            rows = q.packed if isinstance(q, GgufBlocks) else _blocks(q, t.type)
        if t.heads:
            rows = _rope_rows(torch.from_numpy(rows), t.heads).numpy()
        tensors = {job.output_weight: rows.reshape(-1)}
        if scale is not None and job.output_weight + SCALE in self.tensors:
            tensors[job.output_weight + SCALE] = np.array([scale], np.float32).view(np.uint8)
        elif scale is not None:  # a runtime that reads no scale: the rounding took the global scale 1
            assert scale == 1.0, f"{job.layer.name}: NVFP4 global scale {scale} where the file holds none"
        return tensors

    def reference_blocks(self, job: Job, weight: torch.Tensor) -> GgufBlocks | None:
        """Q4_0 and Q8_0 rounded with rtn: llama.cpp's own reference rounding of them (its Q4_0 uses all 16
        levels, where qrc's symmetric int4 grid uses 15), so the file is the one llama-quantize writes; None for
        the other roundings and types (qrc's)."""
        kind = self.tensors[job.output_weight].type
        if job.scheme.rounding is not Rounding.RTN or kind not in (GgufType.Q4_0, GgufType.Q8_0):
            return None
        return quantize_reference(weight.detach().float().cpu().numpy(), kind.value)


class GgufWriter(Emitter):
    """The GGUF emitter (compiler.backends.emitter.Emitter) of a `layout`: its header written first, then each
    tensor at its offset as it comes."""

    def __init__(self, destination: Path, model: TorchModel, layout: GgufLayout, staged: Path | None = None,
                 reopen: bool = False, provenance: tuple[tuple[str, str], ...] = ()):
        """`staged`: the staged file of a resumable run (torch/resume.py), kept when the run stops; `reopen`: an
        earlier run's, whose tensors written so far stay (its header must be this one, byte for byte).
        `provenance`: the plan's (recipe name and hash), key-values of the header: they also mark the file as
        qrc's, so a later compile may replace it (outputs.foreign_destination)."""
        assert model.folder is not None  # gguf_check: an HF folder
        self.destination, self.layout = destination, layout
        destination.parent.mkdir(parents=True, exist_ok=True)
        self.tensors = layout.tensors
        fd, temp = tempfile.mkstemp(dir=destination.parent, prefix=f".{destination.name}.qrc-tmp-", suffix=".gguf")
        os.close(fd)
        self.temp = Path(temp)
        os.chmod(self.temp, file_mode())  # under the umask, as the folder writer's files (mkstemp makes it private)
        header = gguf.GGUFWriter(self.temp, layout.arch)
        add_hparams(header, model.config, model.folder.name, _file_type(self.tensors.values()), layout.arch)
        add_tokenizer(header, model.folder, int(layout.config["vocab_size"]))
        for key, value in provenance:
            header.add_string(key, value)
        self.merged = {t.name: t for t in self.tensors.values()}  # each file tensor once (experts share one)
        for t in self.merged.values():
            header.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes, raw_dtype=_GGML[t.type])
        header.write_header_to_file()
        header.write_kv_data_to_file()
        header.write_ti_data_to_file()
        assert header.fout is not None
        position = header.fout[0].tell()
        header.close()
        pad = header.data_alignment
        starts, offset = {}, gguf.GGUFWriter.ggml_pad(position, pad)
        for name, t in self.merged.items():  # the offsets write_ti_data_to_file wrote, in its order
            starts[name] = offset
            offset += gguf.GGUFWriter.ggml_pad(t.nbytes, pad)
        # each transformers tensor's bytes (an expert's: its slice of the merged tensor)
        self.where = {key: starts[t.name] + t.part * t.part_bytes for key, t in self.tensors.items()}
        self.keep = False  # a resumable run's state points at the staged file: `abort` leaves it
        if staged is not None:
            if reopen:
                _same_start(self.temp, staged, position, offset)
                self.temp.unlink()
            else:
                self.temp.replace(staged)
            self.temp = staged
        self.fd: int | None = open_regular(self.temp, os.O_RDWR, create=False)
        if not reopen:
            os.ftruncate(self.fd, offset)
        self.missing = set(self.tensors)

    def specs(self) -> list[Spec[GgufType]]:
        """Every tensor of the file (GGUF names and types), in header order."""
        return [Spec(t.name, t.type, t.shape) for t in self.merged.values()]

    def put(self, name: str, tensor: torch.Tensor) -> None:
        """A float tensor of the checkpoint (by its transformers name), in its GGUF type: each file tensor made
        from it."""
        for part in self.layout.parts.get(name) or file_parts(self.layout.arch, name, tuple(tensor.shape)):
            self.put_encoded(part.key, self.layout.float_bytes(part.key, part.take(tensor)))

    def put_float(self, name: str, tensor: torch.Tensor) -> None:
        """A float tensor of the model (a transform rewrote it), converted to its GGUF type."""
        self.put(name, tensor)

    def put_encoded(self, name: str, data: np.ndarray) -> None:
        """A tensor's bytes as the layout encoded them (here, or on another rank), at its offset."""
        assert self.fd is not None
        t = self.tensors[name]
        if data.nbytes != t.part_bytes:
            raise ValueError(f"{name}: {data.nbytes} bytes where the layout has {t.part_bytes}")
        written, offset = 0, self.where[name]
        while written < data.nbytes:
            written += os.pwrite(self.fd, data[written:].data, offset + written)
        self.missing.discard(name)

    def copy_unquantized(self, model: TorchModel, jobs: list[Job]) -> None:
        """Every checkpoint tensor no layer replaced, read and written in its GGUF type."""
        parts = self.layout.parts
        for key in [k for k in model.shards.entries if any(p.key in self.missing for p in parts.get(k, ()))]:
            self.put(key, model.shards.read(key))

    def copy_raw(self, name: str, *args: object, **kwargs: object) -> None:
        """Never called: GGUF's float types are converted (copy_unquantized), not copied as bytes."""
        raise NotImplementedError("GGUF tensors are converted, not copied")

    def metadata(self, key: str, value: str) -> None:
        """Nothing: the key-values are in the header, written first."""

    def finish(self) -> list[Path]:
        """Check every tensor was written; the file stays staged until `commit` (not fsynced: FolderWriter.finish)."""
        if self.missing:
            raise ValueError(f"{len(self.missing)} tensors were never written (e.g. {sorted(self.missing)[0]})")
        assert self.fd is not None
        os.close(self.fd)
        self.fd = None
        return [self.temp]

    def commit(self) -> list[Path]:
        """The file into place (replacing an earlier output)."""
        self.temp.replace(self.destination)
        return [self.destination]

    def abort(self) -> None:
        """Remove the staged file (unless a resume state keeps it): nothing appears at the destination."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if not self.keep:
            self.temp.unlink(missing_ok=True)

    def written(self) -> list[str]:
        """The tensors written so far (by transformers name)."""
        return sorted(set(self.tensors) - self.missing)


def _same_start(header: Path, staged: Path, length: int, size: int) -> None:
    """An earlier run's staged file begins with the same `length` bytes as `header` (the header, key-values and
    tensor infos this run wrote) and has the whole file's `size`: else it is another layout's."""
    with open(header, "rb") as mine, open(staged, "rb") as theirs:
        same = mine.read(length) == theirs.read(length)
    if not same or staged.stat().st_size != size:
        raise ValueError("the staged GGUF file an earlier run left has another layout")


def _layout(model: TorchModel, jobs: list[Job], config: dict, arch: str,
            packed: frozenset[str]) -> tuple[dict[str, GgufTensor], dict[str, list[FilePart]]]:
    """Each output tensor by its transformers name: checkpoint tensors under llama.cpp's names, the rounded
    layers' in their GGUF type (a tied head a rule rounds gets `output.weight` of its own), an MoE block's
    experts as slices of its merged tensors (gguf_check gave every expert of one the same type), its router and
    biases in float32, as llama.cpp's converter writes them; an MXFP4 source's experts MXFP4. Beside it, the file
    tensors each checkpoint tensor becomes (gguf_views.py: gpt-oss's fused experts split)."""
    by_name = {value: key for key, value in gguf.MODEL_ARCH_NAMES.items()}
    names = gguf.get_tensor_name_map(by_name[arch], int(config["num_hidden_layers"]))
    rounded = {j.output_weight: j for j in jobs}
    heads = int(config["num_attention_heads"])
    rope_heads = {"self_attn.q_proj": heads, "self_attn.k_proj": int(config.get("num_key_value_heads") or heads)}
    layout = {}
    shapes = {key: entry.shape for key, entry in model.shards.entries.items()}
    shapes.update({key: tuple(j.layer.shape) for key, j in rounded.items()})
    experts = Counter(merged[0] for key in shapes if (merged := merged_expert(key)) is not None)
    parts_of: dict[str, list[FilePart]] = {}
    for key, stored in shapes.items():
        parts_of[key] = file_parts(arch, key, tuple(stored))
        module = key.rsplit(".", 1)[0]
        reordered = next((n for suffix, n in rope_heads.items() if module.endswith(suffix)), None)
        reordered = reordered if arch == "llama" else None
        for part in parts_of[key]:
            layout[part.key] = _file_tensor(part, names, arch, rounded.get(key), experts, model.dtype, key in packed,
                                            reordered)
            unscaled = arch in UNSCALED_EXPERTS and merged_expert(part.key) is not None
            if layout[part.key].type is GgufType.NVFP4 and not unscaled:
                layout[part.key + SCALE] = _scale_tensor(layout[part.key])
    return layout, parts_of


def _scale_tensor(weight: GgufTensor) -> GgufTensor:
    """The F32 `.scale` beside an NVFP4 tensor (as llama.cpp's converter names it): one value, or one per expert
    of a merged tensor, this expert's its slot."""
    name = weight.name.removesuffix(".weight") + SCALE
    return GgufTensor(name, GgufType.F32, (weight.parts,) if weight.parts > 1 else (1,), None, weight.part,
                      weight.parts)


def _file_tensor(part: FilePart, names, arch: str, job: Job | None, experts: Counter, dtype: torch.dtype,
                 packed: bool, heads: int | None) -> GgufTensor:
    """The file tensor of `part`: its llama.cpp name, its type (`job`'s rounding; float32 for vectors, biases and
    an MoE router; MXFP4 where the source `packed` it so; else the model's float type), its `heads` whose rows
    are reordered for llama.cpp's RoPE (a Llama q/k projection's), and its slice of a merged expert tensor."""
    key, shape = part.key, part.shape
    merged = merged_expert(key)
    name = names.get_name(merged[0] if merged else key, try_suffixes=(".weight", ".bias"))
    if name is None:
        raise ValueError(f"`{key}` has no tensor in llama.cpp's {arch} graph")
    kind = gguf_type(job.scheme) if job is not None else GgufType.F32 if len(shape) < 2 or \
        name.endswith(("ffn_gate_inp.weight", ".bias")) else GgufType.MXFP4 if packed else \
        _FLOATS.get(dtype, GgufType.F32)
    assert isinstance(kind, GgufType), kind  # gguf_check refused the schemes that are no GGUF type
    if merged is None:
        return GgufTensor(name, kind, tuple(shape), heads)
    count = experts[merged[0]]
    return GgufTensor(name, kind, (count, *shape), heads, merged[1], count)


def _file_type(tensors) -> int:
    """`general.file_type`: the type most of the matrices have (llama.cpp shows it; nothing reads it)."""
    counts = Counter(t.type for t in tensors if len(t.shape) > 1)
    return int(_FILE_TYPES[counts.most_common(1)[0][0]]) if counts else int(gguf.LlamaFileType.ALL_F32)


def _blocks(q: QuantizedWeight, kind: GgufType) -> np.ndarray:
    """[rows, blocks × block bytes] of a symmetric group-32 rounding: each block its float16 scale, then its
    integers (Q8_0: int8; Q4_0: stored +8, two to a byte, the block's first half in the low nibbles)."""
    rows, columns = q.q.shape
    scale = q.scale.astype(np.float16).reshape(rows, columns // 32, 1).view(np.uint8)
    ints = q.q.reshape(rows, columns // 32, 32)
    packed: np.ndarray
    if kind is GgufType.Q8_0:
        packed = ints.astype(np.int8).view(np.uint8)
    else:
        shifted = (ints.astype(np.int16) + 8).astype(np.uint8)
        packed = shifted[..., :16] | (shifted[..., 16:] << 4)
    return np.concatenate([scale, packed], axis=-1).reshape(rows, -1)


def _float_blocks(q: FloatQuantized, kind: GgufType) -> tuple[np.ndarray, float | None]:
    """[rows, blocks × block bytes] of a weight compressed-tensors' rounding put in NVFP4 or MXFP4 (its e2m1 codes,
    two to a byte, the even column's in the low nibble), re-blocked as llama.cpp stores them, the same values:
    MXFP4's blocks of 32 each its e8m0 byte, then its first 16 codes in the low nibbles; NVFP4's super-blocks of 64
    each four scale bytes (E4M3 without its sign bit: llama.cpp's UE4M3), then per block of 16 its first 8 codes in
    the low nibbles. With NVFP4, the tensor's scale: the inverse of compressed-tensors' global scale."""
    packed = q.stored["weight_packed"].numpy()
    rows = packed.shape[0]
    codes = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(rows, -1)
    scales = q.stored["weight_scale"].view(torch.uint8).numpy()
    if kind is GgufType.MXFP4:
        blocks = codes.reshape(rows, -1, 32)
        return np.concatenate([scales.reshape(rows, -1, 1), blocks[..., :16] | (blocks[..., 16:] << 4)],
                              axis=-1).reshape(rows, -1), None
    assert kind is GgufType.NVFP4, kind
    quads = codes.reshape(rows, -1, 4, 16)
    nibbles = (quads[..., :8] | (quads[..., 8:] << 4)).reshape(rows, quads.shape[1], 32)
    ue4m3 = (scales & 0x7F).reshape(rows, -1, 4)
    return np.concatenate([ue4m3, nibbles], axis=-1).reshape(rows, -1), \
        1.0 / float(q.stored["weight_global_scale"].float().reshape(-1)[0])


def _rope_rows(rows: torch.Tensor, heads: int) -> torch.Tensor:
    """A Llama q/k projection's rows reordered for llama.cpp's RoPE, which rotates adjacent pairs where
    transformers rotates the two halves of each head (the reordering llama.cpp's converter applies)."""
    shape = rows.shape
    return rows.reshape(heads, 2, shape[0] // heads // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)
