"""Someone's files and what a hostile or careless user plants where qrc writes (a link to a file or a folder,
a dangling link, a FIFO, a folder, a folder of files, a file): shared by the hostile-writes tests and
bench/hostile_round.py."""

from __future__ import annotations

import os
from pathlib import Path


def victims(root: Path) -> Path:
    """`root/victims`: a file and a folder with a file, which a planted link points into."""
    folder = root / "victims"
    (folder / "folder").mkdir(parents=True, exist_ok=True)
    (folder / "precious.txt").write_text("precious\n")
    (folder / "folder" / "thesis.tex").write_text("work\n")
    return folder


def plant(path: Path, kind: str, into: Path) -> None:
    """`kind` at `path`, its links pointing into the victims folder `into`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "link_to_file":
        path.symlink_to(into / "precious.txt")
    elif kind == "link_to_folder":
        path.symlink_to(into / "folder")
    elif kind == "dangling_link":
        path.symlink_to(into / "not-there")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "folder_of_files":
        path.mkdir()
        (path / "notes.txt").write_text("notes\n")
    elif kind == "file":
        path.write_text("someone's file\n")
    else:
        raise ValueError(kind)
