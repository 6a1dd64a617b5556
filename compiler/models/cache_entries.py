"""The entries of qrc's regenerable caches: `exported/` (an HF folder's ONNX export) and `gguf/` (a GGUF file's
side folder and its float32 folder) under the cache folder. Their keys change with a source's mtime, so without a
bound each re-saved model would leave its old float32 export behind for good (a 7B model's is 28 GB). So:

- a compile that uses an entry holds a shared lock on it (the folder's descriptor, `flock`) until the compile ends
  (`release_held`), and marks it used (the folder's mtime is its last use);
- after a new entry is made, the least recently used entries are removed until these caches hold at most
  `$QRC_CACHE_LIMIT` (default 20 GiB): never the new one, never one another run holds, never a folder qrc did not
  make (an entry carries qrc's file: the export stamp, `qrc-cache-entry`); and what a killed run
  left there (its staging, a day old).

Where the platform has no `flock` nothing is locked and nothing is removed. Nothing here imports torch or onnx."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
from pathlib import Path

from compiler.models.errors import ModelError

LIMIT_VARIABLE = "QRC_CACHE_LIMIT"
DEFAULT_LIMIT = 20 << 30
# each pruned cache's folder name → the file every entry qrc makes there holds: what tells its entries from anything
# else in the folder (a QRC_CACHE pointed at a folder of models may hold `gguf/NAME/config.json` of the user's own)
ENTRY_FILE = "qrc-cache-entry"
MARKERS = {"exported": "qrc-export.json", "gguf": ENTRY_FILE}
_UNITS = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
          "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_HELD: dict[Path, int] = {}  # entry → the descriptor whose shared lock this process holds
STAGING_PREFIX = ".qrc-export-"  # where an export is written before it becomes an entry
# what a run leaves beside the entries while it works: `.qrc-export-…`, `.NAME.qrc-…` (a side folder being
# written, an entry being removed); one a day old is a killed run's (SIGKILL, the OOM killer) and is removed
_LEFTOVER = re.compile(r"\.(?:.+\.)?qrc-.+")
STALE_SECONDS = 24 * 3600


def cache_limit() -> int:
    """The bytes the pruned caches may hold: `$QRC_CACHE_LIMIT` (`20 GiB`, `500MB`, or bytes), else 20 GiB.
    ModelError (Q250) for a value that is no size."""
    text = os.environ.get(LIMIT_VARIABLE, "").strip()
    if not text:
        return DEFAULT_LIMIT
    found = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?", text)
    if found is None or found.group(2) not in (None, *_UNITS) or float(found.group(1)) <= 0:
        raise ModelError("Q250", f"{LIMIT_VARIABLE} is `{text[:40]}`, which is no size",
                         f"give a positive size such as `{LIMIT_VARIABLE}=20GiB` (binary: KiB MiB GiB TiB; decimal: "
                         "KB MB GB TB), or unset it for 20 GiB")
    return int(float(found.group(1)) * _UNITS[found.group(2) or ""])


def use(entry: Path) -> bool:
    """Hold `entry` for this compile (a shared lock, so no other run's pruning removes it) and mark it used now;
    False where it is gone (pruned, or never made): the caller makes it again."""
    try:
        import fcntl
    except ImportError:
        return entry.is_dir()
    if entry in _HELD:
        return True
    try:
        fd = os.open(entry, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:  # missing, or a link put in its place
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # waits while another run removes it
    except OSError:  # a file system without locks (some NFS): nothing there is removed either (prune's lock fails)
        pass
    try:
        same = os.fstat(fd).st_ino == os.lstat(entry).st_ino  # else removed (and maybe made again) before the lock
    except OSError:
        same = False
    if not same:
        os.close(fd)
        return False
    with contextlib.suppress(OSError):  # a cache shared read-only is read as it is
        os.utime(fd)
    _HELD[entry] = fd
    return True


def made(entry: Path) -> Path:
    """An entry just made: held for this compile, and the least recently used others pruned past the limit."""
    use(entry)
    prune(entry)
    return entry


def release_held() -> None:
    """Let go of every entry this process holds (the end of a compile)."""
    while _HELD:
        os.close(_HELD.popitem()[1])


def prune(made: Path) -> list[Path]:
    """After `made` was made: remove the least recently used entries of the pruned caches until they hold at most
    the limit; the entries removed. `made`, entries held by any run and folders that are not entries stay."""
    try:
        import fcntl
    except ImportError:
        return []
    root, limit = made.parent.parent, cache_limit()
    removed = _remove_leftovers(root)
    entries = sorted(_entries(root), key=lambda item: item[1])  # least recently used first
    total = sum(size for _, _, size in entries)
    for entry, _, size in entries:
        if total <= limit:
            break
        if entry == made or entry in _HELD:
            continue
        if _remove_unheld(entry, fcntl):
            total -= size
            removed.append(entry)
    return removed


def _entries(root: Path) -> list[tuple[Path, float, int]]:
    """Each entry of the pruned caches under `root`: (folder, last use, bytes)."""
    return [(Path(child.path), child.stat(follow_symlinks=False).st_mtime, _bytes(Path(child.path)))
            for kind, child in _folders(root)
            if not child.name.startswith(".") and os.path.isfile(os.path.join(child.path, MARKERS[kind]))]


def _folders(root: Path):
    """(cache name, folder) for each folder (not a link) directly in the pruned caches under `root`."""
    for kind in MARKERS:
        try:
            children = list(os.scandir(root / kind))
        except OSError:
            continue
        yield from ((kind, child) for child in children if child.is_dir(follow_symlinks=False))


def _remove_leftovers(root: Path) -> list[Path]:
    """Remove what killed runs left in the pruned caches (staging and half-removed entries a day old)."""
    removed = []
    now = time.time()
    for _, child in _folders(root):
        if _LEFTOVER.fullmatch(child.name) and now - child.stat(follow_symlinks=False).st_mtime > STALE_SECONDS:
            shutil.rmtree(child.path, ignore_errors=True)
            removed.append(Path(child.path))
    return removed


def _bytes(folder: Path) -> int:
    """The bytes of the regular files in `folder` and below (links not followed)."""
    total = 0
    for base, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(base, name)).st_size
            except OSError:
                pass
    return total


def _remove_unheld(entry: Path, fcntl) -> bool:
    """Remove `entry` unless a run holds it: moved to a hidden name first (it disappears at once for a run that
    looks it up), then deleted."""
    try:
        fd = os.open(entry, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        if os.fstat(fd).st_ino != os.lstat(entry).st_ino:
            return False
        doomed = entry.with_name(f".{entry.name}.qrc-pruned-{os.getpid()}-{time.monotonic_ns()}")
        os.replace(entry, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
