"""Layer names: ONNX node/initializer names → dotted module paths, blocks, and compact name lists."""

from __future__ import annotations

import re
from collections.abc import Iterable

# Trailing components that name an op, not a module: `/model/layers.0/self_attn/q_proj/MatMul_1`.
_OP_SUFFIX = re.compile(r"^(MatMul|Gemm|Conv|ConvTranspose|Gather|MatMulNBits|MatMulInteger|Add|Linear)(_\d+)?$")
_BLOCK = re.compile(r"^(.*?\b(?:layers|layer|h|blocks|block)\.\d+)\.")


def from_node_name(node_name: str) -> str | None:
    """`/model/layers.0/self_attn/q_proj/MatMul` → `model.layers.0.self_attn.q_proj` (None if unusable)."""
    parts = [p for p in node_name.strip("/").split("/") if p]
    if len(parts) >= 2 and _OP_SUFFIX.match(parts[-1]):
        parts = parts[:-1]
    elif len(parts) == 1:
        return None  # a bare op name such as `MatMul_12` names no module
    return ".".join(parts) or None


def from_weight_name(weight: str) -> str | None:
    """`model.layers.0.self_attn.q_proj.weight` → `model.layers.0.self_attn.q_proj` (None for `onnx::…`);
    onnxruntime-genai's builder names weights after their node (`model.layers.0.attn.q_proj.MatMul.weight`,
    `lm_head.MatMul.weight`): the op suffix goes too, so one recipe serves the builder's graph."""
    if weight.startswith("onnx::") or "::" in weight or not weight.endswith(".weight"):
        return None
    return weight[: -len(".weight")].removesuffix(".MatMul")


def block_of(name: str) -> str | None:
    """The block a module belongs to (`model.layers.3`), or None."""
    match = _BLOCK.match(name + ".")
    return match.group(1) if match else None


def natural_key(name: str) -> tuple:
    """Sort key that puts `layers.2` before `layers.10`."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


_NUMBER = re.compile(r"(?<=\.)(\d+)(?=\.|$)")  # a dotted component that is a number: `layers.7.`


def compress(names: Iterable[str]) -> list[str]:
    """Compact a list of layer names: `model.layers.[0-7].self_attn.{q,k,v}_proj`.

    Numbers that vary become ranges, then names that differ in one dotted component's suffix part
    become alternatives. The result is deterministic and keeps first-appearance order.
    """
    by_shape: dict[str, list[tuple[int, ...]]] = {}
    for name in names:
        parts = _NUMBER.split(name)  # one pass: the text between numbers at even places, the numbers at odd
        by_shape.setdefault("#".join(parts[::2]), []).append(tuple(int(n) for n in parts[1::2]))
    ranged = [_fill(shape, values) for shape, values in by_shape.items()]
    return _merge_alternatives([n for group in ranged for n in group])


def _fill(shape: str, values: list[tuple[int, ...]]) -> list[str]:
    if not values or not values[0]:
        return [shape]
    if len(values[0]) == 1:
        return [shape.replace("#", _ranges(sorted({v[0] for v in values})), 1)]
    # several numbers (nested blocks): range the last, keep the others
    heads: dict[tuple[int, ...], list[int]] = {}
    for v in values:
        heads.setdefault(v[:-1], []).append(v[-1])
    out: list[str] = []
    for head, tails in heads.items():
        text = shape
        for n in head:
            text = text.replace("#", str(n), 1)
        out.append(text.replace("#", _ranges(sorted(set(tails))), 1))
    return out


def _ranges(numbers: list[int]) -> str:
    if len(numbers) == 1:
        return str(numbers[0])
    spans, start = [], numbers[0]
    following: list[int | None] = [*numbers[1:], None]
    for prev, cur in zip(numbers, following, strict=True):
        if cur is None or cur != prev + 1:
            spans.append(f"{start}-{prev}" if prev != start else str(start))
            if cur is not None:
                start = cur
    return "[" + ",".join(spans) + "]"


def _merge_alternatives(names: list[str]) -> list[str]:
    """`a.q_proj`, `a.k_proj` → `a.{q,k}_proj` when they differ only before a shared suffix."""
    groups: dict[tuple[str, str], list[str]] = {}
    order: list[tuple[str, str]] = []
    for name in names:
        head, _, last = name.rpartition(".")
        stem, sep, suffix = last.partition("_")
        if sep:
            key = (head, sep + suffix)
        else:  # `query`, `key`, `value` under one parent → `parent.{query,key,value}`; top-level names stay
            key = (head, "") if head else (head, "\0" + last)
        if key not in groups:
            order.append(key)
        groups.setdefault(key, []).append(stem if sep else last)
    out: list[str] = []
    for head, suffix in order:
        stems = groups[(head, suffix)]
        prefix = f"{head}." if head else ""
        if suffix.startswith("\0") or len(stems) == 1:
            out.extend(f"{prefix}{s}{'' if suffix.startswith(chr(0)) else suffix}" for s in stems)
        else:
            out.append(f"{prefix}{{{','.join(stems)}}}{suffix}")
    return out


def attention_modules(layers: list[str]) -> list[str]:
    """The modules whose key and value projections fill a KV cache: parents of a `k_proj` and a `v_proj`
    (where compressed-tensors and vLLM put `k_scale`/`v_scale`)."""
    parents = {name.rpartition(".")[0] for name in layers if name.endswith(".k_proj")}
    return sorted(p for p in parents if f"{p}.v_proj" in layers)
