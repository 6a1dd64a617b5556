"""multi_gpu on a real machine: propose a placement of the blocks (accelerate's infer_auto_device_map
with the block class unsplittable when accelerate is installed, else a greedy fill in model order),
then coalesce and check it with the pure function of compiler.plan.placement."""

from __future__ import annotations

from compiler.backends.torch.cost import VRAM_SLACK
from compiler.backends.torch.model import TorchModel
from compiler.plan.placement import coalesce


def place(model: TorchModel, vram: tuple[int, ...]) -> tuple[dict[str, str], str]:
    """block → `cuda:i`, and what was decided; an empty map means: fall back to low_memory."""
    import torch

    if not torch.cuda.is_available():
        return {}, "no CUDA GPU is visible to this process"
    count = torch.cuda.device_count()
    budgets = {i: int(b / VRAM_SLACK) for i, b in enumerate(vram[:count])}
    if not budgets:
        return {}, "the recipe gives no `vram` budgets"
    sizes = {b: sum(model.shards.entries[model.keys[p]].end - model.shards.entries[model.keys[p]].start
                    for p in model.parameters_of(b)) for b in model.blocks}
    proposal = _accelerate(model, budgets) or _greedy(sizes, budgets)
    placement = coalesce(proposal, sizes, budgets)
    if not placement.ok:
        return {}, placement.reason
    return {b: f"cuda:{placement.device_map[b]}" for b in model.blocks}, placement.reason


def _greedy(sizes: dict[str, int], budgets: dict[int, int]) -> dict[str, int | str]:
    proposal, device, used = {}, 0, 0
    for block, size in sizes.items():
        while device in budgets and used + size > budgets[device]:
            device, used = device + 1, 0
        proposal[block] = device if device in budgets else "cpu"
        used += size
    return proposal


def _accelerate(model: TorchModel, budgets: dict[int, int]) -> dict[str, int | str] | None:
    try:
        from accelerate import infer_auto_device_map
    except ImportError:
        return None
    blocks = model.block_modules()
    no_split = [type(blocks[0]).__name__] if len(blocks) else []
    memory: dict = {**budgets, "cpu": 0}  # GPU ids and "cpu", as accelerate takes them
    full = infer_auto_device_map(model.module, max_memory=memory, no_split_module_classes=no_split)
    proposal: dict[str, str | int] = {}
    for block in model.blocks:  # the device of each block (or of its first piece, when accelerate split it)
        found = [d for name, d in full.items() if name == block or name.startswith(block + ".")
                 or block.startswith(name + ".") or name == ""]
        proposal[block] = found[0] if found else "cpu"
    return proposal
