"""Resumable block-wise compiles on the torch backend. In `mode offload` with `memory { disk }` the hidden states
between blocks are on disk anyway; after each block the run records how far it got (state.json: data only,
format-versioned) beside the hidden states entering the next block, and keeps the staged output (a folder, or
a GGUF file), so a compile that was killed, ran out of memory or lost a rank starts again after the last block it
finished and writes the bytes an uninterrupted run writes.

Under torchrun each rank keeps its own state (its own chunks' hidden states; the first rank also the staged
output). The ranks resume only from a block every one of them finished, else all start over (Q408)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from compiler.backends.owners import claim, owner, superseded
from compiler.backends.ranks import Ranks, all_gathered
from compiler.backends.torch.attribution import LayerCosts
from compiler.backends.torch.kv_cache import KvCacheQuantizer
from compiler.backends.torch.layers import Job
from compiler.backends.torch.rounding import Rounder
from compiler.backends.torch.smoother import Smoother
from compiler.backends.torch.streams import HiddenCache, Stream
from compiler.backends.torch.writer import output_writer
from compiler.diagnostics import Diagnostic, warning
from compiler.safe_files import own_folder, read_json
from compiler.source import Span

FORMAT = "qrc-torch-blocks-v1"
STATE = "state.json"
OWNER = "owner.json"  # whose a state folder is (backends/owners.py)


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
             warnings: list[Diagnostic], blocks: int | None = None) -> BlockResume:
        """The state of the run `identity` names (recipe, model files, output, this rank's share) under `disk`,
        agreed over the ranks: a state every rank holds for the same block, else none (a fresh folder). The
        first rank's staged output (a folder, or a GGUF file) is part of its state."""
        key = hashlib.sha256("\x00".join((*identity, f"rank {ranks.rank} of {ranks.world}")).encode()).hexdigest()[:24]
        shared = hashlib.sha256("\x00".join(identity).encode()).hexdigest()[:24]
        folder = disk / "checkpoints" / f"blocks-{key}"
        staged = destination.parent / f".{destination.name}.qrc-resume-{shared}"
        mine = owner(destination, *identity, world=ranks.world)
        if ranks.first:
            _remove_superseded(disk, staged, mine)
        saved, problem = _load(folder, blocks)
        if saved is not None and ranks.first and not staged.exists():
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
                _remove(staged)
        own_folder(folder, within=disk)  # a link planted in the state folder's place is refused (Q441)
        claim(folder / OWNER, mine)
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

    def adopt(self, streams: list[Stream]) -> list[HiddenCache]:
        """Each stream's hidden states replaced by those the state points at (the same recipe runs the same
        streams); the caches taken."""
        assert self.saved is not None, "a state was found"
        taken = []
        for stream in streams:
            stream.hidden.close()
            stream.hidden = HiddenCache.existing(stream.hidden.dtype, self.folder / self.saved.caches[stream.name])
            taken.append(stream.hidden)
        return taken

    def keeps(self, folder: Path | None) -> bool:
        """Whether the state points at this cache folder (left in place when the run stops)."""
        return folder is not None and self.saved is not None and folder.name in self.saved.caches.values()

    def remove(self) -> None:
        """The compile finished: its state goes."""
        shutil.rmtree(self.folder, ignore_errors=True)
        self.saved = None


def _remove_superseded(disk: Path, staged: Path, mine: dict) -> None:
    """What earlier runs into the same destination left that this one supersedes (backends/owners.py): their
    state folders and their staged outputs beside it."""
    for folder in (disk / "checkpoints").glob("blocks-*"):
        if superseded(folder / OWNER, mine):
            shutil.rmtree(folder, ignore_errors=True)
    for other in staged.parent.glob(staged.name.rsplit("-", 1)[0] + "-*"):
        if other != staged:
            _remove(other)


def _remove(staged: Path) -> None:
    """A staged output: a folder (safetensors) or one file (GGUF). A link (or a FIFO) planted at its name is
    removed itself, never what it points to."""
    if staged.is_dir() and not staged.is_symlink():
        shutil.rmtree(staged, ignore_errors=True)
    else:
        staged.unlink(missing_ok=True)


def checkpoint_identity(folder: Path | None) -> str:
    """The model folder's weight files as they are now (names, sizes, modification times): a state saved on
    other weights at the same path is another run's. A built-in (None) is its name in the recipe."""
    if folder is None:
        return ""
    files = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in folder.glob("*.safetensors"))
    return f"{folder} {files}"


def _load(folder: Path, blocks: int | None = None) -> tuple[Saved | None, str]:
    """The state saved in `folder` (None and why not, where something was there but is not a usable state).
    Data only: JSON of numbers and names, nothing from the folder runs. `blocks`: the run's block count, which
    no state's finished blocks can exceed (a tampered `done` is discarded, not trusted)."""
    path = folder / STATE
    if not path.exists():
        return None, ""
    try:
        found = read_json(path, 16 << 20, own=True)  # a link or a FIFO there is not a state
        if found.get("format") != FORMAT:
            return None, "it is not a state of this version"
        done, caches = found["done"], found["caches"]
        if not (isinstance(done, int) and done > 0 and isinstance(caches, dict)):
            return None, "it is not a valid state"
        if blocks is not None and done > blocks:
            return None, f"it says {done} blocks are done, of {blocks}"
        if any(not isinstance(n, str) or "/" in n or n.startswith(".") or not (folder / n).is_dir()
               for n in caches.values()):
            return None, "the hidden states it names are gone"
        finished = Finished(**found["finished"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return None, f"it could not be read ({type(exc).__name__})"
    return Saved(done, dict(caches), finished), ""


def finished(rounder: Rounder, costs: LayerCosts, kv: KvCacheQuantizer, smoother: Smoother | None) -> Finished:
    """What the run reported so far (the figures since its blocks began, including those restored), as data."""
    report, writer = rounder.report, rounder.writer
    return Finished(
        dict(report.weight_sqnr), {n: list(r) for n, r in report.input_ranges.items()}, dict(rounder.dampened),
        [j.layer.name for j in rounder.unseen], dict(costs.noise), dict(costs.signal),
        {n: list(state.scales) for n, state in kv.state.items() if state.scales is not None},
        list(smoother.gains) if smoother else [], smoother.folded if smoother else 0,
        out.written() if (out := output_writer(writer)) is not None else [])


def restore(done: Finished, rounder: Rounder, jobs: list[Job], costs: LayerCosts, kv: KvCacheQuantizer,
            smoother: Smoother | None) -> None:
    """What an earlier run's finished blocks reported, reported again by this one (the blocks are skipped); the
    tensors they wrote count as written."""
    rounder.report.weight_sqnr.update(done.sqnr)
    rounder.report.input_ranges.update({name: (low, high) for name, (low, high) in done.ranges.items()})
    rounder.dampened.update(done.dampened)
    unseen = set(done.unseen)
    rounder.unseen.extend(j for j in jobs if j.layer.name in unseen)
    costs.noise.update(done.noise)
    costs.signal.update(done.signal)
    for name, (k, v) in done.kv.items():
        kv.state[name].scales = (k, v)
    if smoother is not None:
        smoother.gains.extend(done.gains)
        smoother.folded += done.folded
    if (out := output_writer(rounder.writer)) is not None:
        out.missing -= set(done.written)
