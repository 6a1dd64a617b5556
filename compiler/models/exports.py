"""Where the ONNX export of an HF-style folder is cached (the export itself is in the ONNX backend)."""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

from compiler.models.builtin import cache_dir


def content_hash(folder: Path) -> str:
    """A hash of the folder's config and weights. Computed once per state of the files (name, size,
    mtime): a compile asks several times and the weights can be gigabytes."""
    return files_hash(sorted(folder.glob("*.json")) + sorted(folder.glob("*.safetensors")))


def files_hash(files: list[Path]) -> str:
    """A hash of these files' names and bytes, computed once per state of the files (name, size, mtime)."""
    return _hash(tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files))


@lru_cache(maxsize=16)
def _hash(files: tuple[tuple[str, int, int], ...]) -> str:
    digest = hashlib.sha256(b"qrc-export-v1")
    for name, _, _ in files:
        path = Path(name)
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
