"""multi_gpu placement (Olive's procedure; docs/memory.md, the modes) as a pure function, testable without GPUs.

accelerate's `infer_auto_device_map` (with `no_split_module_classes`) proposes module → device. Every
`<…>.layers.N.*` entry is then moved to the device of that block's first entry, so no block is split
across devices. If a block still would not fit its device, or anything is placed on "cpu" or "disk",
multi_gpu is refused and the run falls back to low_memory, with the reason."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_BLOCK = re.compile(r"^(.*?\b(?:layers|layer|h|blocks)\.\d+)(?:\.|$)")


@dataclass(frozen=True)
class Placement:
    """Blocks placed on devices, or why not."""
    device_map: dict[str, str | int]  # module → device after coalescing
    ok: bool
    reason: str


def coalesce(device_map: Mapping[str, str | int], sizes: Mapping[str, int], budgets: Mapping[Any, int]) -> Placement:
    """Coalesce blocks onto single devices and check the result.

    Args:
        device_map: module name → device (GPU index, "cpu" or "disk") as accelerate proposed it.
        sizes: module name → bytes it needs on its device.
        budgets: GPU index → bytes it may use.
    """
    offloaded = sorted(name for name, device in device_map.items() if device in ("cpu", "disk"))
    if offloaded:
        return Placement(dict(device_map), False, f"{len(offloaded)} module(s) would live on cpu/disk "
                         f"(e.g. {offloaded[0]}): multi_gpu needs the whole model on GPUs; using low_memory")
    first_device: dict[str, str | int] = {}
    placed: dict[str, str | int] = {}
    for name, device in device_map.items():  # accelerate's order: model order
        block = _block(name)
        if block is not None:
            device = first_device.setdefault(block, device)
        placed[name] = device
    used: dict[str | int, int] = {}
    for name, device in placed.items():
        used[device] = used.get(device, 0) + sizes.get(name, 0)
    over = [(d, used[d], budgets.get(d, 0)) for d in sorted(used, key=str) if used[d] > budgets.get(d, 0)]
    if over:
        device, need, budget = over[0]
        return Placement(placed, False, f"with every block on one device, GPU {device} would need {need} B of its "
                         f"{budget} B: a block cannot be split; using low_memory")
    per_device = {d: sum(1 for b, dev in first_device.items() if dev == d) for d in sorted(set(first_device.values()), key=str)}
    spread = ", ".join(f"GPU {d}: {n} blocks" for d, n in per_device.items())
    return Placement(placed, True, f"every block whole on one GPU ({spread})")


def _block(name: str) -> str | None:
    match = _BLOCK.match(name)
    return match.group(1) if match else None
