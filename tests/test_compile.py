"""`qrc compile` on the ONNX backend: emitted models are valid, loadable, deterministic and golden."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from compiling import ROOT, assert_ran_the_plan, available, compile_, compile_program

from compiler import check_file
from compiler.backends.onnx.dump import dump
from golden import assert_golden

ONNX_RECIPES = [p for p in sorted((ROOT / "recipes").glob("*.recipe"))
                if check_file(p).ir.backend.value == "onnx" and available(check_file(p).ir.model)]


@pytest.fixture(autouse=True)
def _at_root(monkeypatch):
    monkeypatch.chdir(ROOT)


@pytest.mark.parametrize("path", ONNX_RECIPES, ids=[p.stem for p in ONNX_RECIPES])
@pytest.mark.slow
def test_emitted_model_golden_valid_and_verified(path, tmp_path):
    out = tmp_path / f"{path.stem}.onnx"
    result, planned = compile_program(path.relative_to(ROOT).as_posix(), out)
    assert result.verify_passed
    assert_ran_the_plan(result, planned)
    onnx.checker.check_model(str(out), full_check=True)
    assert_golden(dump(onnx.load(str(out))), f"models/{path.stem}.txt")


@pytest.mark.slow
def test_byte_identical_across_processes(tmp_path):
    outputs = []
    for seed in ("1", "4242"):
        out = tmp_path / f"m{seed}.onnx"
        env = {**os.environ, "PYTHONHASHSEED": seed}
        subprocess.run([sys.executable, "-m", "compiler", "compile", "recipes/tiny-llama-w4a16.recipe", "-o", str(out)],
                       cwd=ROOT, env=env, check=True, capture_output=True)
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1]


def test_onnxruntime_and_reference_evaluator_agree(tmp_path):
    import onnxruntime as ort
    from onnx.reference import ReferenceEvaluator

    out = tmp_path / "qdq.onnx"
    result = compile_("recipes/tiny-llama-w4a16.recipe", out, "emit.format=qdq")  # int4 blocked DQ + int8 QDQ
    assert result.exit_code == 0, result.output
    ids = np.random.RandomState(3).randint(0, 512, (2, 10)).astype(np.int64)
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    # Unoptimised, onnxruntime runs the graph as written; optimised, it fuses Q/DQ into integer kernels
    # (QLinearMatMul, MatMulNBits at int8 accuracy) that round differently, which `verify` measures.
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    got = ort.InferenceSession(str(out), options, providers=["CPUExecutionProvider"]).run(["logits"], feed)[0]
    want = ReferenceEvaluator(str(out)).run(["logits"], feed)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_failed_verification_leaves_the_model_and_a_report(tmp_path):
    out = tmp_path / "strict.onnx"
    result = compile_("recipes/tiny-llama-w4a16.recipe", out, "verify.at_least=0.99999")
    assert result.exit_code == 2 and "error[Q501]" in result.output
    report = json.loads((tmp_path / "strict.onnx.verify.json").read_text())
    assert out.exists() and report["value"] < 0.99999


def _write_npz(path: Path, **arrays) -> None:
    np.savez(path, **arrays)


def test_npz_data_and_its_diagnostics(tmp_path):
    ids = np.random.RandomState(0).randint(0, 512, (24, 32)).astype(np.int64)
    good = tmp_path / "calib.npz"
    _write_npz(good, input_ids=ids, attention_mask=np.ones_like(ids))
    data = f'calibrate.data=npz "{good}" {{ samples 16 }}'
    result = compile_("recipes/tiny-llama-w8a8.recipe", tmp_path / "npz.onnx", data)
    assert result.exit_code == 0, result.output
    cases = [
        ({"input_ids": ids}, "Q402"),
        ({"input_ids": ids.astype(np.float32), "attention_mask": np.ones_like(ids)}, "Q403"),
    ]
    for arrays, code in cases:
        bad = tmp_path / f"{code}.npz"
        _write_npz(bad, **arrays)
        result = compile_("recipes/tiny-llama-w8a8.recipe", tmp_path / "bad.onnx", f'calibrate.data=npz "{bad}"')
        assert result.exit_code == 2 and f"error[{code}]" in result.output, result.output
        assert not (tmp_path / "bad.onnx").exists()
    missing = compile_("recipes/tiny-llama-w8a8.recipe", tmp_path / "bad.onnx", 'calibrate.data=npz "nope.npz"')
    assert "error[Q401]" in missing.output


def _masked_model(path: Path) -> None:
    """x → Where(x > 1, -inf, x) → MatMul(W): the layer's input holds -inf, like a masked score."""
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.RandomState(0).standard_normal((16, 8)).astype(np.float32), "fc.weight")
    inf = numpy_helper.from_array(np.array(-np.inf, np.float32), "minus_inf")
    one = numpy_helper.from_array(np.array(1.0, np.float32), "one")
    nodes = [helper.make_node("Greater", ["x", "one"], ["big"], name="/mask/Greater"),
             helper.make_node("Where", ["big", "minus_inf", "x"], ["masked"], name="/mask/Where"),
             helper.make_node("MatMul", ["masked", "fc.weight"], ["y"], name="/fc/MatMul")]
    graph = helper.make_graph(nodes, "masked", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])], [w, inf, one])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.save(model, str(path))


@pytest.mark.parametrize("method", ["minmax", "percentile 99.9"])
def test_minus_infinity_calibrates_without_nan(tmp_path, method):
    model = tmp_path / "masked.onnx"
    _masked_model(model)
    recipe = tmp_path / "masked.recipe"
    recipe.write_text(f'recipe m {{ model "{model}" quantize {{ "*" -> W8A8_STATIC }} calibrate {{ method {method} }} }}')
    out = tmp_path / "q.onnx"
    result = compile_(str(recipe), out)
    assert result.exit_code == 0, result.output
    scales = [onnx.numpy_helper.to_array(t) for t in onnx.load(str(out)).graph.initializer if t.name.endswith("_scale")]
    assert scales and all(np.isfinite(s).all() and (s > 0).all() for s in scales)


@pytest.mark.slow
def test_interrupted_compile_leaves_no_file(tmp_path):
    out = tmp_path / "big.onnx"
    model = "model=builtin:tiny-llama?layers=4&hidden=256&heads=4&kv_heads=2&vocab=8000&intermediate=512"
    args = [sys.executable, "-m", "compiler", "compile", "recipes/tiny-llama-w8a8.recipe", "-o", str(out),
            "--set", model, "--set", "calibrate.data=synthetic { samples 512 seqlen 256 }"]
    subprocess.run([sys.executable, "-m", "compiler", "inspect", model.split("=", 1)[1], "-f", "json"], cwd=ROOT,
                   check=True, capture_output=True)  # build the model first, so the kill lands in calibration
    lock = out.with_name(f".{out.name}.qrc-lock")  # held from just before the run's work (and its signal handler)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        # a suite started in the background (`cmd &` in a script) ignores SIGINT, and children inherit that: the
        # child gets the default a terminal's process has, so Ctrl-C reaches it as it reaches a user's compile
        proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        # a fixed sleep raced the interpreter's start on a loaded machine (SIGTERM before qrc's handler: -15)
        deadline = time.monotonic() + 120
        while not _holds(lock, proc.pid) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)
        assert proc.poll() is None, "the compile finished before it could be interrupted"
        proc.send_signal(sig)
        said, err = proc.communicate(timeout=120)
        said = (said + err).decode(errors="replace")[-3000:]
        assert proc.returncode in (130, -9), (sig.name, proc.returncode, said)
        assert not out.exists(), (f"{sig.name} left {out}", said)


def _holds(lock: Path, pid: int) -> bool:
    """Whether process `pid` holds the destination lock (the lock file holds its holder's id: a lock file left
    by an earlier run is not this run's)."""
    try:
        return lock.read_text().strip() == str(pid)
    except OSError:
        return False


def _opset17_model(folder: Path) -> Path:
    """Two MatMuls at opset 17, as older exporters write them."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
               for name, shape in (("fc1.weight", (64, 64)), ("fc2.weight", (64, 32)))]
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "fc1.weight"], ["h"], name="fc1"),
                               helper.make_node("Relu", ["h"], ["r"], name="relu"),
                               helper.make_node("MatMul", ["r", "fc2.weight"], ["y"], name="fc2")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 32])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(folder / "m17.onnx"))
    return folder / "m17.onnx"


def test_blocked_int4_qdq_on_an_old_opset_is_refused_at_check_and_matmul_nbits_loads(tmp_path):
    """DequantizeLinear with int4 and `block_size` needs opset 21: on an opset-17 model `qdq` is Q265 at check
    (onnxruntime would refuse the written file), and `matmul_nbits` writes a model onnxruntime opens and runs."""
    import onnxruntime as ort
    from typer.testing import CliRunner

    from compiler.cli import app

    model = _opset17_model(tmp_path)
    recipe = tmp_path / "r.recipe"
    text = (f'recipe op17 {{\n  model "{model}"\n  scheme w4 = W4A16 {{ group 32 }}\n  quantize {{ type Linear -> w4 }}\n'
            f'  emit "{tmp_path / "out.onnx"}" {{ format FORMAT }}\n}}\n')
    recipe.write_text(text.replace("FORMAT", "qdq"))
    result = CliRunner().invoke(app, ["compile", str(recipe)])
    assert result.exit_code == 2 and "Q265" in result.output and "opset 17" in result.output, result.output
    assert not (tmp_path / "out.onnx").exists()
    recipe.write_text(text.replace("FORMAT", "matmul_nbits"))
    result = CliRunner().invoke(app, ["compile", str(recipe)])
    assert result.exit_code == 0, result.output
    session = ort.InferenceSession(str(tmp_path / "out.onnx"))
    assert session.run(None, {"x": np.ones((2, 64), np.float32)})[0].shape == (2, 32)


def test_an_emitted_model_onnxruntime_refuses_is_q425_and_nothing_is_written(tmp_path, monkeypatch):
    """Without `verify` nothing else opens the output before it goes into place: onnxruntime's refusal (here
    forced) stops the compile with Q425, exit 2, and leaves nothing at the destination."""
    import onnxruntime as ort
    from typer.testing import CliRunner

    from compiler.cli import app

    def refuse(*args, **kwargs):
        raise ort.capi.onnxruntime_pybind11_state.InvalidGraph("Unrecognized attribute: block_size")
    monkeypatch.setattr(ort, "InferenceSession", refuse)
    model = _opset17_model(tmp_path)
    recipe = tmp_path / "r.recipe"
    recipe.write_text(f'recipe r {{\n  model "{model}"\n  quantize {{ type Linear -> W8A16 }}\n'
                      f'  emit "{tmp_path / "out.onnx"}"\n}}\n')
    result = CliRunner().invoke(app, ["compile", str(recipe)])
    assert result.exit_code == 2 and "Q425" in result.output and "block_size" in result.output, result.output
    assert "Traceback" not in result.output and not (tmp_path / "out.onnx").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_offload_checks_the_quantization_nodes_against_the_opset_without_reading_weights():
    """In offload the output is not opened whole: its Q/DQ nodes are checked against the opset's schemas, which
    finds what onnxruntime refuses (int4 and `block_size` before opset 21) and passes the same node at 21."""
    from onnx import TensorProto, helper, numpy_helper

    from compiler.backends.onnx.emitted_check import _unschematic_node

    def model(opset: int) -> onnx.ModelProto:
        q = helper.make_tensor("q", TensorProto.INT4, [64, 64], [0] * 64 * 64)
        scale = numpy_helper.from_array(np.ones((64, 2), np.float32), "s")
        graph = helper.make_graph(
            [helper.make_node("DequantizeLinear", ["q", "s"], ["w"], name="dq", block_size=32, axis=1),
             helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], [q, scale])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    found = _unschematic_node(model(17))
    assert found is not None and "block_size" in found and "17" in found
    assert _unschematic_node(model(21)) is None
