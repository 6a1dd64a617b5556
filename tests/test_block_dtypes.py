"""What a bfloat16 block on a GPU is given (multi_gpu on a bfloat16 checkpoint), checked on the CPU: the other
inputs captured in float32 (rotary cos/sin, masks) are given to it in bfloat16, as transformers gives them to a
bfloat16 model. Before, the float32 cos/sin made queries and keys float32 beside bfloat16 values and attention
refused them (found on an H200: every multi_gpu compile of a bfloat16 Llama failed in its first block)."""

from __future__ import annotations

import pytest
import torch

from compiler.backends.torch.streams import in_dtype

transformers = pytest.importorskip("transformers")


def _layer_and_inputs():
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    hidden = torch.randn(2, 16, 64)
    positions = torch.arange(16)[None].expand(2, -1)
    cos_sin = model.model.rotary_emb(hidden, positions)  # float32, as the CPU capture leaves them
    return model.model.layers[0], hidden, cos_sin


def test_a_bfloat16_block_runs_on_the_float32_inputs_given_in_its_dtype():
    layer, hidden, cos_sin = _layer_and_inputs()
    reference = layer(hidden, position_embeddings=cos_sin)
    reference = reference[0] if isinstance(reference, tuple) else reference
    layer = layer.to(torch.bfloat16)
    with pytest.raises(RuntimeError, match="dtype"):  # what a GPU run met: float32 q/k beside bfloat16 v
        layer(hidden.to(torch.bfloat16), position_embeddings=cos_sin)
    _, kwargs = in_dtype(((), {"position_embeddings": cos_sin}), "cpu", torch.bfloat16)
    assert all(t.dtype == torch.bfloat16 for t in kwargs["position_embeddings"])
    out = layer(hidden.to(torch.bfloat16), **kwargs)
    out = out[0] if isinstance(out, tuple) else out
    assert out.dtype == torch.bfloat16
    assert torch.nn.functional.cosine_similarity(out.float().flatten(), reference.flatten(), dim=0) > 0.999


def test_masks_stay_finite_and_integers_and_booleans_are_left_alone():
    mask = torch.full((1, 1, 4, 4), torch.finfo(torch.float32).min).triu(1)
    positions, causal = torch.arange(4)[None], torch.ones(4, 4, dtype=torch.bool).tril()
    (m, p, c), _ = in_dtype(((mask, positions, causal), {}), "cpu", torch.bfloat16)
    assert m.dtype == torch.bfloat16 and torch.isfinite(m).all() and (m.float().triu(1) < -1e38).sum() == 6
    assert p.dtype == torch.int64 and torch.equal(p, positions)
    assert c.dtype == torch.bool and torch.equal(c, causal)
