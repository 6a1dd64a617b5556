"""Resumable block-wise compiles on the torch backend. In `mode offload` with `memory { disk }` the hidden states
between blocks are on disk anyway; after each block the run records how far it got (state.json: data only,
format-versioned) beside the hidden states entering the next block, and keeps the staged output folder, so a
compile that was killed, ran out of memory or lost a rank starts again after the last block it finished and
writes the bytes an uninterrupted run writes.

Under torchrun each rank keeps its own state (its own chunks' hidden states; the first rank also the staged
folder). The ranks resume only from a block every one of them finished, else all start over (Q408)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from compiler.backends.ranks import Ranks, all_gathered
from compiler.diagnostics import Diagnostic, warning
from compiler.source import Span

FORMAT = "qrc-torch-blocks-v1"
STATE = "state.json"


@dataclass(frozen=True)
class Finished:
    """What a run reported about the blocks it finished, as data: their layers' SQNR and input ranges, GPTQ's
    dampening, the MoE experts no token reached, each layer's share of the output error (LayerCosts), the KV
    cache scales, AWQ's gains and the folded mappings, and the tensors the first rank wrote."""

    sqnr: dict[str, float] = field(default_factory=dict)
    ranges: dict[str, list[float]] = field(default_factory=dict)
    dampened: dict[str, float] = field(default_factory=dict)
    unseen: list[str] = field(default_factory=list)
    noise: dict[str, float] = field(default_factory=dict)
    signal: dict[str, float] = field(default_factory=dict)
    kv: dict[str, list[float]] = field(default_factory=dict)
    gains: list[float] = field(default_factory=list)
    folded: int = 0
    written: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Saved:
    """A state: `done` blocks finished, each stream's hidden states entering block `done` (a folder name under
    the state's folder, by stream name), and what the finished blocks reported."""

    done: int
    caches: dict[str, str]
    finished: Finished


class BlockResume:
    """The resume state of one compile (and one rank of it): `start` is the first block to run."""

    def __init__(self, folder: Path, staged: Path, saved: Saved | None):
        self.folder, self.staged, self.saved = folder, staged, saved

    @property
    def start(self) -> int:
        """The number of blocks an earlier run finished (0: start at the first)."""
        return self.saved.done if self.saved else 0

    @staticmethod
    def open(disk: Path, destination: Path, identity: tuple[str, ...], ranks: Ranks, span: Span | None,
             warnings: list[Diagnostic]) -> BlockResume:
        """The state of the run `identity` names (recipe, model files, output, this rank's share) under `disk`,
        agreed over the ranks: a state every rank holds for the same block, else none (a fresh folder). The
        first rank's staged output folder is part of its state."""
        key = hashlib.sha256("\x00".join((*identity, f"rank {ranks.rank} of {ranks.world}")).encode()).hexdigest()[:24]
        shared = hashlib.sha256("\x00".join(identity).encode()).hexdigest()[:24]
        folder = disk / "checkpoints" / f"blocks-{key}"
        staged = destination.parent / f".{destination.name}.qrc-resume-{shared}"
        saved, problem = _load(folder)
        if saved is not None and ranks.first and not staged.is_dir():
            saved, problem = None, f"the staged output `{staged}` is gone"
        dones = all_gathered(ranks, saved.done if saved else 0)
        if saved is not None and len(set(dones)) > 1:
            saved, problem = None, f"the ranks stopped after different blocks ({', '.join(map(str, dones))})"
        if problem:
            warnings.append(warning("Q408", f"resume state `{folder}` not used: {problem}; starting over", span,
                                    "starting over", help="nothing to do: this run saves a new state as it goes"))
        if saved is None:
            shutil.rmtree(folder, ignore_errors=True)
            if ranks.first:
                shutil.rmtree(staged, ignore_errors=True)
        folder.mkdir(parents=True, exist_ok=True)
        return BlockResume(folder, staged, saved)

    def save(self, done: int, caches: dict[str, Path], finished: Finished) -> None:
        """Record `done` finished blocks, the streams' hidden states entering the next (folders under this
        state's), and what the finished blocks reported; written atomically, so a kill at any point leaves
        this state or the one before."""
        saved = Saved(done, {name: path.name for name, path in caches.items()}, finished)
        text = json.dumps({"format": FORMAT, "done": done, "caches": saved.caches, "finished": asdict(finished)})
        fd, temp = tempfile.mkstemp(dir=self.folder, prefix=".state-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(temp, self.folder / STATE)
        self.saved = saved

    def cache(self, stream: str) -> Path | None:
        """The folder of `stream`'s hidden states that the state points at (None: it has none)."""
        name = self.saved.caches.get(stream) if self.saved else None
        return self.folder / name if name else None

    def keeps(self, folder: Path | None) -> bool:
        """Whether the state points at this cache folder (left in place when the run stops)."""
        return folder is not None and self.saved is not None and folder.name in self.saved.caches.values()

    def remove(self) -> None:
        """The compile finished: its state goes."""
        shutil.rmtree(self.folder, ignore_errors=True)
        self.saved = None


def _load(folder: Path) -> tuple[Saved | None, str]:
    """The state saved in `folder` (None and why not, where something was there but is not a usable state).
    Data only: JSON of numbers and names, nothing from the folder runs."""
    path = folder / STATE
    if not path.exists():
        return None, ""
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
        if found.get("format") != FORMAT:
            return None, "it is not a state of this version"
        done, caches = found["done"], found["caches"]
        if not (isinstance(done, int) and done > 0 and isinstance(caches, dict)):
            return None, "it is not a valid state"
        if any(not isinstance(n, str) or "/" in n or n.startswith(".") or not (folder / n).is_dir()
               for n in caches.values()):
            return None, "the hidden states it names are gone"
        finished = Finished(**found["finished"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return None, f"it could not be read ({type(exc).__name__})"
    return Saved(done, dict(caches), finished), ""
