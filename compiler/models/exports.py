"""Where the ONNX export of an HF-style folder is cached (the export itself is the ONNX backend's
`export_onnx` op). The cache key is the folder's metadata — config and other JSON files, each
safetensors file's name, size, mtime and header — never its weight bytes, so that `qrc check` and
`qrc plan` stay cheap; a file rewritten in place gets a new mtime and so a new export."""

from __future__ import annotations

import hashlib
import struct
from functools import lru_cache
from pathlib import Path

from compiler.models.builtin import cache_dir

_HEADER_LIMIT = 100 << 20  # a safetensors header larger than this is not read for the key (its size still is)


def files_hash(files: list[Path]) -> str:
    """A hash of these files' names and bytes (content-addressed caches, at compile time), computed once
    per state of the files (name, size, mtime): a compile asks several times and weights can be gigabytes."""
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


def metadata_key(folder: Path) -> str:
    """The export cache key of a folder, from metadata only (see the module docstring)."""
    # v5: decoder exports name each node after its module (offload cuts them into blocks by those names); v6: the
    # float32 Llama/Mistral/Qwen decoders come from onnxruntime-genai's builder where it is installed
    digest = hashlib.sha256(b"qrc-export-v6")
    # the side files an export copies beside itself count too (a chat template added later is exported with it)
    for path in sorted([*folder.glob("*.json"), *folder.glob("*.jinja")]):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    for path in sorted(folder.glob("*.safetensors")):
        stat = path.stat()
        digest.update(f"{path.name}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode() + _header(path))
    return digest.hexdigest()[:16]


def _header(path: Path) -> bytes:
    """The safetensors JSON header (names, dtypes, shapes, offsets): 8 bytes of length, then the header."""
    try:
        with path.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            return handle.read(length) if length <= _HEADER_LIMIT else b""
    except (OSError, struct.error):
        return b""


def export_path(folder: Path) -> Path:
    """Where the export of `folder` is (or will be) cached."""
    return cache_dir() / "exported" / metadata_key(folder) / "model.onnx"


def cached_export(folder: Path) -> Path | None:
    """The cached export of `folder`, if one exists."""
    path = export_path(folder)
    return path if path.exists() else None
