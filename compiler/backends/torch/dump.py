"""Canonical text of an emitted safetensors folder, for goldens: the files, config.json's
quantization_config, and every tensor (integer tensors by hash, float tensors by summary, tiny ones in
full). `approximate` layers (GPTQ: its Cholesky factor and float32 sums vary in the last bits with the
BLAS build and thread count) show their integer tensors by shape only and their float ones (group scales,
which GPTQ takes as its column loop reaches each group) to three digits."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from compiler.backends.torch.shards import Shards
from compiler.canonical import TINY, fmt


def dump(folder: Path, approximate: tuple[str, ...] = ()) -> str:
    """The canonical text of an emitted folder (goldens); `approximate` layers are summarised, not hashed."""
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    lines = ["files"] + [f"  {f}" for f in files]
    lines += ["quantization_config"] + ["  " + line for line in
                                        json.dumps(config.get("quantization_config"), indent=1, sort_keys=True).splitlines()]
    checkpoint = Shards(folder)
    lines.append("tensors")
    for name in sorted(checkpoint.entries):
        loose = any(name.startswith(layer + ".") for layer in approximate)
        lines.append("  " + _tensor(name, checkpoint, loose))
    return "\n".join(lines) + "\n"


def _tensor(name: str, checkpoint: Shards, loose: bool) -> str:
    entry = checkpoint.entries[name]
    arr = checkpoint.read(name).float().numpy() if entry.dtype in ("BF16",) else checkpoint.read(name).numpy()
    head = f"{name}: {entry.dtype}[{', '.join(map(str, entry.shape))}]"
    if arr.size <= TINY:
        if loose and arr.dtype.kind in "iu":
            return head
        return head + " = [" + ", ".join(fmt(v) if arr.dtype.kind == "f" else str(int(v)) for v in arr.ravel()) + "]"
    if arr.dtype.kind == "f":
        a = arr.astype(np.float64)
        if loose:  # GPTQ's group scales come from its column loop: three digits are what every machine agrees on
            return head + f" min={a.min():.3g} max={a.max():.3g} mean={a.mean():.3g}"
        return head + f" min={fmt(a.min())} max={fmt(a.max())} mean={fmt(a.mean())}"
    if loose:
        return head + " (gptq: values not golden)"
    return head + " sha256:" + hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()[:16]
