"""Synthetic data is honest: token ids come from the model's vocabulary for every index input, and qrc's
own verification figures agree with an independent measurement in transformers on the same samples."""

from __future__ import annotations

import numpy as np
import pytest
from compiling import ROOT, compile_program
from zoo import transformers_cosines

from compiler.data import verify_batches

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

RECIPE = """recipe honest {{
    model "{model}"
    backend torch
    scheme w4 = W4A16 {{ group 32 }}
    quantize {{ type Linear -> w4 }}
    calibrate {{ data synthetic {{ samples 8  seqlen 32 }}  chunk 4 }}
    memory {{ mode {mode} }}
    verify {{ samples 8  metric cosine  at_least 0.5 }}
    emit "{out}"
}}
"""


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    """A tiny random Llama as transformers builds and saves it (no download)."""
    folder = tmp_path_factory.mktemp("llama") / "model"
    config = transformers.LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      tie_word_embeddings=False)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).eval().save_pretrained(folder)
    return folder


def _recipe(tmp_path, folder, mode="low_memory"):
    recipe = tmp_path / "r.recipe"
    recipe.write_text(RECIPE.format(model=folder, mode=mode, out=tmp_path / "out"))
    return recipe


def test_synthetic_ids_span_the_vocabulary(llama_folder, tmp_path):
    from compiler import check_file

    checked = check_file(_recipe(tmp_path, llama_folder), with_model=True)
    assert checked.ok, checked.diagnostics
    batches, _ = verify_batches(checked.ir.calibration.data, checked.assignment.model, 8, 4)
    ids = np.concatenate([feed["input_ids"] for feed in batches])
    masks = np.concatenate([feed["attention_mask"] for feed in batches])
    assert ids.min() >= 0 and ids.max() < 300 and len(np.unique(ids)) > 100  # not one constant sequence
    assert (masks == 1).all()


@pytest.mark.parametrize("mode", ["low_memory", "full"])
@pytest.mark.slow
def test_verify_figures_agree_with_transformers(llama_folder, tmp_path, mode):
    """qrc's cosine equals the one transformers measures on the float folder and the emitted folder,
    fed the same held-out samples."""
    result, planned = compile_program(str(_recipe(tmp_path, llama_folder, mode)), tmp_path / "out")
    ours = result.verify["cosine"]
    batches, _ = verify_batches(planned.check.ir.calibration.data, planned.check.assignment.model, 8, 4)
    cosines, _ = transformers_cosines(llama_folder, tmp_path / "out", transformers.AutoModelForCausalLM, batches)
    independent = float(np.mean(cosines))
    assert independent < 0.9999  # int4 changes the logits: a figure of 1.0 would mean nothing was measured
    assert abs(ours - independent) < 2e-3, (ours, independent)


def test_an_integer_input_without_a_range_is_refused_at_check(tmp_path):
    """An int64 input that indexes no embedding and is not a mask, a position or token ids: Q253, never zeros."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from typer.testing import CliRunner

    from compiler.cli import app

    w = numpy_helper.from_array(np.random.RandomState(0).standard_normal((8, 8)).astype(np.float32), "fc.weight")
    graph = helper.make_graph(
        [helper.make_node("Cast", ["bucket"], ["bucket_f"], to=TensorProto.FLOAT, name="/cast/Cast"),
         helper.make_node("MatMul", ["bucket_f", "fc.weight"], ["y"], name="/fc/MatMul")],
        "g", [helper.make_tensor_value_info("bucket", TensorProto.INT64, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])], [w])
    model = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(model))
    recipe = tmp_path / "r.recipe"
    recipe.write_text(f'recipe r {{\n    model "{model}"\n    quantize {{ type Linear -> W8A8_STATIC }}\n'
                      '    calibrate { data synthetic { samples 4 } }\n}\n')
    result = CliRunner().invoke(app, ["check", str(recipe)])
    assert result.exit_code == 2 and "Q253" in result.output and "`bucket`" in result.output, result.output
    assert "Traceback" not in result.output


def test_the_plan_counts_the_samples_a_short_npz_gives(llama_folder, tmp_path):
    """`data npz` asks for 128 samples by default; a file of 12 rows gives 12, and the plan says so (its
    calibration chunks and the op's samples) instead of planning 128 it will never read."""
    from compiler import plan_file
    from compiler.plan import ops

    ids = np.random.default_rng(0).integers(0, 300, (12, 16), dtype=np.int64)
    np.savez(tmp_path / "short.npz", input_ids=ids, attention_mask=np.ones_like(ids))
    recipe = tmp_path / "r.recipe"
    recipe.write_text(RECIPE.format(model=llama_folder, mode="full", out=tmp_path / "out").replace(
        "data synthetic {{ samples 8  seqlen 32 }}".format(), f'data npz "{tmp_path / "short.npz"}"').replace(
        "scheme w4 = W4A16 { group 32 }", "scheme w4 = W4A16 { group 32  rounding gptq }"))
    plan = plan_file(recipe).plan
    assert plan is not None
    calibrate = plan.first(ops.CalibrateChunk)
    assert calibrate is not None and (calibrate.samples, calibrate.repeat) == (12, 3)  # chunks of 4
    result, planned = compile_program(str(recipe), tmp_path / "out")
    assert result.verify_passed and planned.plan.first(ops.CalibrateChunk).samples == 12


SHORT = """recipe short {{
    model "builtin:tiny-llama"
    backend {backend}
    quantize {{ type Linear -> W8A8_STATIC  "lm_head" -> none }}
    calibrate {{ data text "{data}" {{ tokenizer "{tokenizer}"  samples 8  seqlen 16 }}  chunk 4 }}
    verify {{ samples 4 }}
    emit "{out}"
}}
"""


@pytest.mark.parametrize("backend", ["torch", "onnx"])
@pytest.mark.parametrize("lines, said", [(12, None), (10, "Q406"), (4, "Q448")])
def test_verification_never_measures_on_calibration_samples(tmp_path, backend, lines, said):
    """A text file of 12 lines gives calibration its 8 and verification 4 others; of 10, verification keeps
    the last 4 and calibration takes 6 (Q406 says so: it used to verify on calibration's own samples and
    call the figures held out); of 4, nothing is left to calibrate on: Q448, nothing written."""
    from typer.testing import CliRunner

    from compiler.cli import app

    data = tmp_path / "calib.txt"
    data.write_text("".join(f"line {i} of the calibration text, words to tokenize\n" for i in range(lines)))
    out = tmp_path / ("m.onnx" if backend == "onnx" else "out")
    recipe = tmp_path / "r.recipe"
    recipe.write_text(SHORT.format(backend=backend, data=data, out=out,
                                   tokenizer=ROOT / "recipes/data/tokenizer/tokenizer.json"))
    result = CliRunner().invoke(app, ["compile", str(recipe)], env={"COLUMNS": "200"})
    text = " ".join(result.output.split())
    if said is None:
        assert result.exit_code == 0 and "Q406" not in text, text
    elif said == "Q406":
        assert result.exit_code == 0 and "Q406" in text, text
        assert "gives 10 samples: verification holds out its last 4, so calibration used 6 of the 8" in text
    else:
        assert result.exit_code == 2 and "Q448" in text and not out.exists(), text
