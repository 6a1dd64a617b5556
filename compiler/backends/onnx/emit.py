"""Emission: provenance in the metadata, and the atomic write (compiler/models/onnx_write.py) that never
leaves a partial file at the destination."""

from __future__ import annotations

import onnx

from compiler.ir.printer import recipe_hash
from compiler.models.onnx_write import write_atomically

__all__ = ["EXTERNAL_THRESHOLD", "recipe_hash", "stamp", "write_atomically"]

EXTERNAL_THRESHOLD = 1 << 30  # weights above this go to `<model>.data` (protobuf stops at 2 GiB)


def stamp(model: onnx.ModelProto, recipe: str, canonical_ir: str) -> None:
    """Deterministic provenance: the recipe's name and hash; no dates, paths or versions."""
    del model.metadata_props[:]
    for key, value in (("qrc.recipe", recipe), ("qrc.recipe_sha256", recipe_hash(canonical_ir))):
        model.metadata_props.add(key=key, value=value)
    model.producer_name, model.producer_version = "qrc", ""
