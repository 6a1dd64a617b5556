"""What values each model input takes: its numpy dtype, and how many distinct ids an integer input is drawn
from (synthetic data) or may hold (a data file's ids are checked against it)."""

from __future__ import annotations

import numpy as np

from compiler.models.index import LayerKind, ModelIndex, TensorInfo
from compiler.models.inputs import Binding, InputRole, role_of, shape_at

IMPLIED_ROLES = (InputRole.PAST, InputRole.POSITIONS)  # what token ids imply for a decoder (implied_input)
NUMPY_DTYPES = {"int64": np.int64, "int32": np.int32, "float32": np.float32, "float16": np.float16,
                "bool": np.bool_, "uint8": np.uint8, "int8": np.int8, "float64": np.float64}


def token_range(index: ModelIndex, info: TensorInfo) -> int | None:
    """How many distinct values an integer input takes in synthetic data (ids are drawn below it), or None
    when qrc cannot tell (then `data synthetic` is refused for this model: Q253). Masks are ones and
    positions count up (their range is not drawn from), token types are one segment (0)."""
    name = info.name.lower()
    if role_of(info) in (InputRole.MASK, InputRole.POSITIONS):
        return 1
    fed = [x for x in index.layers if x.kind is LayerKind.EMBEDDING and x.input == info.name]
    if fed:  # an ONNX graph: the Gather this input indexes
        return fed[0].in_features
    if "token_type" in name:
        return 1
    vocab = index.config_value("vocab_size")
    if isinstance(vocab, int) and vocab > 0 and name in ("input_ids", "ids", "tokens"):
        return min(vocab, index.config_value("text_tokens", vocab))  # a VLM's image tokens need their pixels
    return None


def implied_input(index: ModelIndex, info: TensorInfo, rows: int, seqlen: int) -> np.ndarray | None:
    """What token ids imply for a decoder's other inputs, `rows` samples of `seqlen` tokens: positions counting
    from 0 and an empty key/value cache (a prompt's first step), as tokenised text and an npz of ids feed them;
    None for an input the ids say nothing about."""
    role = role_of(info)
    if role not in IMPLIED_ROLES:
        return None
    shape = shape_at(index, info, Binding(1, seqlen, past=0))
    if isinstance(shape, str) or role is InputRole.POSITIONS and len(shape) != 2:
        return None
    dtype = NUMPY_DTYPES.get(info.dtype, np.float32)
    if role is InputRole.PAST:
        return np.zeros((rows, *shape[1:]), dtype)
    return np.broadcast_to(np.arange(seqlen, dtype=dtype), (rows, seqlen)).copy()

