"""The meaning of a model input and of each of its axes, from the input's name, rank and dtype (duck-typed:
anything with `name`, `dtype` and `shape`), so that graph summaries and data both use it without
depending on the model index."""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import Protocol


class InputLike(Protocol):
    """What the role of an input is read from (a TensorInfo, or a graph summary's value)."""

    @property
    def name(self) -> str: ...  # noqa: D102

    @property
    def dtype(self) -> str: ...  # noqa: D102

    @property
    def shape(self) -> Sequence: ...  # noqa: D102


class InputRole(Enum):
    """What one model input carries."""

    TOKENS = "token ids"
    MASK = "attention mask"
    POSITIONS = "positions"
    TOKEN_TYPES = "token types"
    PAST = "key/value cache"
    OTHER = "other"


class Axis(Enum):
    """What one axis of an input counts."""

    BATCH = "batch"
    SEQUENCE = "sequence"  # the new tokens of this step
    PAST = "past"  # tokens already in the cache
    TOTAL = "total"  # past + sequence (a decoder's attention mask)
    HEADS = "key/value heads"
    HEAD_DIM = "head size"
    FIXED = "fixed"  # a leading axis of fixed meaning (mrope's 3 position streams)


_FLOAT = ("float32", "float16", "bfloat16", "float64")


def role_of(info: InputLike) -> InputRole:
    """The role of input `info`, from its name (and dtype: a cache is float)."""
    name = info.name.lower()
    if "past" in name and info.dtype in _FLOAT:
        return InputRole.PAST
    if "mask" in name:
        return InputRole.MASK
    if "position" in name:
        return InputRole.POSITIONS
    if "token_type" in name:
        return InputRole.TOKEN_TYPES
    if name in ("input_ids", "ids", "tokens") or name.endswith("_input_ids"):
        return InputRole.TOKENS
    return InputRole.OTHER


def axes_of(info: InputLike) -> tuple[Axis, ...]:
    """The meaning of each axis of input `info`."""
    role, rank = role_of(info), len(info.shape)
    if role is InputRole.PAST and rank == 4:  # [batch, kv heads, past, head size], every exporter's layout
        return (Axis.BATCH, Axis.HEADS, Axis.PAST, Axis.HEAD_DIM)
    if role is InputRole.MASK and rank == 2:
        return (Axis.BATCH, Axis.TOTAL)
    if role is InputRole.POSITIONS and rank == 1:  # cache_position
        return (Axis.SEQUENCE,)
    if role is InputRole.POSITIONS and rank == 3:  # mrope: [3, batch, sequence]
        return (Axis.FIXED, Axis.BATCH, Axis.SEQUENCE)
    return (Axis.BATCH,) + (Axis.SEQUENCE,) * max(rank - 1, 0)
