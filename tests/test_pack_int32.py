"""Dense int32 packing against compressed-tensors' own implementation (the reader of our safetensors)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from compiler.quant.pack_int32 import pack_to_int32, unpack_from_int32


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("cols", [32, 40, 127])
def test_round_trip(bits, cols):
    rng = np.random.RandomState(bits * 100 + cols)
    values = rng.randint(-(1 << (bits - 1)), 1 << (bits - 1), (6, cols)).astype(np.int8)
    packed = pack_to_int32(values, bits)
    assert packed.dtype == np.int32 and packed.shape == (6, -(-cols * bits // 32))
    assert np.array_equal(unpack_from_int32(packed, bits, cols), values)


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_matches_compressed_tensors(bits):
    torch = pytest.importorskip("torch")
    helpers = pytest.importorskip("compressed_tensors.compressors.pack_quantized.helpers")
    rng = np.random.RandomState(bits)
    values = rng.randint(-(1 << (bits - 1)), 1 << (bits - 1), (16, 200)).astype(np.int8)
    theirs = helpers.pack_to_int32(torch.from_numpy(values), bits).numpy()
    assert np.array_equal(pack_to_int32(values, bits), theirs)
    back = helpers.unpack_from_int32(torch.from_numpy(pack_to_int32(values, bits)), bits, torch.Size(values.shape))
    assert np.array_equal(back.numpy(), values)


@pytest.mark.parametrize("compiled", [False, True])
def test_four_bit_rows_pack_alike_with_and_without_the_compiled_pass(compiled, monkeypatch):
    """4-bit int8 rows take round_kernels.pack_nibbles where the run has loaded it, numpy's passes where it has
    not: both give compressed-tensors' packing."""
    torch = pytest.importorskip("torch")
    helpers = pytest.importorskip("compressed_tensors.compressors.pack_quantized.helpers")
    if compiled:
        import compiler.quant.round_kernels  # noqa: F401
    else:
        monkeypatch.delitem(sys.modules, "compiler.quant.round_kernels", raising=False)
    values = np.random.RandomState(7).randint(-8, 8, (16, 256)).astype(np.int8)
    assert np.array_equal(pack_to_int32(values, 4), helpers.pack_to_int32(torch.from_numpy(values), 4).numpy())
