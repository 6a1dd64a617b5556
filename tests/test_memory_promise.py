"""The memory promise, guarded at small scale: for every memory mode of both backends, with an outlier
transform, a rotated ONNX graph, the floating formats, an MoE folder calibrated through all its experts and the same folder rounded
with no data (file to file), GGUF files (file to file and calibrated), a compile's measured peak RSS (the larger of the sampled RSS and the kernel's
high-water mark) is within ±10% of the plan's (measured 0.94–1.06× on 2026-11-27). Each compile runs in its
own process, so the measurement is the compile's alone, as a user runs it, and under the smallest `ram` that
`qrc plan` accepts for it (the estimate and its margin, plan/modes.py): a budget the plan accepts is one the
compile keeps (it would stop with Q302 past it)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # minutes of compiles: `pytest -m "not slow"` skips them

BUILTIN = "builtin:tiny-llama?layers=4&hidden=512&intermediate=1408&heads=8&kv_heads=4&vocab=8192"
RECIPE = """recipe promise {{
    model "{model}"
    backend {backend}
    scheme s = {scheme}
    {transform}
    quantize {{ type Linear -> s  "lm_head" -> none {router} }}
    calibrate {{ data synthetic {{ samples 16  seqlen 128 }}  chunk 4 }}
    memory {{ mode {mode} }}
    verify {{ samples 4  metric cosine  at_least 0.5 }}
    emit "{out}"
}}
"""
ROUTER = 're".*\\.mlp\\.gate" -> none'  # an MoE's router stays float, as vLLM wants it
AWQ, SMOOTHQUANT = "transform awq { grid 20 }", "transform smoothquant { alpha 0.8 }"
QUAROT = "transform quarot { online r4 }"
# Plain W8A8_STATIC in torch's low_memory and ONNX's full mode is not a case of its own: the MoE folder's (torch)
# and SmoothQuant's (both) cases run those modes' calibration with it
CASES = [  # (model, backend, mode, scheme, transform)
    ("builtin", "torch", "full", "W8A8_STATIC", ""),
    ("builtin", "torch", "offload", "W4A16", ""), ("builtin", "torch", "low_memory", "W4A16 { rounding gptq }", ""),
    ("builtin", "onnx", "low_memory", "W4A16 { rounding gptq }", ""),
    ("builtin", "onnx", "offload", "W8A8_STATIC", ""), ("builtin", "onnx", "offload", "W4A16", ""),
    ("builtin", "torch", "low_memory", "W4A16", AWQ), ("builtin", "torch", "low_memory", "W8A8_STATIC", SMOOTHQUANT),
    ("builtin", "onnx", "full", "W8A8_STATIC", SMOOTHQUANT), ("builtin", "onnx", "full", "W4A16", AWQ),
    ("builtin", "onnx", "low_memory", "W8A8_STATIC", QUAROT),
    ("builtin", "torch", "full", "FP8_DYNAMIC", ""), ("builtin", "torch", "low_memory", "NVFP4", ""),
    ("builtin", "torch", "offload", "NVFP4A16", ""),
    ("moe", "torch", "full", "W8A8_STATIC", ""), ("moe", "torch", "low_memory", "W8A8_STATIC", ""),
    ("moe", "torch", "offload", "W4A16 { rounding gptq }", "")]


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    """A random Qwen3-MoE folder of 8 experts a block, 172 MiB of float32: its experts are the larger part of
    its weights, so what calibrating through every expert holds shows in the peak."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    folder = tmp_path_factory.mktemp("qwen3-moe")
    torch.manual_seed(0)
    config = transformers.Qwen3MoeConfig(
        hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
        head_dim=64, vocab_size=8192, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=512)
    transformers.Qwen3MoeForCausalLM(config).save_pretrained(folder)
    return folder


def _case_id(model: str, backend: str, mode: str, scheme: str, transform: str) -> str:
    """builtin-torch-low_memory-W4A16-gptq, …-W8A8_STATIC-smoothquant."""
    words = [model, backend, mode, scheme.split()[0], "gptq" if "gptq" in scheme else "", *transform.split()[1:2]]
    return "-".join(w for w in words if w)


@pytest.mark.parametrize(("model", "backend", "mode", "scheme", "transform"), CASES,
                         ids=[_case_id(*case) for case in CASES])
def test_measured_peak_is_within_a_tenth_of_the_plan(request, tmp_path, model, backend, mode, scheme, transform):
    out = tmp_path / ("out.onnx" if backend == "onnx" else "out")
    recipe = tmp_path / "r.recipe"
    where = request.getfixturevalue("moe") if model == "moe" else BUILTIN
    recipe.write_text(RECIPE.format(model=where, backend=backend, mode=mode, scheme=scheme, transform=transform,
                                    router=ROUTER if model == "moe" else "", out=out))
    done = _compiled_at_its_budget(recipe)
    assert done.returncode == 0, done.stdout + done.stderr
    ratio = float(re.search(r"peak RSS.*?planned \(([\d.]+)×\)", done.stdout, re.S).group(1))
    print(f"measured/planned {request.node.callspec.id}: {ratio:.2f}×")  # `pytest -s` lists every case's
    assert 0.9 <= ratio <= 1.1, done.stdout


DATA_FREE = """recipe promise {{
    model "{model}"
    backend torch
    quantize {{ type Linear -> {scheme}  "lm_head" -> none {router} }}
    emit "{out}"
}}
"""


@pytest.mark.parametrize("scheme", ["FP8_BLOCK", "NVFP4A16", "W4A16"])
def test_data_free_peak_is_within_a_tenth_of_the_plan(moe, tmp_path, scheme):
    """Nothing calibrates or verifies: the weights round file to file (the floating formats and the integers
    in the compiled loops), one tensor at a time."""
    recipe = tmp_path / "r.recipe"
    recipe.write_text(DATA_FREE.format(model=moe, scheme=scheme, router=ROUTER, out=tmp_path / "out"))
    done = _compiled_at_its_budget(recipe)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "file to file" in subprocess.run([sys.executable, "-m", "compiler", "plan", str(recipe)], text=True,
                                            capture_output=True, env={"COLUMNS": "200", **_python_env()}).stdout
    ratio = float(re.search(r"peak RSS.*?planned \(([\d.]+)×\)", done.stdout, re.S).group(1))
    print(f"measured/planned data-free {scheme}: {ratio:.2f}×")
    assert 0.9 <= ratio <= 1.1, done.stdout


GGUF = """recipe promise {{
    model "{model}"
    backend torch
    scheme q {{ {weights} }}
    quantize {{ type Linear -> q  "lm_head" -> none }}
    {data}
    memory {{ mode {mode} }}
    emit "{out}" {{ format gguf }}
}}
"""
GGUF_DATA = "calibrate { data synthetic { samples 16  seqlen 128 }  chunk 4 }  verify { samples 4  metric kld  at_most 1 }"


@pytest.fixture(scope="module")
def tokenized(tmp_path_factory):
    """A random Llama of 4 blocks with a tokenizer (what a GGUF file carries), 49 MiB of float32."""
    pytest.importorskip("transformers")
    from zoo import tokenized_llama

    return tokenized_llama(tmp_path_factory.mktemp("gguf-llama"), 4)


@pytest.fixture(scope="module")
def wide_vocabulary(tmp_path_factory):
    """A random Llama of 2 blocks whose embedding and head (32,000 × 512, 62.5 MiB of float32 each) are the larger
    part of its weights: what copying them whole into a GGUF holds shows in the peak."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from zoo import add_tokenizer

    folder = tmp_path_factory.mktemp("wide-vocabulary")
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=32000, hidden_size=512, intermediate_size=1536, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=4, head_dim=64, tie_word_embeddings=False)).save_pretrained(folder)
    return add_tokenizer(folder, 320)


@pytest.mark.parametrize("weights", ["weights int4 group 32 symmetric", "= NVFP4A16"], ids=["Q4_0", "NVFP4"])
def test_gguf_peak_with_a_large_float_embedding(wide_vocabulary, tmp_path, weights):
    """File to file, the tensors no rule quantizes (here the embedding and the head) go into the GGUF whole, each
    read at once: the plan counts the largest (the real SmolLM2-135M's 113 MB embedding had its GGUF at 378 MiB
    against 294 planned); NVFP4 also holds the compiled FP4 loop's code."""
    recipe = tmp_path / "r.recipe"
    text = GGUF.format(model=wide_vocabulary, weights=weights, data="", mode="full", out=tmp_path / "m.gguf")
    recipe.write_text(text.replace("scheme q { = NVFP4A16 }", "scheme q = NVFP4A16"))
    done = _compiled_at_its_budget(recipe)
    assert done.returncode == 0, done.stdout + done.stderr
    ratio = float(re.search(r"peak RSS.*?planned \(([\d.]+)×\)", done.stdout, re.S).group(1))
    print(f"measured/planned GGUF with a large embedding, {weights}: {ratio:.2f}×")
    assert 0.9 <= ratio <= 1.1, done.stdout


@pytest.mark.parametrize("weights, mode, data", [
    ("weights int4 group 32 symmetric", "low_memory", ""), ("weights q4_k", "low_memory", ""),
    ("weights int4 group 32 symmetric  rounding gptq", "low_memory", GGUF_DATA),
    ("weights q4_k  rounding imatrix", "offload", GGUF_DATA),
    # verified with no calibration, block by block: was 536 MiB measured under a 291 MiB plan (issue 63)
    ("weights int4 group 32 symmetric", "offload", "verify { samples 4  metric kld  at_most 1 }")],
    ids=["Q4_0", "Q4_K", "Q4_0-gptq", "Q4_K-imatrix", "Q4_0-verified"])
def test_gguf_peak_is_within_a_tenth_of_the_plan(tokenized, tmp_path, weights, mode, data):
    """A GGUF file: file to file it imports neither transformers nor compressed-tensors, and llama.cpp's reference
    rounding and qrc's K-quants hold float32 temporaries of their own; calibrated, it runs as a folder output does."""
    recipe = tmp_path / "r.recipe"
    recipe.write_text(GGUF.format(model=tokenized, weights=weights, data=data, mode=mode, out=tmp_path / "m.gguf"))
    done = _compiled_at_its_budget(recipe)
    assert done.returncode == 0, done.stdout + done.stderr
    ratio = float(re.search(r"peak RSS.*?planned \(([\d.]+)×\)", done.stdout, re.S).group(1))
    print(f"measured/planned GGUF {weights} {mode}: {ratio:.2f}×")
    assert 0.9 <= ratio <= 1.1, done.stdout


def _compiled_at_its_budget(recipe) -> subprocess.CompletedProcess:
    """`qrc compile` under `ram` set to the least its plan accepts: the plan's peak and its margin."""
    from compiler.frontend import plan_file
    from compiler.plan.modes import needed_ram

    planned = plan_file(recipe)
    assert planned.ok, [d.message for d in planned.diagnostics]
    ram = f"memory.ram={-(-needed_ram(planned.plan.peak_bytes) // 1024)}KiB"
    assert plan_file(recipe, (ram,)).ok, f"the plan refuses {ram}"
    return subprocess.run([sys.executable, "-m", "compiler", "compile", str(recipe), "--set", ram],
                          capture_output=True, text=True, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", **_python_env()})


def _python_env() -> dict:
    return {k: v for k, v in os.environ.items() if k.startswith(("PYTHON", "QRC", "HOME", "VIRTUAL_ENV", "OMP"))}
