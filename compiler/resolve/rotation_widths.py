"""The widths a rotation turns (torch/rotation.py, onnx/rotation.py), from the model's index alone: what the plan's load op carries
and the cost model counts (no recipe, no torch)."""

from __future__ import annotations

from compiler.models import builtin
from compiler.models.index import ModelIndex

# (hidden width R1 turns, head width R2 turns or None, width R4 turns online or None, block of a block-diagonal
# R1 and R4 or None)
Widths = tuple[int, int | None, int | None, int | None]


def widths(index: ModelIndex) -> tuple[int, int | None]:
    """The hidden width R1 rotates and the head width R2 rotates (None where the index does not say it)."""
    hidden = index.norms[0].width if index.norms else 0
    if index.ref.startswith(builtin.PREFIX):
        spec = builtin.parse_ref(index.ref)[1]
        return hidden, getattr(spec, "head_dim", None)
    heads = index.config_value("num_attention_heads")
    kv_heads = index.config_value("num_key_value_heads") or heads
    value = next((x for x in index.layers if x.name.endswith("attn.v_proj")), None)
    if value is not None:
        return hidden, (value.out_features // int(kv_heads) if kv_heads else None)
    fused = next((x for x in index.layers if x.name.endswith("attn.qkv_proj")), None)  # q, k and v in one
    if fused is not None and heads and kv_heads:
        return hidden, fused.out_features // (int(heads) + 2 * int(kv_heads))
    return hidden, None


def down_width(index: ModelIndex) -> int | None:
    """The width R4 turns: the down projections' input (the MLP's intermediate width), None without one."""
    down = next((x for x in index.layers if x.name.endswith("mlp.down_proj")), None)
    return down.in_features if down is not None else None


def rotation_widths(index: ModelIndex, rotated: bool, online_width: int, block: int) -> Widths | None:
    """What the plan's load op carries for a rotation (None without one; `online_width` 0: no online part; `block`
    0: R1 and R4 each of its whole width; hidden 0: R4 alone, `transform smoothquant { online r4 }`)."""
    if not rotated:  # R4 alone (after SmoothQuant's fold): no residual or head rotation
        return (0, None, online_width, None) if online_width else None
    hidden, head = widths(index)
    return hidden, head, online_width or None, block or None


def rotation_words(rotation: Widths, name: str = "quarot") -> str:
    """The closing summary's `transform` line for a rotation of these widths."""
    hidden, head, online, block = rotation
    parts = [f"R1 {hidden}-wide"] + ([f"R2 {head}-wide"] if head else []) + \
        ([f"R4 {online}-wide, online"] if online else [])
    return f"{name}: {', '.join(parts)}" + (f"; block-diagonal, blocks of {block}" if block else "") + \
        "; the float model computes the same"
