"""Which files beside a model qrc may copy into an output: regular files that resolve inside the model's
folder. A side file (`tokenizer.json`, …) that is a symbolic link to somewhere else (a private key,
`/etc/shadow`) is never read, so its target cannot leak into a published model. A Hugging Face cache
snapshot links every file to its repository's `blobs/`: that folder counts as the model's own."""

from __future__ import annotations

from pathlib import Path


def model_root(folder: Path) -> Path:
    """Where a model folder's files may resolve: the folder, or the repository of a Hugging Face cache
    snapshot (`models--org--name/snapshots/<rev>` → `models--org--name`, which holds `blobs/`)."""
    resolved = folder.resolve()
    if resolved.parent.name == "snapshots" and resolved.parent.parent.name.startswith("models--"):
        return resolved.parent.parent
    return resolved


def copyable(folder: Path, path: Path) -> bool:
    """Whether `path` (inside `folder` as listed) is a regular file resolving inside the model's root."""
    try:
        target = path.resolve(strict=True)
    except (OSError, RuntimeError):  # a dangling link or a loop
        return False
    root = model_root(folder)
    return target.is_file() and (target == root or root in target.parents)


def linked_outside(folder: Path, paths: list[Path]) -> list[Path]:
    """Those of `paths` that exist as links (or files) resolving outside the model's root: not copied."""
    return [p for p in paths if (p.is_symlink() or p.exists()) and not copyable(folder, p) and not p.is_dir()]
