"""Streaming calibration on onnxruntime: the session outputs only the observed tensors (the model's own
outputs and the nodes that then feed nothing are removed), data comes in chunks, and after each chunk
only observer state survives."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import onnx

from compiler.backends.onnx.hessians import PREFIX, hessian_observers
from compiler.backends.release import SESSION_MMAP_THRESHOLD, keep_large_blocks_mapped
from compiler.data import Batches
from compiler.plan.activations import needed_nodes
from compiler.quant.observers import make_observer


def augmented_model(model: onnx.ModelProto, graph_summary, observed: tuple[str, ...]) -> onnx.ModelProto:
    """A copy of `model` whose outputs are exactly the observed tensors that nodes produce."""
    produced = {o for n in model.graph.node for o in n.output}
    targets = [t for t in observed if t in produced]
    keep = {n.name for n in needed_nodes(graph_summary, set(targets))}
    aug = onnx.ModelProto()
    aug.CopyFrom(model)
    nodes = [n for n in aug.graph.node if n.name in keep]
    del aug.graph.node[:]
    aug.graph.node.extend(nodes)
    del aug.graph.output[:]
    aug.graph.output.extend(onnx.helper.make_empty_tensor_value_info(t) for t in targets)
    used = {i for n in nodes for i in n.input}
    kept_inits = [t for t in aug.graph.initializer if t.name in used]
    del aug.graph.initializer[:]
    aug.graph.initializer.extend(kept_inits)
    return aug


def first_output(path: Path, feed: dict, arena: bool = True):
    """The model's first output on `feed` (the inputs it takes of it), in a session of its own that goes after: what
    a transform's check compares before and after (onnx/smoothing.py, onnx/rotation.py)."""
    session = session_from_path(path, arena)
    names = {i.name for i in session.get_inputs()}
    return session.run([session.get_outputs()[0].name], {k: v for k, v in feed.items() if k in names})[0]


def session_from_path(path: Path, arena: bool = True, as_served: bool = False):
    """An onnxruntime CPU session read from a file (weights from its external data, never via Python).
    Without `arena`, its activations are allocated and freed as they come instead of in onnxruntime's arena,
    which grows by powers of two and keeps what it took (verification's two sessions: 33-37 MiB of the promise
    model's peak). `as_served`: every graph optimization, as a default session runs the model (integer
    kernels for QDQ groups, MatMulNBits for weight-only MatMuls); else basic ones only, because fusions would
    round differently in a whole graph and in a block of it, and every memory mode must observe the same
    values."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.enable_cpu_mem_arena = arena
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL if as_served else \
        ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    # Prepacking makes a second, kernel-specific copy of every MatMul weight: memory we did not plan.
    options.add_session_config_entry("session.disable_prepacking", "1")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def session(model: onnx.ModelProto, model_dir: Path, arena: bool = True):
    """A session for a weight-free proto whose initializers point into `model_dir`: the proto is written
    next to the data as a temporary file, which is removed as soon as the session exists (`arena`: as in
    session_from_path)."""
    fd, tmp = tempfile.mkstemp(dir=model_dir, prefix=".qrc-session-", suffix=".onnx")
    os.close(fd)
    try:
        Path(tmp).write_bytes(model.SerializeToString())
        return session_from_path(Path(tmp), arena)
    finally:
        Path(tmp).unlink(missing_ok=True)


def calibrate(model: onnx.ModelProto, model_dir: Path, graph_summary, observed: tuple[str, ...], batches: Batches,
              histogram: bool, bins: int, on_chunk: Callable[[], None] = lambda: None, workers: int = 1,
              checkpoint=None, hessians: dict[str, int] | None = None) -> dict[str, object]:
    """Observers for every observed tensor, and a Hessian observer for every tensor in `hessians` (→ its
    feature count; keyed compiler.backends.onnx.hessians.PREFIX + name), updated chunk by chunk. With
    `workers` > 1 the tensors of a chunk are observed in parallel threads (numpy releases the GIL); each
    observer still sees its chunks in order, so the result is the same bit for bit. With a `checkpoint`,
    observer state is saved after every chunk and an interrupted run resumes after the last chunk it
    finished."""
    observers: dict[str, object] = {t: make_observer(histogram, bins) for t in observed}
    observers.update(hessian_observers(hessians or {}))
    resumed = checkpoint.load() if checkpoint else None
    done = 0
    if resumed is not None and set(resumed[1]) == set(observers):
        done, observers = resumed
    fetched = tuple(dict.fromkeys((*observed, *(hessians or {}))))
    from_inputs = [t for t in fetched if t in {i.name for i in model.graph.input}]
    aug = augmented_model(model, graph_summary, fetched)
    names = [o.name for o in aug.graph.output]
    # Without onnxruntime's arena and with glibc's mmap threshold fixed, what a run holds is what the plan's
    # liveness walk counts: the arena grows in powers of two and keeps them (an HF-exported Qwen2's calibration
    # held 1.9x the walk's activations with it, 1.0x without), at 10-20% more time a run
    keep_large_blocks_mapped(SESSION_MMAP_THRESHOLD)
    sess = session(aug, model_dir, arena=False) if names else None
    del aug  # the session holds its own copy
    inputs = {i.name for i in sess.get_inputs()} if sess else set()
    for index, feed in enumerate(batches):
        if index < done:  # already observed by the interrupted run
            on_chunk()
            continue
        if from_inputs:
            _observe(observers, [(name, feed[name]) for name in from_inputs], 1)
        if sess is not None:
            outputs = sess.run(names, {k: v for k, v in feed.items() if k in inputs})
            _observe(observers, list(zip(names, outputs, strict=True)), workers)
            del outputs
        if checkpoint is not None:
            checkpoint.save(index + 1, observers)
        on_chunk()
    return observers


def observe(observers: dict, name: str, value) -> None:
    """Update every observer of tensor `name`: its range observer and its Hessian, where it has them."""
    for key in (name, PREFIX + name):
        if key in observers:
            observers[key].update(value)


def _observe(observers: dict, pairs: list, workers: int) -> None:
    if workers <= 1 or len(pairs) <= 1:
        for name, value in pairs:
            observe(observers, name, value)
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(lambda pair: observe(observers, pair[0], pair[1]), pairs))
