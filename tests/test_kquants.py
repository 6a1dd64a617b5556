"""GGUF's K-quants as qrc rounds them (compiler/quant/kquants.py): the bytes decode, with the gguf package's own
tables (llama.cpp's), to the values qrc's model computes with; the error is what the format allows; the
importance weighting lowers the error where the importance is; and beside llama.cpp's own quantizer (its C
library, as llama-cpp-python ships it) qrc's rounding is as close to the float weights."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest

from compiler.ir.types import QType
from compiler.quant.kquants import quantize_kquant

gguf = pytest.importorskip("gguf")

KQUANTS = [(QType.Q4_K, "Q4_K", 0.09), (QType.Q5_K, "Q5_K", 0.045), (QType.Q6_K, "Q6_K", 0.022)]


def _weights(rows: int = 32, columns: int = 512, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, columns)).astype(np.float32) * 0.02
    w[1, 5] = 0.4  # an outlier
    w[2, :256] = 0.0  # an all-zero super-block
    w[3] = np.abs(w[3])  # a row with no negative weight (the min is clipped to 0)
    return w


def _error(a: np.ndarray, b: np.ndarray, weight: np.ndarray | None = None) -> float:
    weight = np.ones(a.shape[-1], np.float32) if weight is None else weight
    return float(np.sqrt(np.sum(weight * (a - b) ** 2) / np.sum(weight * b ** 2)))


@pytest.mark.parametrize("qtype, name, bound", KQUANTS)
@pytest.mark.parametrize("weighted", [False, True])
def test_blocks_decode_to_what_qrc_computes_with(qtype, name, bound, weighted):
    """The packed bytes, decoded by the gguf package, are exactly the values qrc's model runs; a zero block
    stays zero; the relative error is the format's."""
    w = _weights()
    importance = np.random.default_rng(1).random(512).astype(np.float32) + 0.1 if weighted else None
    k = quantize_kquant(w, qtype, importance)
    kind = gguf.GGMLQuantizationType[name]
    block, size = gguf.GGML_QUANT_SIZES[kind]
    assert k.packed.shape == (32, 512 // block * size) and k.packed.dtype == np.uint8
    decoded = gguf.quants.dequantize(k.packed, kind).reshape(w.shape)
    assert np.array_equal(decoded, k.dequantize())
    assert not k.dequantize()[2, :256].any()
    assert _error(k.dequantize(), w) < bound


@pytest.mark.parametrize("qtype, name, bound", KQUANTS)
def test_importance_lowers_the_error_where_it_is(qtype, name, bound):
    """Columns llama.cpp's imatrix marks as important (large input mean squares) come out closer."""
    w = _weights(seed=3)
    importance = np.full(512, 0.01, np.float32)
    importance[::8] = 100.0
    plain = quantize_kquant(w, qtype).dequantize()
    weighted = quantize_kquant(w, qtype, importance).dequantize()
    assert _error(weighted, w, importance) < 0.9 * _error(plain, w, importance)


def _ggml() -> ctypes.CDLL:
    """llama.cpp's ggml library as llama-cpp-python installs it (its quantizer: ggml_quantize_chunk)."""
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python ships llama.cpp's ggml")
    found = sorted(Path(llama_cpp.__file__).parent.rglob("libggml-base.so*")) or \
        sorted(Path(llama_cpp.__file__).parent.rglob("libggml.so*"))
    if not found:
        pytest.skip("no ggml library beside llama_cpp")
    lib = ctypes.CDLL(str(found[0]))
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    return lib


@pytest.mark.llama_cpp
@pytest.mark.parametrize("qtype, name, bound", KQUANTS)
@pytest.mark.parametrize("weighted", [False, True])
def test_as_close_as_llama_cpp_own_quantizer(qtype, name, bound, weighted):
    """llama.cpp's quantizer (ggml_quantize_chunk) on the same weights and imatrix: the same search, so qrc's
    error is llama.cpp's (within 0.2%: float32 sums run in another order, so a near tie between two candidate
    scales can go the other way) and more than 90% of the blocks are byte for byte llama.cpp's."""
    lib = _ggml()
    w = _weights(rows=64, columns=1024, seed=5)
    importance = np.random.default_rng(6).random(1024).astype(np.float32) * 4 + 0.05 if weighted else None
    kind = gguf.GGMLQuantizationType[name]
    block, size = gguf.GGML_QUANT_SIZES[kind]
    theirs = np.zeros((64, 1024 // block * size), np.uint8)
    src = np.ascontiguousarray(w)
    lib.ggml_quantize_chunk(int(kind), src.ctypes.data, theirs.ctypes.data, 0, 64, 1024,
                            None if importance is None else np.ascontiguousarray(importance).ctypes.data)
    ours = quantize_kquant(w, qtype, importance)
    their_values = gguf.quants.dequantize(theirs, kind).reshape(w.shape)
    weight = importance if importance is not None else None
    assert _error(ours.dequantize(), w, weight) <= 1.002 * _error(their_values, w, weight)
    same = np.mean(np.all(ours.packed.reshape(-1, size) == theirs.reshape(-1, size), axis=1))
    assert same > 0.9, same


@pytest.mark.llama_cpp
@pytest.mark.parametrize("name", ["Q4_0", "Q8_0"])
def test_reference_blocks_are_llama_cpp_own(name):
    """rtn Q4_0/Q8_0 (what the GGUF writer takes for those types) are byte for byte what llama.cpp's quantizer
    writes, and decode to the values qrc's model computes with."""
    from compiler.quant.kquants import quantize_reference

    lib = _ggml()
    w = _weights(rows=64, columns=1024, seed=7)
    kind = gguf.GGMLQuantizationType[name]
    block, size = gguf.GGML_QUANT_SIZES[kind]
    theirs = np.zeros((64, 1024 // block * size), np.uint8)
    lib.ggml_quantize_chunk(int(kind), np.ascontiguousarray(w).ctypes.data, theirs.ctypes.data, 0, 64, 1024, None)
    ours = quantize_reference(w, name)
    assert np.array_equal(ours.packed, theirs)
    assert np.array_equal(ours.dequantize(), gguf.quants.dequantize(theirs, kind).reshape(w.shape))
