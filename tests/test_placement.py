"""multi_gpu placement decisions, as tables of device maps and device memories (no GPU needed)."""

from __future__ import annotations

import pytest

from compiler.plan.placement import coalesce

GB = 1 << 30
SIZES = {"model.embed_tokens": 1 * GB, "model.layers.0.self_attn": 1 * GB, "model.layers.0.mlp": 2 * GB,
         "model.layers.1.self_attn": 1 * GB, "model.layers.1.mlp": 2 * GB, "model.norm": 0, "lm_head": 1 * GB}


@pytest.mark.parametrize("device_map, budgets, ok, where", [
    # accelerate kept blocks whole: nothing to do
    ({"model.embed_tokens": 0, "model.layers.0.self_attn": 0, "model.layers.0.mlp": 0,
      "model.layers.1.self_attn": 1, "model.layers.1.mlp": 1, "model.norm": 1, "lm_head": 1},
     {0: 5 * GB, 1: 5 * GB}, True, {"model.layers.1.mlp": 1}),
    # block 1 split across GPUs: coalesced to the device of its first entry, which has room
    ({"model.embed_tokens": 0, "model.layers.0.self_attn": 0, "model.layers.0.mlp": 0,
      "model.layers.1.self_attn": 0, "model.layers.1.mlp": 1, "model.norm": 1, "lm_head": 1},
     {0: 8 * GB, 1: 2 * GB}, True, {"model.layers.1.mlp": 0}),
    # coalescing would overfill GPU 0: refused, low_memory
    ({"model.embed_tokens": 0, "model.layers.0.self_attn": 0, "model.layers.0.mlp": 0,
      "model.layers.1.self_attn": 0, "model.layers.1.mlp": 1, "model.norm": 1, "lm_head": 1},
     {0: 5 * GB, 1: 4 * GB}, False, {}),
    # anything on cpu or disk: refused
    ({"model.embed_tokens": 0, "model.layers.0.self_attn": 0, "model.layers.0.mlp": 0,
      "model.layers.1.self_attn": 1, "model.layers.1.mlp": 1, "model.norm": 1, "lm_head": "cpu"},
     {0: 8 * GB, 1: 8 * GB}, False, {}),
    ({"model.embed_tokens": 0, "model.layers.0.self_attn": 0, "model.layers.0.mlp": "disk",
      "model.layers.1.self_attn": 1, "model.layers.1.mlp": 1, "model.norm": 1, "lm_head": 1},
     {0: 8 * GB, 1: 8 * GB}, False, {}),
], ids=["whole", "coalesced", "overfull", "cpu", "disk"])
def test_coalesce(device_map, budgets, ok, where):
    placement = coalesce(device_map, SIZES, budgets)
    assert placement.ok is ok and placement.reason
    for name, device in where.items():
        assert placement.device_map[name] == device
    if ok:  # no block spans two devices
        blocks = {}
        for name, device in placement.device_map.items():
            if ".layers." in name:
                blocks.setdefault(name.split(".")[2], set()).add(device)
        assert all(len(devices) == 1 for devices in blocks.values())
