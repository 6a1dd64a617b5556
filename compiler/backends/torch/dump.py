"""Canonical text of an emitted safetensors folder, for goldens: the files, config.json's
quantization_config, and every tensor (integer tensors by hash, float tensors by summary, tiny ones in
full).

What calibration computes is written `~x` (tests/golden.py compares it within a tolerance): static input
and KV-cache scales and zero points, which come from the float model's forward through transformers; and
every tensor of an `approximate` name (the layers GPTQ rounds, whose Cholesky factor and float32 sums vary
in the last bits with the BLAS build and thread count, and what an outlier transform rewrote from measured
channel statistics): their integer tensors by shape only, their float ones by minimum and mean to three
digits (a maximum is one group's, which a small upstream change can move by several percent)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from compiler.backends.torch.shards import Shards
from compiler.canonical import TINY, fmt

# tensors whose values are measured on calibration data (the rest is decided from the weights alone)
CALIBRATED_LEAVES = ("input_scale", "input_zero_point", "k_scale", "v_scale")


def dump(folder: Path, approximate: tuple[str, ...] = ()) -> str:
    """The canonical text of an emitted folder (goldens); tensors whose names start with one of
    `approximate` (`layer.weight` for the tensors that replace a layer's weight) are summarised as
    calibrated figures, not hashed."""
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    lines = ["files"] + [f"  {f}" for f in files]
    lines += ["quantization_config"] + ["  " + line for line in
                                        json.dumps(config.get("quantization_config"), indent=1, sort_keys=True).splitlines()]
    checkpoint = Shards(folder)
    lines.append("tensors")
    for name in sorted(checkpoint.entries):
        loose = any(name.startswith(part) for part in approximate) and not name.endswith(".weight_shape")
        lines.append("  " + _tensor(name, checkpoint, loose))
    return "\n".join(lines) + "\n"


def _tensor(name: str, checkpoint: Shards, loose: bool) -> str:
    entry = checkpoint.entries[name]
    arr = checkpoint.read(name).float().numpy() if entry.dtype in ("BF16",) else checkpoint.read(name).numpy()
    head = f"{name}: {entry.dtype}[{', '.join(map(str, entry.shape))}]"
    mark = "~" if loose or name.rpartition(".")[2] in CALIBRATED_LEAVES else ""
    if arr.size <= TINY:
        return head + " = [" + ", ".join(mark + (fmt(v) if arr.dtype.kind == "f" else str(int(v))) for v in arr.ravel()) + "]"
    if arr.dtype.kind == "f":
        a = arr.astype(np.float64)
        if loose and name.endswith("_scale") and a.min() < 0:  # signed scales (weights.py's signed search):
            magnitude = np.abs(a)  # a mean of either sign near 0 would not compare within a tolerance
            return head + f" |min|=~{magnitude.min():.3g} |mean|=~{magnitude.mean():.3g} (signed)"
        if loose:
            return head + f" min=~{a.min():.3g} mean=~{a.mean():.3g}"
        return head + f" min={fmt(a.min())} max={fmt(a.max())} mean={fmt(a.mean())}"
    if loose:
        return head + " (calibrated: values not golden)"
    return head + " sha256:" + hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()[:16]
