"""Whether a folder lies on a file system held in memory (tmpfs, ramfs).

qrc's plans count what goes to `memory { disk }` and to the temporary folder (the ONNX backend's smoothed and
rotated copies of a model) as disk. On a tmpfs those bytes are pages of RAM, beside the planned peak: a `/tmp`
that is a tmpfs (the default of Fedora, Arch and many containers) holds a whole copy of the model's weights in
memory, and block caches "offloaded" to a tmpfs folder stay in memory. `qrc check` says so (Q453) with the
bytes it knows of, so the plan's figure is not taken for the whole.

Linux only: the mount table is /proc/self/mountinfo; elsewhere nothing is known, and nothing is said."""

from __future__ import annotations

import os
from pathlib import Path

from compiler.safe_files import nearest_existing

MOUNTINFO = Path("/proc/self/mountinfo")
IN_MEMORY = frozenset({"tmpfs", "ramfs"})


def memory_filesystem(folder: Path | str) -> str | None:
    """The type of the in-memory file system `folder` (or the nearest folder above it that exists, where it would
    be made) lies on, e.g. "tmpfs"; None where it lies on another, or the mount table cannot be read."""
    try:
        table = MOUNTINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    where = os.path.realpath(nearest_existing(Path(folder).absolute()))
    kind = _filesystem(table, where)
    return kind if kind in IN_MEMORY else None


def _filesystem(table: str, path: str) -> str | None:
    """The file system type of the deepest mount point in `table` (mountinfo's lines) that holds `path`; the
    last mounted where several share that point (it hides the others)."""
    found, depth = None, -1
    for line in table.splitlines():
        mount, kind = _mount_of(line)
        if mount is None:
            continue
        inside = path == mount or path.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= depth:
            found, depth = kind, len(mount)
    return found


def _mount_of(line: str) -> tuple[str | None, str | None]:
    """(mount point, file system type) of one mountinfo line: `ID PARENT MAJ:MIN ROOT POINT OPTIONS [TAGS…] -
    TYPE SOURCE SUPER`, the point with its space, tab, newline and backslash written as octal escapes."""
    head, separator, tail = line.partition(" - ")
    fields, rest = head.split(), tail.split()
    if not separator or len(fields) < 5 or not rest:
        return None, None
    return _unescaped(fields[4]), rest[0]


def _unescaped(text: str) -> str:
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        text = text.replace(code, char)
    return text
