"""Atomic emission: everything is written under temporary names in the destination folder and renamed
into place last, so a failed or interrupted compile never leaves a file at the destination."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import onnx

EXTERNAL_THRESHOLD = 1 << 30  # weights above this go to `<model>.data` (protobuf stops at 2 GiB)


def recipe_hash(canonical_ir: str) -> str:
    return hashlib.sha256(canonical_ir.encode()).hexdigest()


def stamp(model: onnx.ModelProto, recipe: str, canonical_ir: str) -> None:
    """Deterministic provenance: the recipe's name and hash; no dates, paths or versions."""
    del model.metadata_props[:]
    for key, value in (("qrc.recipe", recipe), ("qrc.recipe_sha256", recipe_hash(canonical_ir))):
        model.metadata_props.add(key=key, value=value)
    model.producer_name, model.producer_version = "qrc", ""


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def write_atomically(model: onnx.ModelProto, destination: Path, external: bool) -> list[Path]:
    """Write `model` (and its `.data` file when `external`) to `destination`; returns the files written."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=destination.parent, prefix=f".{destination.name}.qrc-"))
    try:
        staged = staging / destination.name
        if external:
            onnx.save(model, staged, save_as_external_data=True, all_tensors_to_one_file=True,
                      location=destination.name + ".data", size_threshold=1024)
        else:
            staged.write_bytes(model.SerializeToString(deterministic=True))
        mode = 0o666 & ~_umask()  # like any file the user writes, whatever the temp files had
        for path in staging.iterdir():
            path.chmod(mode)
        written = []
        data = staging / (destination.name + ".data")
        if data.exists():  # the data first: the model file appears last, complete
            os.replace(data, destination.parent / data.name)
            written.append(destination.parent / data.name)
        os.replace(staged, destination)
        return written + [destination]
    finally:
        shutil.rmtree(staging, ignore_errors=True)
