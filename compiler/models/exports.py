"""Where the ONNX export of an HF-style folder is cached (the export itself is in the ONNX backend)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from compiler.models.builtin import cache_dir


def content_hash(folder: Path) -> str:
    digest = hashlib.sha256(b"qrc-export-v1")
    for path in sorted(folder.glob("*.json")) + sorted(folder.glob("*.safetensors")):
        digest.update(path.name.encode())
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:16]


def export_path(folder: Path) -> Path:
    return cache_dir() / "exported" / content_hash(folder) / "model.onnx"


def cached_export(folder: Path) -> Path | None:
    path = export_path(folder)
    return path if path.exists() else None
