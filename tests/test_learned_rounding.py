"""Learned rounding (`rounding autoround`, issue 67): one step keeps round to nearest exactly (the same tensors as
`rounding rtn`); learning lowers the error of the emitted model, measured in transformers; the plan shows the
steps with their memory and time; full mode runs block by block."""

from __future__ import annotations

import json

import pytest
from compiling import compile_, runner

from compiler.cli import app
from compiler.plan.timing import BFloat16Products

RECIPE = """recipe learned {{
    model "{model}"
    backend torch
    scheme s = {scheme}
    quantize {{ "model.layers.*" -> s }}
    calibrate {{ data synthetic {{ samples 16  seqlen 64  seed 3 }}  chunk 8 }}
    memory {{ mode {mode} }}
    emit "{out}"
}}
"""


def _tensors(folder):
    from safetensors.torch import load_file

    found = {}
    for path in sorted(folder.glob("*.safetensors")):
        found.update(load_file(path))
    return found


def _compile(tmp_path, name: str, scheme: str, model: str = "builtin:tiny-llama", mode: str = "auto"):
    out = tmp_path / name
    recipe = tmp_path / f"{name}.recipe"
    recipe.write_text(RECIPE.format(model=model, scheme=scheme, mode=mode, out=out))
    done = compile_(str(recipe), out)
    assert done.exit_code == 0, done.output
    return out


@pytest.mark.slow  # 3-8 s: kept out of the quick loop's 3 minutes on a 2-core machine without AMX (2026-12-04)
def test_one_step_is_round_to_nearest_asymmetric(tmp_path):
    """With one step the kept parameters are the first step's, round to nearest: asymmetric groups are rtn's,
    tensor for tensor (the learned rounding's scales, zero points and integers follow the format's convention)."""
    weights = "weights int4 group 32 asymmetric"
    rtn = _tensors(_compile(tmp_path, "rtn", f"W4A16 {{ {weights} }}"))
    learned = _tensors(_compile(tmp_path, "learned", f"W4A16 {{ {weights}  rounding autoround {{ iters 1 }} }}"))
    assert rtn.keys() == learned.keys()
    for key, value in rtn.items():
        assert value.dtype == learned[key].dtype and value.equal(learned[key]), key


def _full_range(w, group: int, bits: int, divisor: float = 1.0):
    """Symmetric round to nearest with each group's value of largest magnitude on -2^(b-1) (AutoRound's start),
    that value divided by `divisor` first (the search's clipping)."""
    import torch

    rows = w.reshape(w.shape[0], -1, group)
    below, above = -rows.amin(-1, keepdim=True).clamp(max=0), rows.amax(-1, keepdim=True).clamp(min=0)
    scale = torch.where(above < below, below, -above) / 2 ** (bits - 1) / divisor
    q = torch.round(rows / scale).clamp(-2 ** (bits - 1), 2 ** (bits - 1) - 1)
    return (q * scale).reshape(w.shape)


@pytest.mark.parametrize(("weights", "group", "bits"), [("group 32", 32, 4),
                                                        ("weights int8 per_channel symmetric", None, 8)],
                         ids=["int4-groups", "int8-channels"])
def test_one_step_is_the_searched_start_in_transformers(tmp_path, weights, group, bits):
    """Symmetric weights start from round to nearest with each group's largest magnitude on the grid's negative
    end (a negative scale where it is positive) divided by one of the scale search's divisors (1 to 2: AutoRound's
    full range clipped), the one the search weighted by the inputs' mean squares chose: one step writes exactly
    such a rounding of every group, as transformers loads the folder, and the search clipped many 4-bit groups."""
    import torch
    import transformers

    from compiler.quant.weights import SIGNED_COARSE, SIGNED_FINE

    folder = _llama_folder(tmp_path / "float")
    out = _compile(tmp_path, "learned", f"W4A16 {{ {weights}  rounding autoround {{ iters 1 }} }}", str(folder))
    floats = transformers.AutoModelForCausalLM.from_pretrained(folder).state_dict()
    names = [k.removesuffix(".weight") for k in floats if k.startswith("model.layers.") and k.endswith("proj.weight")]
    assert len(names) == 14
    decompressed = transformers.CompressedTensorsConfig(dequantize=True)  # each weight as it computes with
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out, quantization_config=decompressed).state_dict()
    coarse = [f for f in SIGNED_COARSE if f >= 1]
    divisors = sorted({round(min(max(c + s, 1.0), coarse[-1]), 6) for c in coarse for s in (0.0, *SIGNED_FINE)})
    clipped = groups = 0
    for name in names:
        w = floats[name + ".weight"]
        size = group or w.shape[1]
        got = loaded[name + ".weight"].float().reshape(w.shape[0], -1, size)
        matched = torch.zeros(got.shape[:2], dtype=torch.bool)
        full = torch.zeros_like(matched)
        for divisor in divisors:
            same = (_full_range(w, size, bits, divisor).reshape(got.shape) - got).abs().amax(-1) <= 1e-6
            matched |= same
            full |= same if divisor == 1.0 else torch.zeros_like(same)
        assert matched.all(), (name, int((~matched).sum()))
        clipped += int((~full).sum())
        groups += full.numel()
    # 4-bit groups clip often; 8-bit channels, whose step is small beside their largest value, keep it here
    assert clipped > groups // 4 if bits == 4 else clipped < groups // 4, (clipped, groups)


def _llama_folder(path):
    import torch
    import transformers

    config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    return path


@pytest.mark.slow  # 3-8 s: kept out of the quick loop's 3 minutes on a 2-core machine without AMX (2026-12-04)
def test_learning_lowers_the_error_of_the_emitted_model(tmp_path):
    """Learned for 60 steps, the folder transformers loads is closer to the float model than rtn's, on tokens no
    step saw: mean squared error of the logits, measured outside qrc."""
    errors = _errors_of_rtn_and_learned(tmp_path)
    assert errors["learned"] < 0.9 * errors["rtn"], errors


def _errors_of_rtn_and_learned(tmp_path) -> dict[str, float]:
    """A random Llama rounded by rtn and by 60 learned steps, each folder loaded by transformers: the mean squared
    error of its logits against the float model's on tokens no step saw."""
    import torch
    import transformers

    folder = _llama_folder(tmp_path / "float")
    scheme = "W4A16 {{ group 32  rounding {} }}"
    rtn = _compile(tmp_path, "rtn", scheme.format("rtn"), str(folder))
    learned = _compile(tmp_path, "learned", scheme.format("autoround { iters 60  batch 4 }"), str(folder))
    ids = torch.randint(0, 256, (4, 64), generator=torch.Generator().manual_seed(11))
    with torch.no_grad():
        reference = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()(ids).logits
        errors = {name: (transformers.AutoModelForCausalLM.from_pretrained(out).eval()(ids).logits - reference)
                  .pow(2).mean().item() for name, out in (("rtn", rtn), ("learned", learned))}
    return errors


def test_the_plan_shows_the_learning_and_runs_block_by_block_in_full_mode(tmp_path):
    """`qrc plan`: run_block says the steps and samples, full mode caches block inputs (the targets are each
    block's outputs), and the memory estimate lists the learning's part."""
    recipe = tmp_path / "r.recipe"
    recipe.write_text(RECIPE.format(model="builtin:tiny-llama", mode="full", out=tmp_path / "out",
                                    scheme="W4A16 { group 32  rounding autoround { iters 20  batch 4 } }"))
    shown = runner.invoke(app, ["plan", str(recipe), "--format", "json"])
    assert shown.exit_code == 0, shown.output
    plan = json.loads(shown.output)
    kinds = [op["op"] for op in plan["ops"]]
    assert "cache_block_inputs" in kinds and "run_block" in kinds and "calibrate_chunk" not in kinds
    run = next(op for op in plan["ops"] if op["op"] == "run_block")
    assert "20 sign-SGD steps of 4 samples" in run["summary"] and run["seconds"] > 0
    parts = plan["memory"]["tried"][0]["parts"]
    assert next(v for k, v in parts.items() if k.startswith("learned rounding")) > 0


def test_a_step_runs_the_samples_of_one_chunk_and_the_plan_counts_them(tmp_path):
    """A step draws its batch from one calibration chunk (torch/learned.py): with `chunk 4` and `batch 8` the plan
    says steps of 4 samples, plans less time and memory for them than with `chunk 8`, and `qrc plan` warns
    (Q278); where the chunk holds every sample, nothing is said."""
    scheme = "W4A16 { group 32  rounding autoround { iters 20  batch 8 } }"

    def planned(chunk: int):
        recipe = tmp_path / f"r{chunk}.recipe"
        text = RECIPE.format(model="builtin:tiny-llama", mode="full", out=tmp_path / "out", scheme=scheme)
        recipe.write_text(text.replace("chunk 8", f"chunk {chunk}"))
        shown = runner.invoke(app, ["plan", str(recipe), "--format", "json"])
        assert shown.exit_code == 0, shown.output
        plan = json.loads(shown.stdout)  # the diagnostics go to stderr
        run = next(op for op in plan["ops"] if op["op"] == "run_block")
        parts = plan["memory"]["tried"][0]["parts"]
        return run, next(v for k, v in parts.items() if k.startswith("learned rounding")), shown.stderr

    small, small_bytes, warned = planned(4)
    full, full_bytes, quiet = planned(8)
    assert "steps of 4 samples" in small["summary"] and "steps of 8 samples" in full["summary"]
    assert small["seconds"] < full["seconds"] and small_bytes < full_bytes
    assert "Q278" in warned and "Q278" not in quiet


@pytest.mark.slow  # 3-8 s: kept out of the quick loop's 3 minutes on a 2-core machine without AMX (2026-12-04)
def test_full_mode_learns_the_same_as_low_memory(tmp_path):
    """The learning is the same computation whichever mode holds the weights."""
    scheme = "W4A16 { group 32  rounding autoround { iters 8  batch 4 } }"
    full = _tensors(_compile(tmp_path, "full", scheme, mode="full"))
    low = _tensors(_compile(tmp_path, "low", scheme, mode="low_memory"))
    assert full.keys() == low.keys() and all(full[k].equal(low[k]) for k in full)


@pytest.mark.parametrize(("flags", "native", "kind"), [
    ("fpu avx512f avx512_bf16 amx_tile", True, BFloat16Products.AVX512_BF16),
    ("fpu amx_bf16", True, BFloat16Products.AMX),
    ("fpu avx512f avx512_bf16 amx_bf16 amx_tile", True, BFloat16Products.AMX),
    ("fpu avx512f avx512bw avx512_vnni", False, BFloat16Products.CONVERTED)])
def test_bfloat16_steps_only_where_the_cpu_multiplies_it(tmp_path, monkeypatch, flags, native, kind):
    """The steps' products run in bfloat16 only on a CPU whose flags say it multiplies bfloat16 in hardware (else
    torch emulates it, slower than float32)."""
    from compiler.backends import cpu_flags as cpu_features

    info = tmp_path / "cpuinfo"
    info.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    monkeypatch.setattr(cpu_features, "CPUINFO", info)
    cpu_features.native_bfloat16.cache_clear()
    try:
        assert cpu_features.native_bfloat16() is native
        # what the plan times the steps by: AMX's tiles or AVX-512 BF16's dot products, about twofold apart
        assert cpu_features.bfloat16_products(info) is kind
    finally:
        cpu_features.native_bfloat16.cache_clear()


def _compiling(monkeypatch) -> None:
    """Every learned run compiles its steps, however small (compiled_steps.py keeps tiny runs eager)."""
    monkeypatch.setattr("compiler.backends.torch.compiled_steps.COMPILE_AT_FLOPS", 0.0)


@pytest.mark.slow  # 3-8 s: kept out of the quick loop's 3 minutes on a 2-core machine without AMX (2026-12-04)
def test_a_compiler_that_fails_leaves_the_steps_eager_and_says_so(tmp_path, monkeypatch):
    """Where torch.compile fails at the first step, the steps run uncompiled: the same tensors as a run that never
    compiled, and Q451 says it once."""
    import torch

    scheme = "W4A16 { group 32  rounding autoround { iters 6  batch 4 } }"
    eager = _tensors(_compile(tmp_path, "eager", scheme))

    def broken(module, **_):
        def run(*args, **kwargs):
            raise torch._dynamo.exc.TorchDynamoException("no working C++ compiler")
        return run

    _compiling(monkeypatch)
    monkeypatch.setattr(torch, "compile", broken)
    out = tmp_path / "failed"
    recipe = tmp_path / "failed.recipe"
    recipe.write_text(RECIPE.format(model="builtin:tiny-llama", scheme=scheme, mode="auto", out=out))
    done = compile_(str(recipe), out)
    assert done.exit_code == 0, done.output
    assert done.output.count("Q451") == 1 and "no working C++ compiler" in done.output, done.output
    failed = _tensors(out)
    assert eager.keys() == failed.keys() and all(eager[k].equal(failed[k]) for k in eager)


def test_the_plan_counts_compiled_steps_only_where_the_work_pays(tmp_path, monkeypatch):
    """`qrc plan` says the steps compile once the learned work is large enough and a compiler is found, and
    plans less time for them; with torch's compile turned off it plans them uncompiled."""
    recipe = tmp_path / "r.recipe"
    recipe.write_text(RECIPE.format(model="builtin:tiny-llama", mode="auto", out=tmp_path / "out",
                                    scheme="W4A16 { group 32  rounding autoround { iters 200  batch 8 } }"))

    def planned():
        shown = runner.invoke(app, ["plan", str(recipe), "--format", "json"])
        assert shown.exit_code == 0, shown.output
        return next(op for op in json.loads(shown.output)["ops"] if op["op"] == "run_block")

    small = planned()
    assert "compiled" not in small["summary"]  # a tiny model's steps: not worth the compile
    _compiling(monkeypatch)
    compiled = planned()
    assert compiled["summary"].endswith("compiled") or ", compiled" in compiled["summary"]
    monkeypatch.setenv("TORCHDYNAMO_DISABLE", "1")
    off = planned()
    assert "compiled" not in off["summary"] and off["seconds"] == small["seconds"]


def test_the_plan_holds_more_for_float32_steps_than_for_bfloat16_ones(tmp_path, monkeypatch):
    """Where the CPU multiplies no bfloat16 in hardware the steps stay float32 and keep products twice as wide for
    their backward: `qrc plan` plans more memory for the same recipe than on a CPU that does (plan/memory.py
    LEARNED_ACTIVATIONS_FLOAT32; a 2-core AVX2 EPYC went 11% past the bfloat16 figure)."""
    recipe = tmp_path / "r.recipe"
    recipe.write_text(RECIPE.format(model="builtin:tiny-llama", mode="auto", out=tmp_path / "out",
                                    scheme="W4A16 { group 32  rounding autoround { iters 20  batch 8 } }"))

    def learned_part(native: bool) -> int:
        kind = BFloat16Products.AVX512_BF16 if native else BFloat16Products.CONVERTED
        monkeypatch.setattr("compiler.backends.torch.timing.bfloat16_products", lambda: kind)
        shown = runner.invoke(app, ["plan", str(recipe), "--format", "json"])
        assert shown.exit_code == 0, shown.output
        parts = json.loads(shown.output)["memory"]["tried"][0]["parts"]
        return next(v for k, v in parts.items() if k.startswith("learned rounding"))

    bfloat16, float32 = learned_part(True), learned_part(False)
    assert float32 > 1.2 * bfloat16 > 0, (float32, bfloat16)


@pytest.mark.slow
def test_compiled_steps_learn_as_eager_ones_do(tmp_path, monkeypatch):
    """Compiled by torch's inductor, the steps still learn: the folder transformers loads is closer to the float
    model than rtn's, as the eager steps' is (test_learning_lowers_the_error_of_the_emitted_model)."""
    _compiling(monkeypatch)
    errors = _errors_of_rtn_and_learned(tmp_path)
    assert errors["learned"] < 0.9 * errors["rtn"], errors


@pytest.mark.slow  # two compiles that learn: 3.5 s
def test_the_summary_and_the_report_say_what_the_learning_cost_and_bought(tmp_path):
    """The compile's summary and its report say the steps run, their seconds, and how far below the start's (round
    to nearest) each block's output error against float came (on the first step's samples): one step keeps the
    start, so it bought nothing; twenty lower the error."""
    import re

    for iters, lowered in ((1, False), (20, True)):
        out = tmp_path / f"out{iters}"
        recipe = tmp_path / f"r{iters}.recipe"
        recipe.write_text(RECIPE.format(model="builtin:tiny-llama", mode="auto", out=out,
                                        scheme=f"W4A16 {{ group 32  rounding autoround {{ iters {iters}  batch 4 }} }}"))
        report = tmp_path / f"report{iters}.md"
        done = runner.invoke(app, ["compile", str(recipe), "-o", str(out), "--report", str(report)],
                             env={"COLUMNS": "400"})
        assert done.exit_code == 0, done.output
        line = next(x for x in done.output.splitlines() if "learned rounding" in x)
        blocks = re.search(r"([\d,]+) sign-SGD steps \(uncompiled\) over (\d+) blocks", line)
        assert blocks and int(blocks[1].replace(",", "")) == iters * int(blocks[2]), line
        below = int(re.search(r"(-?\d+)% below the start's \(round to nearest\) on average", line)[1])
        assert (below >= 5) if lowered else (abs(below) <= 1), line
        assert "## Learned rounding" in report.read_text() and f"{below}% below" in report.read_text()
