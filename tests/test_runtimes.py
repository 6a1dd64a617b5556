"""The runtime table (compiler/ir/runtimes.py): which runtimes run each output on which device. docs/runtimes.md
is generated from the same backend functions `qrc check` and `qrc plan` print; every CPU claim marked tested is
run here in its runtime (transformers' default load, transformers' GGUF loader, llama.cpp, onnxruntime,
onnxruntime-genai); vLLM's CPU build is bench/runtimes.py's (bench/results/runtimes.md). `emit … { runtime NAME
device D }` where the table says no is Q275 before any work."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner
from zoo import add_tokenizer

import golden
from compiler import plan_file
from compiler.cli import app
from compiler.ir import runtimes
from compiler.ir.runtimes import Device, Evidence, Runtime, cell

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


@dataclass(frozen=True)
class Output:
    """One kind of output the docs' table lists: a scheme (the text after `scheme s`) in a format."""
    label: str
    backend: str
    scheme: str
    fmt: str
    calibrated: bool = False


PRESETS = ("W4A16", "W8A16", "W8A8", "W8A8_STATIC", "FP8", "FP8_DYNAMIC", "FP8_BLOCK", "NVFP4A16", "NVFP4",
           "MXFP4A16", "MXFP4", "MXFP8A16", "W4AFP8")
OUTPUTS = (*(Output(f"{p} folder", "torch", f"= {p}", "safetensors", p in ("W8A8_STATIC", "FP8", "NVFP4"))
             for p in PRESETS),
           Output("W4A16 asymmetric folder", "torch", "= W4A16 { group 64  asymmetric }", "safetensors"),
           Output("GGUF Q4_0", "torch", "{ weights int4 group 32 symmetric }", "gguf"),
           Output("GGUF Q8_0", "torch", "{ weights int8 group 32 symmetric }", "gguf"),
           Output("GGUF NVFP4", "torch", "= NVFP4A16", "gguf"),
           Output("GGUF MXFP4", "torch", "= MXFP4A16", "gguf"),
           Output("ONNX QDQ W8A8 (decoder)", "onnx", "= W8A8", "qdq", True),
           Output("ONNX MatMulNBits W4A16 (decoder)", "onnx", "= W4A16 { group 32 }", "matmul_nbits"))
RECIPE = """recipe runtimes {{
    model "{model}"
    backend {backend}
    scheme s {scheme}
    quantize {{ type Linear -> s  "lm_head" -> none }}
{calibrate}    emit "{out}" {{ format {fmt}{target} }}
}}
"""


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A tiny random Llama (float32) whose widths every preset's groups and blocks divide (128), with a byte-level
    tokenizer (GGUF takes its vocabulary)."""
    import torch
    import transformers

    folder = tmp_path_factory.mktemp("runtimes") / "llama"
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=320, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                      max_position_embeddings=128, tie_word_embeddings=False)
    transformers.LlamaForCausalLM(config).eval().save_pretrained(folder)
    add_tokenizer(folder, 320)
    (folder / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
    for name in ("config.json", "generation_config.json"):  # genai decodes with ids inside the 320
        config = json.loads((folder / name).read_text())
        config.update(bos_token_id=1, eos_token_id=2, pad_token_id=0)
        (folder / name).write_text(json.dumps(config))
    return folder


def _recipe(tmp_path: Path, model: Path, output: Output, target: str = "") -> tuple[Path, Path]:
    out = tmp_path / ("out.gguf" if output.fmt == "gguf" else "out/model.onnx" if output.backend == "onnx" else "out")
    calibrate = "    calibrate { data synthetic { samples 8  seqlen 32 }  chunk 4 }\n" if output.calibrated else ""
    recipe = tmp_path / f"{output.label.replace(' ', '_').replace('(', '').replace(')', '')}.recipe"
    recipe.write_text(RECIPE.format(model=model, backend=output.backend, scheme=output.scheme, calibrate=calibrate,
                                    out=out, fmt=output.fmt, target=target))
    return recipe, out


def _table(tmp_path: Path, model: Path, output: Output):
    planned = plan_file(_recipe(tmp_path, model, output)[0])
    assert planned.ok, [d.message for d in planned.diagnostics]
    return planned.program.runtimes


def runtime_docs(tmp_path: Path, model: Path) -> str:
    """docs/runtimes.md: the table `qrc plan` prints, for each kind of output."""
    columns = [(r, d) for r in Runtime for d in Device]
    head = "| output | " + " | ".join(f"{r.label} {d.value}" for r, d in columns) + " |"
    rows, details = [head, "|---" * (len(columns) + 1) + "|"], []
    for output in OUTPUTS:
        table = _table(tmp_path, model, output)
        shown = []
        for r, d in columns:
            found = cell(table, r, d)
            shown.append("–" if found is None else found.verdict)
        rows.append(f"| {output.label} | " + " | ".join(shown) + " |")
        details.append(f"- **{output.label}** (`scheme s {output.scheme}`, `format {output.fmt}`): "
                       + "; ".join(f"{c.runtime.label} {c.device.value}: {c.how}" for c in table))
    return "\n".join([
        "# Where each output runs", "",
        "Generated by `pytest tests/test_runtimes.py -k docs --update-golden` from the same backend functions "
        "`qrc check` and `qrc plan` print the table with (`compiler/backends/*/runtimes.py`), planned on a float32 "
        "transformers Llama (a decoder genai runs once qrc exports it). A cell says `runs` or `no`; `runs` alone is "
        "run on every CI run by `tests/test_runtimes.py` in that runtime; `(bench)` is run by `bench/runtimes.py` "
        "in vLLM's CPU build (its own venv; [results](../bench/results/runtimes.md), with versions); `(rules)` is "
        "the runtime's loader rules as qrc restates them (no GPU here to run them). `–`: the runtime does not "
        "open this kind of output. `emit … { runtime NAME  device cpu|gpu }` makes a `no` an error before any "
        "work (`Q275`; without `device`, this machine's).", "",
        *rows, "", "What each cell means:", "", *details, ""])


def test_the_docs_table_is_the_one_qrc_check_prints(llama, tmp_path):
    golden.assert_file(runtime_docs(tmp_path, llama), ROOT / "docs" / "runtimes.md")


def test_qrc_check_and_plan_print_where_the_output_runs(llama, tmp_path):
    recipe, _ = _recipe(tmp_path, llama, OUTPUTS[0])
    checked = runner.invoke(app, ["check", str(recipe)])
    assert checked.exit_code == 0, checked.output
    assert "transformers  cpu runs: default load, float32" in checked.output
    assert "vllm          cpu runs (bench): WNA16 (4-bit), bfloat16" in checked.output
    planned = runner.invoke(app, ["plan", str(recipe), "--format", "json"])
    cells = json.loads(planned.stdout)["runtimes"]
    assert {"runtime": "vllm", "device": "gpu", "runs": True, "how": "WNA16 (4-bit)", "evidence": "rules"} in cells


def test_a_target_the_output_does_not_run_on_stops_before_work(llama, tmp_path):
    """NVFP4 on vLLM's CPU build (no FP4 kernel) is Q275 at check, exit 2; on a GPU target it passes."""
    nvfp4 = next(o for o in OUTPUTS if o.label == "NVFP4 folder")
    recipe, out = _recipe(tmp_path, llama, nvfp4, "  runtime vllm  device cpu")
    done = runner.invoke(app, ["compile", str(recipe)])
    assert done.exit_code == 2 and "error[Q275]" in done.output and "no CPU kernel" in done.output, done.output
    assert not out.exists()
    recipe, _ = _recipe(tmp_path, llama, nvfp4, "  runtime vllm  device gpu")
    assert runner.invoke(app, ["check", str(recipe)]).exit_code == 0
    gguf = next(o for o in OUTPUTS if o.fmt == "gguf")
    recipe, _ = _recipe(tmp_path, llama, gguf, "  runtime vllm  device gpu")
    done = runner.invoke(app, ["check", str(recipe)])
    assert done.exit_code == 2 and "vllm does not open this kind of output" in done.output, done.output


def test_without_a_device_the_target_is_this_machines(llama, tmp_path, monkeypatch):
    nvfp4 = next(o for o in OUTPUTS if o.label == "NVFP4 folder")
    recipe, _ = _recipe(tmp_path, llama, nvfp4, "  runtime vllm")
    monkeypatch.setattr(runtimes, "this_machine_device", lambda: Device.CPU)
    done = runner.invoke(app, ["check", str(recipe)])
    assert done.exit_code == 2 and "this machine's" in done.output
    monkeypatch.setattr(runtimes, "this_machine_device", lambda: Device.GPU)
    assert runner.invoke(app, ["check", str(recipe)]).exit_code == 0
    w4 = runner.invoke(app, ["check", str(recipe), "--set", "emit.runtime=transformers", "--dump-ir"])
    assert w4.exit_code == 0 and "runtime transformers" in w4.output


# ---- every tested CPU claim, run in its runtime ----------------------------------------------------------------

def _tested_on_cpu(table) -> list[Runtime]:
    return [c.runtime for c in table if c.device is Device.CPU and c.runs and c.evidence is Evidence.TESTED]


def _transformers(out: Path, how: str) -> None:
    import torch
    import transformers

    if out.suffix == ".gguf":
        model = transformers.AutoModelForCausalLM.from_pretrained(out.parent, gguf_file=out.name).eval()
    elif how.startswith("only with `dequantize=True`"):
        with pytest.raises(RuntimeError, match="mismatch"):  # as the table says: the default load stops
            transformers.AutoModelForCausalLM.from_pretrained(out)
        config = transformers.CompressedTensorsConfig(dequantize=True)
        model = transformers.AutoModelForCausalLM.from_pretrained(out, quantization_config=config).eval()
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
        assert how.endswith(str(model.dtype).removeprefix("torch.")), (how, model.dtype)
    with torch.no_grad():
        logits = model(torch.tensor([[1, 5, 9, 40, 7]])).logits
    assert bool(torch.isfinite(logits).all())


def _onnxruntime(out: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    ids = np.array([[1, 5, 9, 40, 7]], dtype=np.int64)
    feed = {}
    for info in session.get_inputs():
        if info.name == "input_ids":
            feed[info.name] = ids
        elif info.name == "attention_mask":
            feed[info.name] = np.ones_like(ids)
        elif info.name == "position_ids":
            feed[info.name] = np.arange(ids.shape[1], dtype=np.int64)[None]
        else:  # an empty cache [batch 1, kv heads, past 0, head size] (genai_config.json's sizes where symbolic)
            decoder = json.loads((out.parent / "genai_config.json").read_text())["model"]["decoder"]
            known = {1: decoder["num_key_value_heads"], 2: 0, 3: decoder["head_size"]}
            dims = [1 if i == 0 else known[i] if i == 2 or not isinstance(d, int) else d
                    for i, d in enumerate(info.shape)]
            feed[info.name] = np.zeros(dims, dtype=np.float32)
    logits = session.run(None, feed)[0]
    assert np.isfinite(logits).all() and logits.shape[:2] == (1, 5)


def _genai(out: Path) -> None:
    og = pytest.importorskip("onnxruntime_genai")
    assert (out.parent / "chat_template.jinja").is_file()  # the folder's chat template travels with the tokenizer
    model = og.Model(str(out.parent))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=12, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(np.array([[1, 5, 9, 40, 7]], dtype=np.int32))
    tokens = []
    while not generator.is_done():
        generator.generate_next_token()
        tokens.append(int(generator.get_next_tokens()[0]))
    assert len(tokens) == 12 - 5 and all(0 <= t < 320 for t in tokens)


def _llama_cpp(out: Path) -> None:
    pytest.importorskip("llama_cpp")
    from llama_cpp_run import logits

    assert np.isfinite(logits(out, [1, 5, 9, 40, 7])).all()


RUNNERS = {Runtime.ONNXRUNTIME: _onnxruntime, Runtime.GENAI: _genai}


@pytest.mark.slow
@pytest.mark.parametrize("output", OUTPUTS, ids=[o.label for o in OUTPUTS])
def test_each_tested_cpu_claim_runs_in_its_runtime(llama, output, tmp_path):
    """Compile the output, then run it in every runtime the table says runs it on the CPU (tested), the way the
    table says (a dtype; `dequantize=True` where the default load stops, which is seen to stop): the table cannot
    claim what this run does not show, and a runtime's release that changes either fails here. llama.cpp runs in
    the llama_cpp stage (below)."""
    from compiling import compile_program

    table = _table(tmp_path, llama, output)
    assert _tested_on_cpu(table), "each output runs somewhere on the CPU, by test"
    recipe, out = _recipe(tmp_path, llama, output)
    compile_program(str(recipe), out)
    for refused in [c for c in table if c.device is Device.CPU and not c.runs and c.evidence is Evidence.TESTED]:
        assert refused.runtime is Runtime.TRANSFORMERS, refused  # the one tested `no`: seen to stop here
        with pytest.raises(Exception):  # noqa: B017  # whatever the loader raises, it must not load
            _transformers(out, refused.how)
    for runtime in _tested_on_cpu(table):
        if runtime is Runtime.TRANSFORMERS:
            _transformers(out, cell(table, runtime, Device.CPU).how)
        elif runtime is not Runtime.LLAMA_CPP:
            RUNNERS[runtime](out)


@pytest.mark.llama_cpp
@pytest.mark.parametrize("output", [o for o in OUTPUTS if o.fmt == "gguf"], ids=lambda o: o.label)
def test_gguf_claims_run_in_llama_cpp(llama, output, tmp_path):
    from compiling import compile_program

    table = _table(tmp_path, llama, output)
    assert Runtime.LLAMA_CPP in _tested_on_cpu(table)
    recipe, out = _recipe(tmp_path, llama, output)
    compile_program(str(recipe), out)
    _llama_cpp(out)


def test_asymmetric_pack_quantized_is_said_at_check(llama, tmp_path):
    """Q276: the folder's zero points are packed, which transformers' default load refuses; an error where `verify`
    would run it that way after the work, a warning otherwise."""
    asym = next(o for o in OUTPUTS if o.label == "W4A16 asymmetric folder")
    recipe, _ = _recipe(tmp_path, llama, asym)
    warned = runner.invoke(app, ["check", str(recipe)])
    assert warned.exit_code == 0 and "warning[Q276]" in warned.output, warned.output
    text = recipe.read_text().replace("    emit", "    calibrate { data synthetic { samples 4  seqlen 16 } }\n"
                                      "    verify { samples 4  metric cosine  at_least 0.5 }\n    emit")
    recipe.write_text(text)
    refused = runner.invoke(app, ["check", str(recipe)])
    assert refused.exit_code == 2 and "error[Q276]" in refused.output, refused.output
