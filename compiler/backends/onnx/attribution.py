"""Which layers cost the most: when verification fails, each quantized layer's contribution to the error,
measured on held-out samples. Both models output every quantized layer's input and output tensor (the
rewrite keeps their names); a layer's share is the relative error of its output minus that of its input,
so error carried in from earlier layers is not blamed on it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from compiler.backends.onnx.calibrate import augmented_model, session
from compiler.backends.onnx.files import ModelFiles
from compiler.models.graph import summarize
from compiler.resolve.assignment import Assignment

TENSORS_PER_PASS = 16  # layer tensors held at once: a pass over the samples per group keeps memory to a few


def staged_layer_errors(assignment: Assignment, files: ModelFiles, staged: Path, batches,
                        offload_disk: Path | None) -> dict[str, float]:
    """Each quantized layer's added error in the staged model: whole, or (with `offload_disk`) segment by
    segment, the layer tensors cached under that folder."""
    if offload_disk is None:
        return layer_errors(assignment, files, staged, batches)
    from compiler.backends.onnx.files import open_model

    emitted = open_model(staged)
    try:
        return layer_errors_offload(assignment, files, emitted, batches, offload_disk)
    finally:
        emitted.close()


def layer_errors(assignment: Assignment, files: ModelFiles, staged: Path, batches) -> dict[str, float]:
    """Layer name → the relative error (‖ŷ − y‖² / ‖y‖²) it adds, on `batches`; largest first."""
    tensors = _layer_tensors(assignment, files.light)
    quantized = onnx.load(str(staged), load_external_data=False)
    graphs = ((files.light, files.base_dir, assignment.model.graph),
              (quantized, staged.parent, summarize(quantized, {t.name for t in quantized.graph.initializer})))
    names = _in_both(tensors, (files.light, quantized), with_inputs=False)
    signal: dict[str, float] = {}
    noise: dict[str, float] = {}
    for first in range(0, len(names), TENSORS_PER_PASS):
        group = tuple(names[first:first + TENSORS_PER_PASS])
        runs = [(session(augmented_model(model, graph, group), folder), group) for model, folder, graph in graphs]
        _accumulate(runs, batches, signal, noise)
    return _added(tensors, signal, noise)


def layer_errors_offload(assignment: Assignment, files: ModelFiles, emitted, batches, disk: Path) -> dict[str, float]:
    """The same figures in offload, segment by segment: the float model's layer tensors go to a cache on
    `disk` as its segments produce them, then the emitted model's are compared with them one at a time, so
    no whole model and no more than one tensor per segment is in memory."""
    from compiler.backends.onnx.segments import BoundaryCache, run_segments

    tensors = _layer_tensors(assignment, files.light)
    wanted = set(_in_both(tensors, (files.light, emitted.light), with_inputs=True))
    emitted_summary = summarize(emitted.light, {t.name for t in emitted.light.graph.initializer})
    cache = BoundaryCache(disk)
    signal: dict[str, float] = {}
    noise: dict[str, float] = {}
    stored: dict[str, int] = {}
    compared: dict[str, int] = {}

    def keep(name: str, value) -> None:
        cache.put(name, stored.setdefault(name, 0), value)
        stored[name] += 1

    def compare(name: str, value) -> None:
        chunk = compared.setdefault(name, 0)
        compared[name] += 1
        _add(name, cache.get(name, chunk), value, signal, noise)
        if compared[name] == stored.get(name):
            cache.drop(name)  # every sample of this tensor compared: its files go

    graph = assignment.model.graph
    assert graph is not None  # an ONNX model's index has its graph
    try:
        run_segments(files.light, files.base_dir, graph, batches, wanted, keep, disk)
        run_segments(emitted.light, emitted.base_dir, emitted_summary, batches, wanted, compare, disk)
    finally:
        cache.close()
    return _added(tensors, signal, noise)


def _in_both(tensors: dict[str, tuple[str, str]], models, with_inputs: bool) -> list[str]:
    """The layer tensors both graphs produce (and, `with_inputs`, take as graph inputs), sorted."""
    def values(model) -> set[str]:
        produced = {o for node in model.graph.node for o in node.output}
        return produced | {i.name for i in model.graph.input} if with_inputs else produced
    found = [values(model) for model in models]
    return sorted({t for pair in tensors.values() for t in pair if all(t in f for f in found)})


def _add(name: str, ref, cand, signal: dict[str, float], noise: dict[str, float]) -> None:
    ref, cand = np.asarray(ref, np.float64), np.asarray(cand, np.float64)
    finite = np.isfinite(ref) & np.isfinite(cand)
    signal[name] = signal.get(name, 0.0) + float(np.sum(np.where(finite, ref, 0.0) ** 2))
    noise[name] = noise.get(name, 0.0) + float(np.sum(np.where(finite, ref - cand, 0.0) ** 2))


def _added(tensors: dict[str, tuple[str, str]], signal: dict[str, float], noise: dict[str, float]) -> dict[str, float]:
    """Layer → its output's relative error minus its input's; largest first."""
    relative = {n: noise[n] / max(signal[n], 1e-30) for n in signal}
    added = {layer: relative.get(out, 0.0) - relative.get(inp, 0.0) for layer, (inp, out) in tensors.items()
             if out in relative}
    return dict(sorted(added.items(), key=lambda item: -item[1]))


def _accumulate(runs, batches, signal: dict[str, float], noise: dict[str, float]) -> None:
    for feed in batches:
        values = []
        for sess, available in runs:
            inputs = {i.name for i in sess.get_inputs()}
            values.append(dict(zip(available, sess.run(available, {k: v for k, v in feed.items() if k in inputs}),
                                   strict=True)))
        for name in set(values[0]) & set(values[1]):
            _add(name, values[0][name], values[1][name], signal, noise)


def _layer_tensors(assignment: Assignment, model: onnx.ModelProto) -> dict[str, tuple[str, str]]:
    """Quantized layer → (its input tensor, its output tensor) in the float graph."""
    by_weight = {a.layer.weight: a.layer for a in assignment.layers if not a.scheme.is_none}
    out: dict[str, tuple[str, str]] = {}
    for node in model.graph.node:
        for name in node.input:
            layer = by_weight.get(name)
            if layer is not None and layer.name not in out and node.output:
                out[layer.name] = (layer.input, node.output[0])
    return out
