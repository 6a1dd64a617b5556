"""Whether numba already holds qrc's compiled loops for this machine, read from file names alone (no numba import:
`qrc plan` stays light). numba compiles a loop (`@njit(cache=True)`: round_kernels.py and the other kernel
modules here) at its first call and writes an index, `<module>.<function>-<line>.py<version>.nbi`, beside its
machine code in the first of its cache folders that works: `NUMBA_CACHE_DIR`, else the module's own
`__pycache__` where it can write, else numba's user-wide folder (numba/core/caching.py, its cache locators). An
index older than its module is stale: numba compiles the loop again (a new version installed)."""

from __future__ import annotations

import hashlib
import os
import sys
from enum import Enum
from pathlib import Path

_HERE = Path(os.path.abspath(__file__)).parent  # as numba names it: abspath, links not resolved


class LoopModule(Enum):
    """The modules of compiled loops, each compiled at the first call of one of its loops on a machine (1-6 s a
    loop on two cores, 2026-12-07: the rtn loop 1.5-2.3 s, the mse search's 5.3 s, the FP4 rows' 2.4-2.8 s)."""

    ROUNDING = "round_kernels"  # rtn of integer groups (and the helpers the others call)
    SEARCH = "mse_kernel"  # `rounding mse` of integer groups
    FLOAT = "float_kernels"  # FP8 and FP4 rounded file to file, FP4 scale searches
    HISTOGRAM = "histogram_kernel"  # static inputs' histograms on the torch backend


def uncached(modules: set[LoopModule]) -> list[LoopModule]:
    """Those of `modules` with no up-to-date index on disk: the first run on this machine (or after qrc's modules
    changed) compiles the loops it calls from them. Where numba would cache cannot be told (another platform's
    user-wide folder), none is said to be missing."""
    folder = _cache_folder()
    if folder is None:
        return []
    version = f"py{sys.version_info.major}{sys.version_info.minor}"
    return [m for m in sorted(modules, key=lambda m: m.value) if not _indexed(folder, m.value, version)]


def _indexed(folder: Path, module: str, version: str) -> bool:
    """Whether `folder` holds an index of one of `module`'s loops at least as new as the module's source."""
    try:
        written = (_HERE / f"{module}.py").stat().st_mtime
        return any(index.stat().st_mtime >= written for index in folder.glob(f"{module}.*.{version}.nbi"))
    except OSError:
        return False


def _cache_folder() -> Path | None:
    """The folder numba caches this package's loops in (its locators' order), None where it cannot be told."""
    configured = os.environ.get("NUMBA_CACHE_DIR", "")
    if configured:
        return Path(configured) / _subpath()
    if _in_tree_writable():
        return _HERE / "__pycache__"
    if sys.platform.startswith("linux"):
        return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "numba" / _subpath()
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "numba" / _subpath()
    return None


def _in_tree_writable() -> bool:
    """Whether numba can write its cache in this package's own `__pycache__` (made where missing)."""
    in_tree = _HERE / "__pycache__"
    return os.access(in_tree if in_tree.exists() else _HERE, os.W_OK)


def _subpath() -> str:
    """numba's folder for this package's loops under a cache root: the source folder's name and the SHA-1 of its
    path (`_CacheLocator.get_suitable_cache_subpath`)."""
    return f"{_HERE.name}_{hashlib.sha1(str(_HERE).encode()).hexdigest()}"
