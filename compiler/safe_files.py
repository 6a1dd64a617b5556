"""Every file qrc creates or rewrites is opened here, so that what someone else put in its place (a symbolic
link, dangling or not, a FIFO, a device, a folder) is refused instead of written through: a link to
`~/.bashrc` in a shared scratch folder must never make a compile truncate it.

Three ways to write, by what the path is to qrc:
- `open_new`: a file that must not exist at all (O_CREAT | O_EXCL | O_NOFOLLOW: the kernel refuses a link, even
  a dangling one, and anything else already there);
- `open_regular`: a file qrc may find again (its lock): opened without following a link, and the opened
  descriptor checked to be a regular file (a FIFO opens without blocking, then is refused);
- `replace_file`: a file rewritten whole (resume states, owner records, reports): staged in a new file beside it
  and renamed over it. A rename replaces the directory entry, never what a link points to, and what it replaces
  must be a regular file or nothing.

Folders qrc creates for itself (caches, checkpoints) go through `own_folder`, which refuses a link in their
place. No module here imports anything of qrc's: it is the lowest layer."""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from pathlib import Path

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


class UnsafePath(OSError):
    """A path qrc was about to write holds something it must not write through or replace. An OSError, so
    every place that turns a failed write into a diagnostic reports it; `reason` says what was found."""

    def __init__(self, path: Path | str, reason: str):
        super().__init__(errno.EPERM, reason, str(path))
        self.reason = reason


def what_is(path: Path | str) -> str | None:
    """What is at `path` without following a link: None for nothing or a regular file, else a phrase ("a
    symbolic link", "a FIFO", "a folder", "a device or socket") for a place a file may not be written."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "a device or socket"


def refuse_unless_regular(path: Path | str) -> None:
    """UnsafePath when `path` holds anything but a regular file (nothing there is fine)."""
    found = what_is(path)
    if found is not None:
        raise UnsafePath(path, f"`{path}` is {found}: qrc writes only regular files it creates")


def open_new(path: Path | str, flags: int = os.O_WRONLY, mode: int = 0o644) -> int:
    """A descriptor of a file created by this call; UnsafePath when anything is at `path` already."""
    try:
        return os.open(path, flags | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, mode)
    except FileExistsError:
        raise UnsafePath(path, f"`{path}` exists ({what_is(path) or 'a file'}): qrc creates it new") from None


def open_regular(path: Path | str, flags: int = os.O_RDWR, mode: int = 0o644, create: bool = True) -> int:
    """A descriptor of the regular file at `path` (created when missing and `create`), never through a link;
    UnsafePath when a link, a FIFO, a device or a folder is there."""
    try:
        fd = os.open(path, flags | (os.O_CREAT if create else 0) | _NOFOLLOW | _NONBLOCK | _CLOEXEC, mode)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.EMLINK):
            raise UnsafePath(path, f"`{path}` is {what_is(path) or 'not a regular file'}: qrc writes only regular "
                             "files") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafePath(path, f"`{path}` is {what_is(path) or 'not a regular file'}: qrc writes only regular files")
    return fd


def replace_file(path: Path | str, data: bytes | str, mode: int | None = None) -> None:
    """Write `data` (text as UTF-8) to `path` whole: a new file beside it, renamed over it, so a reader sees the
    old file or the new one. What is at `path` must be a regular file or nothing; `mode` defaults to the
    umask's (mkstemp's files start at 0600)."""
    path = Path(path)
    refuse_unless_regular(path)
    own_folder(path.parent)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".qrc-tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.chmod(temp, file_mode() if mode is None else mode)
        refuse_unless_regular(path)  # a link put there while the file was written is not replaced either
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def nearest_existing(folder: Path) -> Path:
    """`folder`, or the nearest folder above it that exists (what a run would make below it): where its free space
    and permissions are."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def own_folder(path: Path | str, within: Path | str | None = None) -> Path:
    """Make the folder `path` (and its missing parents) where none is; UnsafePath when `path` is a link or not a
    folder, or, with `within`, when any folder between `within` and `path` is (a cache's `checkpoints` folder
    linked elsewhere would put qrc's files there). Folders above (a scratch disk mounted through a link) may be
    links: only those qrc names itself must be what they seem."""
    path = Path(path)
    chain = [path]
    if within is not None and Path(within) in path.parents:
        chain = [parent for parent in path.parents if Path(within) in parent.parents][::-1] + [path]
    for folder in chain:
        found = what_is(folder)
        if found is None and folder.exists():  # a regular file
            found = "a file"
        if found is not None and found != "a folder":
            raise UnsafePath(folder, f"`{folder}` is {found}, where qrc keeps a folder of its own")
        folder.mkdir(parents=True, exist_ok=True)
        if what_is(folder) != "a folder":  # made a link between the check and here
            raise UnsafePath(folder, f"`{folder}` is not a folder")
    return path


def _umask() -> int:
    current = os.umask(0)  # reading the umask means setting it: put it straight back
    os.umask(current)
    return current


def file_mode() -> int:
    """The mode a file the user writes gets under the current umask."""
    return 0o666 & ~_umask()


def folder_mode() -> int:
    """The mode a folder the user makes gets under the current umask (mkdtemp's folders start at 0700)."""
    return 0o777 & ~_umask()


def copy_regular(source: Path | str, path: Path | str) -> None:
    """Copy the file `source` to `path`, which must be a regular file or nothing (never written through a link)."""
    with open(source, "rb") as reading:
        fd = open_regular(path, os.O_WRONLY | os.O_TRUNC)
        with os.fdopen(fd, "wb") as writing:
            while piece := reading.read(16 << 20):
                writing.write(piece)


def read_own(path: Path | str, limit: int = 64 << 20) -> bytes:
    """The bytes of a file qrc wrote for itself (a resume state, an owner record, a cache's stamp), read without
    following a link or blocking on a FIFO; UnsafePath when it is not a regular file, ValueError above `limit`."""
    fd = open_regular(path, os.O_RDONLY, create=False)
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"`{path}` is larger than {limit} bytes")
    return data


def regular_input(path: Path | str) -> bool:
    """Whether `path` (through links: a Hugging Face snapshot links every file) is a regular file: a FIFO or a
    device named as an input would block or never end, so it is refused before it is opened."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def read_input(path: Path | str, limit: int) -> bytes:
    """At most `limit` bytes of the regular file at `path` (links followed: inputs may be links); UnsafePath for
    a FIFO, a device or a folder (opened without blocking, then refused), ValueError above `limit`."""
    fd = os.open(path, os.O_RDONLY | _NONBLOCK | _CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafePath(path, f"`{path}` is {what_is(os.path.realpath(path)) or 'not a regular file'}, not a file")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(limit + 1 - size, 16 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > limit:
        raise ValueError(f"`{path}` is larger than {limit:,} bytes")
    return b"".join(chunks)


def read_json(path: Path | str, limit: int, *, own: bool = False):
    """The JSON value in the file at `path`, read as `read_input` reads an input (or, `own`, as `read_own` reads a
    file qrc wrote for itself). Every way the bytes can fail to be JSON is a ValueError: over `limit`, not UTF-8,
    not JSON, or nested deeper than Python's parser recurses (a file of `[[[[…` raises RecursionError there,
    which callers that catch ValueError never expected). UnsafePath (an OSError) where the file is refused."""
    data = read_own(path, limit) if own else read_input(path, limit)
    try:
        return json.loads(data.decode("utf-8"))  # as transformers reads its JSON files: UTF-8 only
    except RecursionError:
        raise ValueError(f"`{path}` nests deeper than any JSON file qrc reads") from None


NAME_MAX, PATH_MAX = 255, 4096  # bytes: Linux's limits for one name and a whole path


def unnameable(path: Path | str) -> str | None:
    """Why `path` cannot name a file at all (a name longer than the file system takes, a path past the
    system's limit, a NUL byte), or None: asked before anything touches the path, whose calls would fail with
    the system's error."""
    text = str(path)
    if "\x00" in text:
        return f"`{text[:80]}…` holds a NUL byte, which no file name can"
    if len(_bytes(text)) > PATH_MAX:
        return f"the path is {len(_bytes(text))} bytes long; the system takes at most {PATH_MAX}"
    longest = max((len(_bytes(part)) for part in Path(text).parts), default=0)
    if longest > NAME_MAX:
        return f"a name in the path is {longest} bytes long; file names take at most {NAME_MAX}"
    return None


def _bytes(text: str) -> bytes:
    """A path's bytes as the system gets them (an undecodable byte kept as it came)."""
    return text.encode("utf-8", "surrogatepass")
