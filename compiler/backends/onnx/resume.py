"""Resumable calibration: with `disk` set, observer state is saved after every chunk (atomically), so a
compile that was killed continues where it stopped and gives the same bytes as one that was not."""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ResumeState:
    """Data-only resume state of an interrupted calibration (observers after the last finished segment)."""
    path: Path

    @staticmethod
    def for_run(disk: Path, *identity: str) -> ResumeState:
        """The state file of the run that `identity` (recipe, model, group) names, under `disk`."""
        key = hashlib.sha256("\x00".join(identity).encode()).hexdigest()[:24]
        return ResumeState(disk / "checkpoints" / f"calibration-{key}.pkl")

    def load(self) -> tuple[int, dict] | None:
        """(chunks done, observers) from an earlier, interrupted run, or None."""
        try:
            with self.path.open("rb") as handle:
                done, observers = pickle.load(handle)
        except (OSError, pickle.UnpicklingError, EOFError, ValueError):
            return None
        return done, observers

    def save(self, done: int, observers: dict) -> None:
        """Write the observers after `done` segments atomically."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".checkpoint-")
        with os.fdopen(fd, "wb") as handle:
            pickle.dump((done, observers), handle, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, self.path)

    def remove(self) -> None:
        """Delete the state: the calibration it resumes has finished."""
        self.path.unlink(missing_ok=True)
