"""Whose a resume state is: the destination it writes, the run (recipe and model) and the rank count. A run into
the same destination with another recipe, model or rank count supersedes a killed run's states (they could
never be resumed, and their cached hidden states or block boundaries can be gigabytes), so each backend records
an owner beside its states and removes the superseded ones when it starts."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from compiler.safe_files import read_json, replace_file, what_is


def owner(destination: Path, *run: str, world: int) -> dict:
    """Who a state belongs to: the destination, a digest of the run's identity, and the rank count."""
    return {"destination": str(destination.resolve()), "run": hashlib.sha256("\x00".join(run).encode()).hexdigest(),
            "world": world}


def claim(path: Path, mine: dict) -> None:
    """Record `mine` as the owner of the state beside `path` (its owner file)."""
    planted = what_is(path)
    if planted == "a folder":  # planted in qrc's own state folder: removed, never followed
        shutil.rmtree(path)
    elif planted is not None:  # a link, a FIFO, a device
        path.unlink()
    replace_file(path, json.dumps(mine))


def superseded(path: Path, mine: dict) -> bool:
    """Whether the owner file at `path` names this run's destination but another run or rank count. A file that
    is not an owner record (another version's, damaged) is left alone."""
    try:
        theirs = read_json(path, 1 << 20, own=True)  # never through a link, never blocked on a FIFO
    except (OSError, ValueError):
        return False
    return isinstance(theirs, dict) and theirs.get("destination") == mine["destination"] and theirs != mine
