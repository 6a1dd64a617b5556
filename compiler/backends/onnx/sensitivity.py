"""Scores for the mixed-precision search on onnxruntime (compiler/backends/sensitivity.py says what they mean).

kld is measured, unit by unit: the searched weights become graph inputs of one session that computes
only the model's first output, so every unit under every choice is one more run per chunk with that
unit's weights replaced, all others float. That costs units × choices runs per chunk: meant for small
models, where it is exact where a gradient estimate is first-order.

Under torchrun each rank runs its share of the scoring chunks (chunk i on rank i mod N) and the sums (the Gram
matrices, each unit's KL sums) are added over the ranks in rank order, so every rank scores alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx

from compiler.backends.agreement import Agreement
from compiler.backends.onnx.calibrate import augmented_model, session
from compiler.backends.onnx.files import ModelFiles
from compiler.backends.onnx.rewrite import weight_axes
from compiler.backends.ranks import Owned, Ranks, all_gathered, merged
from compiler.backends.sensitivity import fake_quantize, scoring_batches
from compiler.ir.types import Scheme, VerifyMetric
from compiler.models.exports import files_hash
from compiler.models.index import Layer, ModelIndex
from compiler.plan.ops import ScoreSensitivity
from compiler.quant.weights import Convention
from compiler.resolve.mixed import Unit


class OnnxScorer:
    """What the mixed-precision search reads from an ONNX model: weights, input Gram matrices, measured KL."""
    convention = Convention.ORT

    def rounded(self, w: np.ndarray, scheme: Scheme) -> np.ndarray:
        """The weight as the scheme rounds it (onnxruntime's conventions), back in float."""
        return fake_quantize(w, scheme, self.convention)

    def __init__(self, op: ScoreSensitivity, index: ModelIndex, files: ModelFiles, source: Path,
                 ranks: Ranks = Ranks()):
        """Under torchrun `ranks` says which scoring chunks are this rank's."""
        self.index, self.files, self.source, self.ranks = index, files, source, ranks
        batches = scoring_batches(op, index)
        self.batches = batches if ranks.world == 1 else Owned(batches, ranks)
        self.inits = {t.name: t for t in files.light.graph.initializer}
        self.axes: dict[str, tuple[int, int]] = {}
        for node in files.light.graph.node:
            for name in node.input:
                if name in self.inits:
                    self.axes.setdefault(name, weight_axes(node))

    def digest(self) -> str:
        """A content hash of the model's files (the score cache key)."""
        paths = [self.source]
        if self.files.path == self.source:  # weights outside the .onnx: hash their files too
            locations = {e.value for t in self.files.light.graph.initializer for e in t.external_data if e.key == "location"}
            paths += [self.source.parent / loc for loc in sorted(locations)]
        return files_hash(paths)

    # ---- weights as [out, in] ---------------------------------------------------------------------
    def weight(self, layer: Layer) -> np.ndarray:
        """The float weight of `layer` as [out, in] float32."""
        return self._to_rows(layer, self.files.array(self.inits[layer.weight]).astype(np.float32))

    def _to_rows(self, layer: Layer, stored: np.ndarray) -> np.ndarray:
        channel, _ = self.axes[layer.weight]
        return np.moveaxis(stored, channel, 0).reshape(stored.shape[channel], -1)

    def _from_rows(self, layer: Layer, rows: np.ndarray) -> np.ndarray:
        channel, _ = self.axes[layer.weight]
        moved = list(layer.shape)
        moved.insert(0, moved.pop(channel))
        return np.ascontiguousarray(np.moveaxis(rows.reshape(moved), 0, channel))

    # ---- mse: Σ xᵀx of each layer's input ------------------------------------------------------------
    def grams(self, layers: Sequence[Layer], progress) -> dict[str, np.ndarray]:
        """Layers whose input rows are not their weight's input features (Conv, Gather) get the identity:
        their score is the weight error alone."""
        by_input: dict[str, int] = {}
        for layer in layers:
            if layer.op in ("MatMul", "Gemm"):
                by_input.setdefault(layer.input, layer.in_features)
        sums = {name: np.zeros((k, k)) for name, k in by_input.items()}
        graph_inputs = {i.name for i in self.files.light.graph.input}
        produced = tuple(t for t in by_input if t not in graph_inputs)
        aug = augmented_model(self.files.light, self.index.graph, produced)
        names = [o.name for o in aug.graph.output]
        sess = session(aug, self.files.base_dir) if names else None
        del aug
        feeds = {i.name for i in sess.get_inputs()} if sess else set()
        advance = progress("score data", len(self.batches))
        for feed in self.batches:
            values = dict(zip(names, sess.run(names, {k: v for k, v in feed.items() if k in feeds}), strict=True)) if sess else {}
            values.update({t: feed[t] for t in by_input if t in feed})
            for name, k in by_input.items():
                rows = np.asarray(values[name], np.float64).reshape(-1, k)
                rows = rows[np.isfinite(rows).all(axis=1)]
                sums[name] += rows.T @ rows
            advance()
        if self.ranks.world > 1:  # every rank's chunks, added in rank order
            parts = all_gathered(self.ranks, sums)
            sums = {name: sum((part[name] for part in parts[1:]), parts[0][name].copy()) for name in sums}
        return {layer.name: sums[layer.input] if layer.input in sums else np.eye(layer.in_features) for layer in layers}

    # ---- kld: measured per unit ---------------------------------------------------------------------
    def kld(self, units: Sequence[Unit], schemes: Sequence[Scheme], progress) -> dict[str, list[float]]:
        """Each unit's KL divergence from float under each scheme, measured: one more run per unit × scheme and chunk."""
        members = [self.index.layer(n) for u in units for n in u.members]
        searched = list(dict.fromkeys(layer.weight for layer in members))
        first = self.files.light.graph.output[0].name
        model = _weights_as_inputs(augmented_model(self.files.light, self.index.graph, (first,)), searched)
        sess = session(model, self.files.base_dir)
        del model
        feeds = {i.name for i in sess.get_inputs()}
        floats = {w: self.files.array(self.inits[w]).astype(np.float32) for w in searched}
        replaced = {(u.name, k): {layer.weight: self._from_rows(layer, self.rounded(
            self._to_rows(layer, floats[layer.weight]), scheme))
            for layer in (self.index.layer(n) for n in u.members)} for u in units for k, scheme in enumerate(schemes)}
        agreements = {key: Agreement() for key in replaced}
        advance = progress("score kld", len(self.batches) * len(replaced))
        for feed in self.batches:
            inputs = {k: v for k, v in feed.items() if k in feeds} | floats
            reference = sess.run([first], inputs)[0]
            for key, weights in replaced.items():
                agreements[key].update(reference, sess.run([first], inputs | weights)[0], feed.get("attention_mask"))
                advance()
        agreements = merged(self.ranks, agreements)  # every rank's chunks, added in rank order
        return {u.name: [agreements[(u.name, k)].value(VerifyMetric.KLD) for k in range(len(schemes))] for u in units}


def _weights_as_inputs(model: onnx.ModelProto, weights: list[str]) -> onnx.ModelProto:
    """The searched weights stop being initializers and become inputs, so each run can feed its own."""
    wanted = set(weights)
    kept: list = []
    moved: list = []
    for tensor in model.graph.initializer:
        (moved if tensor.name in wanted else kept).append(tensor)
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    listed = {i.name for i in model.graph.input}
    model.graph.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                             for t in moved if t.name not in listed)
    return model
