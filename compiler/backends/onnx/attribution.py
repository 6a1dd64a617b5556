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


def layer_errors(assignment: Assignment, files: ModelFiles, staged: Path, batches) -> dict[str, float]:
    """Layer name → the relative error (‖ŷ − y‖² / ‖y‖²) it adds, on `batches`; largest first."""
    tensors = _layer_tensors(assignment, files.light)
    names = sorted({t for pair in tensors.values() for t in pair})
    quantized = onnx.load(str(staged), load_external_data=False)
    graphs = ((files.light, files.base_dir, assignment.model.graph),
              (quantized, staged.parent, summarize(quantized, {t.name for t in quantized.graph.initializer})))
    produced = [{o for node in model.graph.node for o in node.output} for model, _, _ in graphs]
    names = [n for n in names if all(n in p for p in produced)]
    signal: dict[str, float] = {}
    noise: dict[str, float] = {}
    for first in range(0, len(names), TENSORS_PER_PASS):
        group = tuple(names[first:first + TENSORS_PER_PASS])
        runs = [(session(augmented_model(model, graph, group), folder), group) for model, folder, graph in graphs]
        _accumulate(runs, batches, signal, noise)
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
            ref, cand = np.asarray(values[0][name], np.float64), np.asarray(values[1][name], np.float64)
            finite = np.isfinite(ref) & np.isfinite(cand)
            signal[name] = signal.get(name, 0.0) + float(np.sum(np.where(finite, ref, 0.0) ** 2))
            noise[name] = noise.get(name, 0.0) + float(np.sum(np.where(finite, ref - cand, 0.0) ** 2))


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
