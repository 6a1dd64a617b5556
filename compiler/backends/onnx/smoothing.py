"""AWQ and SmoothQuant on the ONNX backend. The mappings were resolved against the graph (a norm's readers
are exactly the MatMuls the graph sends its output to, so the fold is an equivalent model by construction):
each norm's output is observed over the calibration chunks (one whole-graph session, or segment by segment
in offload), the scales come from compiler/quant/smoothing.py, and the model is rewritten into a scratch
folder initializer by initializer — the norm's weight and bias divided by the scales, each target's MatMul
rows multiplied by them — so no more than one weight is in memory at a time. Calibration, rounding and
emission then run on that copy; verification compares with the original float model."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import onnx
from onnx import helper, numpy_helper

from compiler.backends.onnx.calibrate import augmented_model, first_output, session
from compiler.backends.onnx.files import ModelFiles, new_scratch
from compiler.backends.onnx.rewrite import weight_axes, weight_nodes
from compiler.backends.onnx.segments import run_segments
from compiler.backends.ranks import Ranks, merged
from compiler.backends.release import SESSION_MMAP_THRESHOLD, keep_large_blocks_mapped, release_memory
from compiler.backends.result import BackendError, refuse_changed_output
from compiler.ir.kinds import TransformData
from compiler.ir.types import MemoryMode, Rounding, Transform, TransformKind, WeightQuant
from compiler.models.index import ModelIndex
from compiler.quant.smoothing import ChannelStats, awq_scales, searched_smoothquant_scales, smoothquant_scales
from compiler.quant.weights import Convention, quantize_weight
from compiler.resolve.assignment import Assignment
from compiler.resolve.smoothing import SmoothingMapping, SourceKind


class Turning(Protocol):
    """A rotation written into the same copy as the smoothing (onnx/rotation.py OnlineDown: R4 alone)."""

    def planned(self, plan: Mapping[str, Rewrite], light: onnx.ModelProto) -> dict[str, Rewrite]:
        """The smoothing's rewrites with the rotation's composed after them."""
        ...

    def edit(self, model: onnx.ModelProto) -> None:
        """What the rotation adds to the copy's graph."""
        ...


class Rewrite(Protocol):
    """What the rewrite does to one initializer's values."""

    def apply(self, values: np.ndarray) -> np.ndarray:
        """The new values, in the initializer's dtype."""
        ...


@dataclass(frozen=True)
class Scaling:
    """What the rewrite does to one initializer: divide (a norm's weight or bias; a MatMul source's output
    channels, along `axis`) or multiply its input rows (a target's weight, whose input axis is `axis`) by
    `scales`."""
    scales: np.ndarray
    divide: bool
    axis: int = 0  # the weight's input axis (multiplied), or a MatMul source's output axis (divided)

    def apply(self, values: np.ndarray) -> np.ndarray:
        """The rescaled values, in the initializer's dtype."""
        shape = [1] * values.ndim
        shape[self.axis] = -1
        s = self.scales.reshape(shape).astype(values.dtype)
        return values / s if self.divide else values * s


@dataclass(frozen=True)
class Chained:
    """One rewrite, then another (an up projection that takes its norm's scales on its input rows and divides its
    output channels by the product's; a down projection's scaling, then R4)."""

    first: Rewrite
    second: Rewrite

    def apply(self, values: np.ndarray) -> np.ndarray:
        """The second rewrite of the first's values."""
        return self.second.apply(self.first.apply(values))


def chain(plan: dict[str, Rewrite], name: str, rewrite: Rewrite) -> None:
    """`rewrite` after whatever `plan` already does to `name`."""
    plan[name] = Chained(plan[name], rewrite) if name in plan else rewrite


def smooth(t: Transform, assignment: Assignment, files: ModelFiles, mode: MemoryMode, batches, disk: Path | None,
           advance: Callable[[], None], ranks: Ranks | None = None, turning: Turning | None = None
           ) -> tuple[ModelFiles, tuple[list[float], list[float | None]]]:
    """The smoothed copy of the model by the transform `t`, and what its searches found (transform_summary's
    gains and alphas): each mapping's relative error reduction (AWQ's, a searched SmoothQuant strength's) and
    the strengths searched (None where the identity won). `turning`: a rotation after the fold, in the same copy
    (its statistics are the unrotated model's, as the scales are computed before it).
    Under torchrun `batches` are this rank's chunks: every rank's statistics are merged in rank order (the
    maxima exactly, the sums in that order), so each rank makes the same copy."""
    index = assignment.model
    by_output = {_observed(m, index): m for m in assignment.smoothing}
    awq = t.data is TransformData.GRAM  # AWQ, or a searched SmoothQuant strength
    stats: dict[str, ChannelStats] = {}

    def on_value(name: str, value: np.ndarray) -> None:
        source = by_output[name].source
        if source not in stats:
            stats[source] = ChannelStats.empty(value.shape[-1], awq, t.alpha_search)
        stats[source].update(value)

    if mode is MemoryMode.OFFLOAD:
        assert index.graph is not None  # an ONNX model's index has its graph
        run_segments(files.light, files.base_dir, index.graph, batches, set(by_output), on_value, disk, advance)
    else:
        _observe_whole(files, index, tuple(by_output), batches, on_value, advance)
    release_memory()
    stats = merged(ranks or Ranks(), stats)
    plan: Mapping[str, Rewrite]
    plan, gains, alphas = _scalings(t, assignment, files, stats)
    if turning is not None:
        plan = turning.planned(plan, files.light)
    smoothed = rewrite_initializers(files, plan, edit=turning.edit if turning is not None else None, where=disk)
    first = next(iter(batches), None)  # a rank given no chunk leaves the check to the others
    if mode is not MemoryMode.OFFLOAD and first is not None:  # the graph made the fold exact; one chunk through
        _check_unchanged(t, assignment, files.path, smoothed, first)  # both says it is
    return smoothed, (gains, alphas)


def _observe_whole(files: ModelFiles, index: ModelIndex, outputs: tuple[str, ...], batches,
                   on_value: Callable[[str, np.ndarray], None], advance: Callable[[], None]) -> None:
    """Every chunk through one session whose outputs are `outputs`, each value to `on_value`, held as calibration
    holds it (onnx/calibrate.py: no arena, large blocks mapped, so what it holds is what the plan's liveness walk
    counts). In a function of its own so that no value outlives it: a kept output (a loop variable) kept its
    session's memory: the real SmolLM2's pass, with an arena, left 2.1 GiB resident under the fold's check
    (3.1 GiB at its peak)."""
    keep_large_blocks_mapped(SESSION_MMAP_THRESHOLD)
    sess = session(augmented_model(files.light, index.graph, outputs), files.base_dir, arena=False)
    inputs = {i.name for i in sess.get_inputs()}
    for feed in batches:
        for name, value in zip(outputs, sess.run(list(outputs), {k: v for k, v in feed.items() if k in inputs}),
                               strict=True):
            on_value(name, value)
        advance()


def _observed(m: SmoothingMapping, index: ModelIndex) -> str:
    """The value a mapping's statistics read: a norm's output, or (a MatMul source: the gated product's pair,
    resolve/smoothing.py gated_pair) the product its target reads."""
    if m.kind is SourceKind.NORM:
        return next(n.output for n in index.norms if n.name == m.source)
    return index.layer(m.targets[0]).input


def _check_unchanged(t: Transform, assignment: Assignment, original: Path, smoothed: ModelFiles,
                     feed: dict) -> None:
    """Q422: the smoothed copy's first output on one sample of a chunk equals the original's (one session at a
    time, each without onnxruntime's arena). One sample shows a fold that is not exact as well as a chunk does, and
    a language model's logits for a chunk are large: both held and their difference, 2.4 GB for 8 × 512 tokens of
    SmolLM2's 49,152-word head (measured: static W8A8 after SmoothQuant 5.16 GiB against 3.09 planned)."""
    outputs = [first_output(path, _one_sample(feed), arena=False) for path in (original, smoothed.path)]
    try:
        float32 = np.asarray(outputs[0]).dtype == np.float32
        refuse_changed_output(t.span, outputs[0], outputs[1], float32, [m.source for m in assignment.smoothing])
    except BackendError:
        smoothed.close()
        raise


def _one_sample(feed: dict) -> dict:
    """The feed's first sample, where every input is batch-first with the same batch (else the feed as it is)."""
    batches = {np.shape(v)[0] if np.ndim(v) else None for v in feed.values()}
    if len(batches) != 1 or None in batches:
        return feed
    return {k: v[:1] for k, v in feed.items()}


def _scalings(t: Transform, assignment: Assignment, files: ModelFiles,
              stats: dict[str, ChannelStats]) -> tuple[dict[str, Rewrite], list[float], list[float | None]]:
    """Per initializer, how the rewrite changes it; one mapping's weights read at a time."""
    index = assignment.model
    norms = {n.name: n for n in index.norms}
    inits = {x.name: x for x in files.light.graph.initializer}
    layers = {a.layer.name: a for a in assignment.layers}
    plan: dict[str, Rewrite] = {}
    gains: list[float] = []
    alphas: list[float | None] = []
    for m in assignment.smoothing:
        if m.source not in stats or not stats[m.source].rows:
            continue
        weights = [layers[x].layer.weight for x in m.targets]
        nodes = dict((w, node) for node, w in weight_nodes(files.light, set(weights)))
        axes = {w: weight_axes(nodes[w])[1] for w in weights}
        as_rows = [_out_in(files.array(inits[w]), axes[w]) for w in weights]  # [out, in]
        if t.alpha_search:
            scales, alpha, gain = searched_smoothquant_scales(stats[m.source], as_rows,
                                                              [layers[x].scheme for x in m.targets], t.grid, _rtn)
            gains.append(gain)
            alphas.append(alpha)
        elif t.kind is TransformKind.SMOOTHQUANT:
            scales = smoothquant_scales(stats[m.source], as_rows, t.alpha)
        elif t.kind.scales is not None:  # a registered plug-in's
            scales = t.kind.scales(stats[m.source], as_rows, t)
        else:
            specs = [None if layers[x].scheme.is_none else layers[x].scheme.weights for x in m.targets]
            scales, gain = awq_scales(stats[m.source], as_rows, specs, t.grid, t.duo_scaling, _rtn)
            gains.append(gain)
        del as_rows
        if m.kind is SourceKind.NORM:
            norm = norms[m.source]
            for name in filter(None, (norm.weight, norm.bias)):
                chain(plan, name, Scaling(scales, divide=True))
        else:  # its output channels: the MatMul's own axis (gated_pair: no bias between it and the product)
            source = layers[m.source].layer.weight
            node = next(node for node, _ in weight_nodes(files.light, {source}))
            chain(plan, source, Scaling(scales, divide=True, axis=weight_axes(node)[0]))
        for w in weights:
            chain(plan, w, Scaling(scales, divide=False, axis=axes[w]))
    return plan, gains, alphas


def _out_in(w: np.ndarray, input_axis: int) -> np.ndarray:
    return np.asarray(w, np.float32) if input_axis == 1 else np.asarray(w, np.float32).T


def _rtn(w: np.ndarray, spec: WeightQuant) -> np.ndarray:
    """The search's rounding: the scheme's rtn in onnxruntime's convention (MLAS for 4-bit blocks)."""
    return quantize_weight(w, spec, Rounding.RTN, 0, 1, Convention.ORT).dequantize()


def rewrite_initializers(files: ModelFiles, plan: Mapping[str, Rewrite], added: Mapping[str, Callable[[], np.ndarray]]
                         | None = None, edit: Callable[[onnx.ModelProto], None] | None = None,
                         what: str = "smoothed", where: Path | None = None) -> ModelFiles:
    """A copy of the model in a scratch folder (`qrc-{what}-…`, under `where`: the recipe's `memory { disk }`,
    else the temporary folder) with the planned initializers rewritten: every external tensor is read, changed
    where planned, and appended to one new data file, one at a time; `added` tensors (computed when they are
    written) go to the data file after them, and `edit` changes the copy's graph (onnx/rotation.py)."""
    scratch = new_scratch(f"qrc-{what}-", where)
    try:
        light = onnx.ModelProto()
        light.CopyFrom(files.light)
        if edit is not None:
            edit(light)
        path = scratch / files.path.name
        data_name = files.path.name + ".data"
        offset = 0
        with open(scratch / data_name, "wb") as data:
            def external(tensor: onnx.TensorProto, values: np.ndarray) -> None:
                nonlocal offset
                raw = np.ascontiguousarray(values)  # written from its buffer: no bytes copy beside it
                data.write(raw.data)
                del tensor.external_data[:]
                tensor.data_location = onnx.TensorProto.EXTERNAL
                for key, value in (("location", data_name), ("offset", str(offset)), ("length", str(raw.nbytes))):
                    entry = tensor.external_data.add()
                    entry.key, entry.value = key, value
                offset += raw.nbytes

            for tensor in light.graph.initializer:
                stored_outside = tensor.data_location == onnx.TensorProto.EXTERNAL
                if not stored_outside and tensor.name not in plan:
                    continue
                values = files.array(tensor)
                if tensor.name in plan:
                    values = plan[tensor.name].apply(values)
                if not stored_outside:
                    tensor.CopyFrom(numpy_helper.from_array(values, tensor.name))
                    continue
                external(tensor, values)
            for name, compute in (added or {}).items():
                values = compute()
                tensor = light.graph.initializer.add()
                tensor.name, tensor.data_type = name, helper.np_dtype_to_tensor_dtype(values.dtype)
                tensor.dims.extend(values.shape)
                external(tensor, values)
        path.write_bytes(light.SerializeToString())
        return ModelFiles(path, light, scratch)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
