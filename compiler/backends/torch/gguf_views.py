"""The file tensors a checkpoint tensor becomes in a GGUF where llama.cpp's graph holds it otherwise than
transformers does: gpt-oss's fused experts (gate and up interleaved along one axis, every matrix [in, out]) are
split and transposed into llama.cpp's `ffn_gate_exps`/`ffn_up_exps`/`ffn_down_exps` [experts, out, in] and their
biases, and its attention sinks take a `.weight`, as llama.cpp's own converter writes them. Every other tensor
is one file tensor of its own shape."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class FilePart:
    """One file tensor made from a checkpoint tensor: its transformers-style name (what llama.cpp's name map
    knows), its shape and how it is taken from the checkpoint tensor."""

    key: str
    shape: tuple[int, ...]
    take: Callable[[torch.Tensor], torch.Tensor]


def _whole(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _transposed(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.transpose(1, 2)


def _gate_rows(tensor: torch.Tensor) -> torch.Tensor:  # gpt-oss interleaves gate and up: gate the even columns
    return tensor.transpose(1, 2)[:, 0::2] if tensor.ndim == 3 else tensor[:, 0::2]


def _up_rows(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.transpose(1, 2)[:, 1::2] if tensor.ndim == 3 else tensor[:, 1::2]


def file_parts(arch: str, key: str, shape: tuple[int, ...]) -> list[FilePart]:
    """The file tensors `key` (of `shape`, as transformers holds it) becomes in llama.cpp's `arch` graph."""
    if arch != "gpt-oss":
        return [FilePart(key, shape, _whole)]
    stem, _, leaf = key.rpartition(".")
    if leaf == "sinks":
        return [FilePart(key + ".weight", shape, _whole)]
    if leaf == "gate_up_proj":  # [experts, in, 2 · inner]
        experts, columns, both = shape
        return [FilePart(f"{stem}.gate_proj.weight", (experts, both // 2, columns), _gate_rows),
                FilePart(f"{stem}.up_proj.weight", (experts, both // 2, columns), _up_rows)]
    if leaf == "gate_up_proj_bias":  # [experts, 2 · inner]
        return [FilePart(f"{stem}.gate_proj.bias", (shape[0], shape[1] // 2), _gate_rows),
                FilePart(f"{stem}.up_proj.bias", (shape[0], shape[1] // 2), _up_rows)]
    if leaf == "down_proj" and len(shape) == 3:  # [experts, inner, out]
        return [FilePart(f"{stem}.down_proj.weight", (shape[0], shape[2], shape[1]), _transposed)]
    if leaf == "down_proj_bias":
        return [FilePart(f"{stem}.down_proj.bias", shape, _whole)]
    return [FilePart(key, shape, _whole)]
