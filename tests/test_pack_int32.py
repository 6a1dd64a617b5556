"""Dense int32 packing against compressed-tensors' own implementation (the reader of our safetensors)."""

from __future__ import annotations

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
