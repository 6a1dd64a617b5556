"""Offload: the graph cut into contiguous per-block segments, run one segment at a time so that only
one block's weights are resident. Values crossing a segment boundary are cached per chunk (on disk
when the recipe gives `disk`, in their own dtype) and deleted once the last segment that reads them
has run."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from compiler.backends.onnx.calibrate import session
from compiler.backends.release import SESSION_MMAP_THRESHOLD, keep_large_blocks_mapped, trim_heap
from compiler.data import Batches
from compiler.models.graph import GraphSummary
from compiler.plan.activations import segment_runs
from compiler.safe_files import own_folder


@dataclass(frozen=True)
class Segment:
    """The nodes of one block (a run of the graph) and the values it reads from and passes to other segments."""
    name: str
    nodes: tuple[onnx.NodeProto, ...]


def cut(model: onnx.ModelProto) -> list[Segment]:
    """Runs of nodes in file order, one per block. A node outside every block (embeddings, masks, a
    weight's DequantizeLinear, the final norm) joins the block of the next node that has one, or the
    last block: so a dequantized weight is produced in the segment that reads it."""
    nodes = list(model.graph.node)
    return [Segment(block, tuple(nodes[i] for i in idx)) for block, idx in segment_runs([n.name for n in nodes])]


@dataclass
class BoundaryCache:
    """Values crossing segments, per chunk: numpy files under `folder`, or in memory without one.

    With a `key`, the files live in `folder/boundary-<key>/` under names derived from (value, chunk), so
    a resumed run finds what the interrupted one wrote; `close(keep=True)` leaves them for it."""

    folder: Path | None
    key: str | None = None
    _memory: dict[tuple[str, int], np.ndarray] = field(default_factory=dict)
    _scratch: Path | None = None

    def __post_init__(self) -> None:
        if self.folder is None:
            return
        own_folder(self.folder)  # the cache folders qrc names are never links elsewhere (Q441)
        if self.key:
            self._scratch = own_folder(self.folder / f"boundary-{self.key}")
        else:
            self._scratch = Path(tempfile.mkdtemp(dir=self.folder, prefix="boundary-"))

    def _path(self, name: str, chunk: int) -> Path:
        assert self._scratch is not None, "the cache's folder is made before anything is put"
        return self._scratch / f"{hashlib.sha1(name.encode()).hexdigest()[:16]}-{chunk}.npy"

    def put(self, name: str, chunk: int, value: np.ndarray) -> None:
        """Keep one chunk of a boundary value (in memory, or on disk when a folder is given)."""
        if self._scratch is None:
            self._memory[(name, chunk)] = value
            return
        path = self._path(name, chunk)
        fd, tmp = tempfile.mkstemp(dir=self._scratch, prefix=f".{path.stem}.", suffix=".npy")  # never a planted name
        try:
            with os.fdopen(fd, "wb") as handle:
                np.save(handle, value, allow_pickle=False)  # keeps the dtype: no float64 promotion on reload
        except OSError as exc:  # a full disk: no partial file left, and the error names the cache
            Path(tmp).unlink(missing_ok=True)
            raise OSError(exc.errno, exc.strerror or "the disk cache is full", str(path)) from None
        os.replace(tmp, path)

    def get(self, name: str, chunk: int) -> np.ndarray:
        """One chunk of a boundary value."""
        if self._scratch is None:
            return self._memory[(name, chunk)]
        return np.load(self._path(name, chunk), allow_pickle=False)

    def drop(self, name: str) -> None:
        """Forget a boundary value no later segment reads."""
        for key in [k for k in self._memory if k[0] == name]:
            del self._memory[key]
        if self._scratch is not None:
            prefix = hashlib.sha1(name.encode()).hexdigest()[:16] + "-"
            for path in self._scratch.glob(prefix + "*.npy"):
                path.unlink(missing_ok=True)

    def close(self, keep: bool = False) -> None:
        """Remove the cache's files (or keep them for a resumed run)."""
        self._memory.clear()
        if self._scratch is not None and not keep:
            shutil.rmtree(self._scratch, ignore_errors=True)


def _subgraph(model: onnx.ModelProto, summary: GraphSummary, segment: Segment, outputs: list[str]) -> onnx.ModelProto:
    segment = Segment(segment.name, _needed(segment.nodes, outputs))
    produced = {o for n in segment.nodes for o in n.output}
    weights = {t.name: t for t in model.graph.initializer}
    needed = [i for n in segment.nodes for i in n.input if i and i not in produced]
    inputs = list(dict.fromkeys(i for i in needed if i not in weights))
    graph = helper.make_graph(list(segment.nodes), segment.name, [_info(summary, i) for i in inputs],
                              [_info(summary, o) for o in outputs],
                              [weights[i] for i in dict.fromkeys(needed) if i in weights])
    sub = helper.make_model(graph, opset_imports=list(model.opset_import))
    sub.ir_version = model.ir_version
    return sub


def _needed(nodes: tuple[onnx.NodeProto, ...], outputs: list[str]) -> tuple[onnx.NodeProto, ...]:
    """The nodes of a segment that its requested outputs depend on."""
    producer = {o: n for n in nodes for o in n.output}
    keep, stack = set(), list(outputs)
    while stack:
        node = producer.get(stack.pop())
        if node is not None and id(node) not in keep:
            keep.add(id(node))
            stack.extend(node.input)
    return tuple(n for n in nodes if id(n) in keep)


def _info(summary: GraphSummary, name: str) -> onnx.ValueInfoProto:
    value = summary.value(name)
    return helper.make_tensor_value_info(name, value.elem_type if value else onnx.TensorProto.FLOAT, None)


def run_segments(model: onnx.ModelProto, model_dir: Path, summary: GraphSummary, batches: Sequence[dict] | Batches,
                 wanted: set[str], on_value: Callable[[str, np.ndarray], None], disk: Path | None,
                 on_chunk: Callable[[], None] = lambda: None, resume: Resume | None = None,
                 on_segment: Callable[[list[str]], None] = lambda reported: None) -> None:
    """Run the model segment by segment over all chunks, reporting every `wanted` value as it is produced.
    Each wanted value is reported for chunk 0, 1, … in order, as in one whole-graph pass. `on_chunk` is
    called once per segment and chunk; `on_segment`, with the wanted names a segment produced, once it has
    run every chunk (their statistics are then complete)."""
    keep_large_blocks_mapped(SESSION_MMAP_THRESHOLD)  # as for whole-graph sessions (calibrate.calibrate)
    segments = cut(model)
    consumers = _last_reader(segments)
    graph_inputs = set(summary.inputs)
    cache = BoundaryCache(disk, resume.key if resume else None)
    start = resume.done() if resume else 0
    finished = False
    try:
        for index, segment in enumerate(segments):
            if index < start:  # finished by the interrupted run: its outputs are on disk
                for _ in range(len(batches)):
                    on_chunk()
                continue
            produced = [o for n in segment.nodes for o in n.output if o]  # '' marks an absent optional output
            crossing = [o for o in produced if consumers.get(o, -1) > index]
            reported = [o for o in produced if o in wanted]
            outputs = list(dict.fromkeys(crossing + reported))
            if not outputs:
                continue
            # no arena: offload is the mode for tight memory, and one segment's sessions follow another's
            sess = session(_subgraph(model, summary, segment, outputs), model_dir, arena=False)
            feeds_needed = [i.name for i in sess.get_inputs()]
            for chunk, feed in enumerate(batches):
                inputs = {n: feed[n] if n in graph_inputs else cache.get(n, chunk) for n in feeds_needed}
                for name, value in zip(outputs, sess.run(outputs, inputs), strict=True):
                    if name in wanted:
                        on_value(name, value)
                    if name in crossing:
                        cache.put(name, chunk, value)
                on_chunk()
            del sess
            # the segment's freed activations, not kept for the next: the promise model's offload verification
            # peaked at 191-204 MiB without this trim, 193-198 with it
            trim_heap()
            on_segment(reported)
            if resume:  # record the segment before deleting what it consumed
                resume.save(index + 1)
            for name in [n for n, last in consumers.items() if last == index]:
                cache.drop(name)
        finished = True
    finally:
        cache.close(keep=resume is not None and not finished)


@dataclass
class Resume:
    """Offload checkpoints: `save(n)` after segment n-1 completed (with the observers it updated)."""

    key: str
    done: Callable[[], int]
    save: Callable[[int], None]


def _last_reader(segments: list[Segment]) -> dict[str, int]:
    last: dict[str, int] = {}
    for index, segment in enumerate(segments):
        for node in segment.nodes:
            for name in node.input:
                last[name] = index
    return last
