"""Packing rounded integers into the bytes runtimes read. Dense int32 packing of sub-8-bit values, the layout
of compressed-tensors' `pack-quantized` format (the torch backend's safetensors output): element i of a row
takes bits [i·b, i·b + b) of the row's little-endian bit stream, values offset by 2^(b-1) into the unsigned
range, no padding bits between elements, the last word zero-filled. And the unsigned bytes and 4-bit nibble
pairs of ONNX's int4 tensors and MatMulNBits (`offset_bytes`, `pack_int4`), which that packing builds on."""

from __future__ import annotations

import math
import sys

import numpy as np

from compiler.quant.parallel import cores, parallel_map

PACK_TASK_BYTES = 1 << 20  # values one core packs at a time: its passes over them stay in its cache


def pack_to_int32(values: np.ndarray, bits: int) -> np.ndarray:
    """[rows, cols] signed values (int8, in [-2^(b-1), 2^(b-1))) → [rows, ceil(cols·b/32)] int32."""
    if not 1 <= bits <= 8:
        raise ValueError(f"bits must be in [1, 8], not {bits}")
    per_word = 32 // bits
    if 32 % bits == 0 and np.shape(values)[1] % per_word == 0:
        return _pack_whole_words(np.asarray(values), bits, per_word)
    v = np.asarray(values).astype(np.int64) + (1 << (bits - 1))
    rows, cols = v.shape
    words = math.ceil(cols * bits / 32)
    start = np.arange(cols, dtype=np.int64) * bits
    word, offset = start // 32, start % 32
    out = np.zeros((rows, words + 1), np.uint64)
    low = (v << offset[None, :]).astype(np.uint64) & np.uint64(0xFFFFFFFF)
    np.add.at(out, (slice(None), word), low)  # type: ignore[arg-type]  # numpy's stubs reject a tuple index
    spill = offset + bits > 32  # elements that cross into the next word
    if spill.any():
        high = (v[:, spill] >> (32 - offset[spill])[None, :]).astype(np.uint64)
        np.add.at(out, (slice(None), word[spill] + 1), high)  # type: ignore[arg-type]
    return out[:, :words].astype(np.uint32).view(np.int32)


def _pack_whole_words(values: np.ndarray, bits: int, per_word: int) -> np.ndarray:
    """The common case (4-bit rows whose length is a multiple of 8): no value crosses a word, so each
    word is its values shifted into place, in uint32 (a quarter of the general path's int64 scratch). For
    4 and 8 bits on a little-endian machine a word is 4 packed bytes (element i at bits 4i of byte i/2), so
    the bytes are packed and viewed as words: a few passes over bytes instead of one per element of a word."""
    rows, cols = values.shape
    if bits in (4, 8) and sys.byteorder == "little":  # whole bytes: the words are the packed bytes, read as int32
        return _pack_bytes(values, bits).view(np.int32)
    v = (values.astype(np.int32) + (1 << (bits - 1))).astype(np.uint32).reshape(rows, cols // per_word, per_word)
    out = np.zeros((rows, cols // per_word), np.uint32)
    for i in range(per_word):
        out |= v[:, :, i] << np.uint32(i * bits)
    return out.view(np.int32)


def _pack_bytes(values: np.ndarray, bits: int) -> np.ndarray:
    """4- or 8-bit rows as packed unsigned bytes: int8 4-bit rows in one compiled pass where the run has loaded
    the compiled rounding (round_kernels), else slices of rows on every core (the rows are independent)."""
    rows, cols = values.shape
    out = np.empty((rows, cols * bits // 8), np.uint8)
    kernels = sys.modules.get("compiler.quant.round_kernels")  # importing numba costs 100 MiB of RSS, which the
    # torch plans count only for the runs that round with it (torch/cost.py: ROUNDING_KERNELS); GPTQ's measured
    # 1.14x its plan when its packing imported it (bench/plan_vs_measured.py)
    if kernels is not None and bits == 4 and values.dtype == np.int8 and values.flags.c_contiguous:
        kernels.pack_nibbles(values.view(np.uint16), out)  # 0.12 ns a value: not worth sharing out over the cores
        return out
    step = max(1, -(-rows // max(cores(), -(-values.nbytes // PACK_TASK_BYTES))))

    def pack(first: int) -> None:
        part = values[first:first + step].astype(np.int8, copy=False)
        if bits == 8 and part.flags.c_contiguous:  # the offset added modulo 256 straight into place: one pass
            np.add(part.view(np.uint8), np.uint8(128), out=out[first:first + step])
            return
        unsigned = offset_bytes(part, 1 << (bits - 1))
        out[first:first + step] = pack_int4(unsigned) if bits == 4 else unsigned

    parallel_map(pack, range(0, rows, step))
    return out


def unpack_from_int32(packed: np.ndarray, bits: int, cols: int) -> np.ndarray:
    """The inverse: [rows, words] int32 → [rows, cols] int8 signed values."""
    p = np.asarray(packed).view(np.uint32).astype(np.uint64)
    p = np.concatenate([p, np.zeros((p.shape[0], 1), np.uint64)], axis=1)
    start = np.arange(cols, dtype=np.int64) * bits
    word, offset = start // 32, start % 32
    stream = p[:, word] | (p[:, word + 1] << np.uint64(32))
    mask = np.uint64((1 << bits) - 1)
    values = (stream >> offset.astype(np.uint64)[None, :]) & mask
    return (values.astype(np.int64) - (1 << (bits - 1))).astype(np.int8)


def offset_bytes(values: np.ndarray, offset: int) -> np.ndarray:
    """Integers plus `offset` as uint8 (signed b-bit values moved to the unsigned range: offset 2^(b-1)).
    int8 values are viewed unsigned and the offset added modulo 256, which is that sum exactly, in one pass."""
    if values.dtype == np.int8:
        return np.ascontiguousarray(values).view(np.uint8) + np.uint8(offset)
    return (values.astype(np.int16) + offset).astype(np.uint8)


def pack_int4(values: np.ndarray) -> np.ndarray:
    """Two 4-bit values per byte, low nibble first, along the last axis (padded with 0 when odd)."""
    if values.dtype == np.uint8 and values.shape[-1] % 2 == 0 and values.flags.c_contiguous and sys.byteorder == "little":
        pairs = values.view(np.uint16) & np.uint16(0x0F0F)  # each pair as one little-endian word: [v0, v1]
        pairs |= pairs >> np.uint16(4)  # v1 into the low byte's high nibble
        return pairs.astype(np.uint8)  # the low byte: v0 | v1 << 4
    v = values.astype(np.uint8) & 0x0F
    if v.shape[-1] % 2:
        v = np.concatenate([v, np.zeros(v.shape[:-1] + (1,), np.uint8)], axis=-1)
    return (v[..., 0::2] | (v[..., 1::2] << 4)).astype(np.uint8)
