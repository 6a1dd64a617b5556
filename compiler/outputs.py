"""Outputs never replace inputs: an output path equal to, inside or containing the model (or its
external data), equal to (or a folder containing) another file the compile reads (the recipe, the
calibration data, the tokenizer), a symlink, or something other than a file or folder (a FIFO, a device), is
refused before any work (Q416)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from compiler.ir.values import human_bytes
from compiler.models import local_path
from compiler.safe_files import UnsafePath, nearest_existing, open_regular


def _model_paths(ref: str) -> list[Path]:
    """The files and folders a model reference reads (none for built-ins, which live in qrc's cache)."""
    path = local_path(ref)
    if path is None:
        return []
    if path.is_file():
        return [path] + sorted(path.parent.glob(path.name + ".data")) + sorted(path.parent.glob(path.stem + ".onnx_data"))
    return [path]


def unwritable(destination: Path, needed: int = 0) -> str | None:
    """Why `destination`'s folder (or the nearest ancestor that exists: the rest is created) cannot take a
    file of `needed` bytes: not a folder, not writable, or too little free space. None when it can."""
    folder = nearest_existing(destination.parent)
    if not folder.is_dir():
        return f"`{folder}` is not a folder"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"cannot write to `{folder}` (permission denied)"
    free = shutil.disk_usage(folder).free
    if free < needed:
        return f"`{folder}` has {human_bytes(free)} free; the output needs about {human_bytes(needed)}"
    return None


def read_paths(ir, with_data: bool = True) -> list[tuple[str, Path]]:
    """The files a compile of `ir` reads besides the model, each with what it is: the recipe (when it is a
    file), the calibration data file, the tokenizer of `data text` (these two only `with_data`: a check leaves
    out data whose settings are in error)."""
    from compiler.data.batches import resolve_tokenizer
    from compiler.ir.types import DataKind
    from compiler.models import ModelError, resolve_path

    found: list[tuple[str, Path]] = []
    source = getattr(getattr(ir, "span", None), "source", None)
    if source is not None and Path(source.name).is_file():
        found.append(("recipe", Path(source.name)))
    data = ir.calibration.data
    if not with_data:
        return found
    if data.kind is not DataKind.SYNTHETIC and data.path:
        try:
            found.append((f"{data.kind.value} data", resolve_path(data.path)))
        except ModelError:
            pass  # a missing data file is its own diagnostic
    if data.kind is DataKind.TEXT:
        tokenizer = resolve_tokenizer(data, ir.model)
        if tokenizer is not None:
            found.append(("tokenizer", tokenizer))
    elif data.kind is DataKind.DATASET and data.tokenizer:  # a tokenizer folder (or file) of `data dataset`
        try:
            tokenizer_path = resolve_path(data.tokenizer)
        except ModelError:
            tokenizer_path = None
        if tokenizer_path is not None and tokenizer_path.exists():
            found.append(("tokenizer", tokenizer_path))
    return found


def output_conflict(output: Path, model_ref: str, reads: list[tuple[str, Path]] | tuple = ()) -> str | None:
    """Why writing to `output` could destroy the model's files or another file the compile reads (`reads`:
    what each is, its path), or None when it cannot."""
    if output.is_symlink():
        return f"`{output}` is a symbolic link: writing would replace what it points to"
    if output.exists() and not (output.is_file() or output.is_dir()):
        return f"`{output}` is neither a file nor a folder (a FIFO, a socket or a device): qrc writes files"
    target = output.resolve()
    for what, path in reads:
        source = path.resolve()
        if target == source:
            return f"`{output}` is the {what} `{path}`"
        if target in source.parents:
            return f"`{output}` contains the {what} `{path}`"
        if source.is_dir() and source in target.parents:  # a tokenizer folder's files are read too
            return f"`{output}` is inside the {what} `{path}`"
    for path in _model_paths(model_ref):
        source = path.resolve()
        if target == source:
            return f"`{output}` is the model itself"
        if source in target.parents:
            return f"`{output}` is inside the model's folder `{path}`"
        if target in source.parents:
            return f"`{output}` contains the model `{path}`"
    return None


PROVENANCE_MARK = b"qrc.recipe_sha256"  # the key every model qrc writes records (Plan.provenance)
_MARK_SCAN = 64 << 20  # bytes read at each end of a file: GGUF keeps its key-values first, ONNX its metadata last
OWN_FOLDER_MARK = "qrc.recipe"  # the recipe every folder qrc writes holds at its top


def foreign_destination(destination: Path) -> str | None:
    """Why replacing `destination` would lose something qrc did not write, or None when nothing would be lost:
    nothing is there, an empty folder, a folder qrc wrote (its `qrc.recipe` at the top), or a model file qrc
    wrote (its provenance key in the file's head or tail)."""
    try:
        if not destination.exists():
            return None
        if destination.is_dir():
            entries = sorted(entry.name for entry in destination.iterdir())
            marker = destination / OWN_FOLDER_MARK
            if not entries or (marker.is_file() and not marker.is_symlink()):
                return None
            shown = ", ".join(f"`{name}`" for name in entries[:3]) + (", …" if len(entries) > 3 else "")
            count = f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'}"
            return f"`{destination}` is a folder qrc did not write ({count}: {shown})"
        if destination.is_file() and _carries_mark(destination):
            return None
    except OSError as exc:
        return f"`{destination}` cannot be read to tell whether qrc wrote it ({exc.strerror or exc})"
    return f"`{destination}` is a file qrc did not write"


def _carries_mark(path: Path) -> bool:
    """Whether qrc's provenance key is in the first or the last _MARK_SCAN bytes of the file at `path`."""
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        head = handle.read(_MARK_SCAN)
        if PROVENANCE_MARK in head:
            return True
        if size <= _MARK_SCAN:
            return False
        handle.seek(max(size - _MARK_SCAN, _MARK_SCAN - len(PROVENANCE_MARK)))
        return PROVENANCE_MARK in handle.read()


def normalized_output(path: Path) -> Path | None:
    """`path`, made absolute where it ends in `.` or `..` (so that `-o .` names the folder it means); None for a
    path with no name of its own (the file system's root), where no output can be staged beside it."""
    if path.name not in ("", ".", ".."):
        return path
    absolute = Path(os.path.abspath(path))
    return absolute if absolute.name else None


@contextmanager
def destination_lock(destination: Path) -> Iterator[str | None]:
    """Hold the destination for this compile: an exclusive lock on a hidden file beside it
    (`.<name>.qrc-lock`, removed again), so two compiles into one path cannot mix their files. Yields None
    when this run holds it, else what holds it (the other compile's process id). Where the platform has no
    `flock`, nothing is locked."""
    try:
        import fcntl
    except ImportError:  # not POSIX: staging names are still unique per run
        yield None
        return
    destination.parent.mkdir(parents=True, exist_ok=True)
    path = destination.with_name(f".{destination.name}.qrc-lock")
    while True:
        fd = open_regular(path)  # a link or a FIFO planted at the lock's name is refused, never written through
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            yield f"process {holder}" if holder else "another process"
            return
        try:  # the holder before us may have removed the file after we opened it: lock the one in place
            same = os.fstat(fd).st_ino == os.lstat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    held = os.pread(fd, 64, 0).strip()
    if held and not held.isdigit():  # a lock holds a process id (or nothing, when a run was killed at its start)
        os.close(fd)
        raise UnsafePath(path, "a file that is not qrc's lock (it holds other text): qrc keeps its lock at that "
                         "name, so move the file away if it is yours")
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield None
    finally:
        try:
            if os.lstat(path).st_ino == os.fstat(fd).st_ino:  # only the file this run locked, not one put in its place
                os.unlink(path)
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)
