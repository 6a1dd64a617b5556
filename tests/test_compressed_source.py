"""compressed-tensors folders as source models (issue 68): indexed from headers and config alone, each compressed
Linear read as the float weight compressed-tensors decompresses, and recompiled to any output: a float folder
equal to transformers' own dequantized load, NVFP4, a calibrated and verified W8A8, GGUF run by llama.cpp."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from compiling import bytes_read
from typer.testing import CliRunner
from zoo import add_tokenizer, build

from compiler.cli import app

pytestmark = pytest.mark.slow  # compiles and transformers loads

runner = CliRunner()
# what llm-compressor, AutoRound and qrc write: pack-quantized (symmetric, with zero points), int-quantized,
# float-quantized, nvfp4-pack-quantized
SOURCES = {"w4a16": "W4A16 { group 16 }", "w4a16-asym": "W4A16 { group 16  asymmetric }", "w8a8": "W8A8",
           "fp8": "FP8_DYNAMIC", "nvfp4": "NVFP4A16", "mxfp4": "MXFP4A16"}


def _compile(tmp_path: Path, model: Path, body: str, out: Path, name: str = "r", backend: str = "torch") -> object:
    recipe = tmp_path / f"{name}.recipe"
    form = " { format gguf }" if out.suffix == ".gguf" else ""
    recipe.write_text(f'recipe {name} {{\n  model "{model}"\n  backend {backend}\n{body}\n  emit "{out}"{form}\n}}\n')
    return runner.invoke(app, ["compile", str(recipe)]), recipe


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    folder = build("llama", tmp_path_factory.mktemp("ct") / "llama")
    add_tokenizer(folder, 320)
    return folder


def _source(tmp_path: Path, llama: Path, kind: str) -> Path:
    out = tmp_path / f"src-{kind}"
    done, _ = _compile(tmp_path, llama, f"  scheme s = {SOURCES[kind]}\n  quantize {{ type Linear -> s }}", out, "src")
    assert done.exit_code == 0, done.output
    return out


def _logits(folder: Path, **kwargs) -> torch.Tensor:
    import transformers

    model, info = transformers.AutoModelForCausalLM.from_pretrained(str(folder), output_loading_info=True, **kwargs)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    ids = torch.randint(2, 300, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return model.eval()(ids).logits.float()


@pytest.mark.parametrize("kind", list(SOURCES))
def test_a_compressed_folder_reads_as_the_weights_transformers_decompresses(llama, kind, tmp_path):
    """Every layer `-> none`: the output is a float folder whose model computes what transformers' `dequantize=True`
    load of the source computes (the same decompression, compressed-tensors')."""
    import transformers

    source = _source(tmp_path, llama, kind)
    done, _ = _compile(tmp_path, source, "  quantize { type Linear -> none }", tmp_path / "float")
    assert done.exit_code == 0, done.output
    expected = _logits(source, quantization_config=transformers.CompressedTensorsConfig(dequantize=True))
    assert torch.allclose(_logits(tmp_path / "float"), expected, atol=1e-4), kind


def test_check_and_plan_read_no_weight_bytes_of_a_compressed_folder(llama, tmp_path):
    """The layers, their shapes and float bytes come from the safetensors headers and the config's groups."""
    source = _source(tmp_path, llama, "w4a16")
    recipe = tmp_path / "nv.recipe"
    recipe.write_text(f'recipe nv {{\n  model "{source}"\n  backend torch\n  quantize {{ type Linear -> NVFP4A16 }}\n'
                      f'  emit "{tmp_path / "nv"}"\n}}\n')
    for command in ("check", "plan"):
        before = bytes_read()
        done = runner.invoke(app, [command, str(recipe)])
        read = bytes_read() - before
        assert done.exit_code == 0 and "Q201" not in done.output, done.output
        assert read < (source / "model.safetensors").stat().st_size // 4, (command, read)
    planned = runner.invoke(app, ["plan", str(recipe)])
    assert "round 15 weights" in planned.output, planned.output  # 2 blocks of 7 Linears and the head


def test_the_plan_counts_decompressing_an_fp4_folder(llama, tmp_path):
    """An FP4 folder's layers are listed as such from its config (MXFP4's apart: NVFP4 casts them exactly), and the
    plan's rounding time file to file counts their decompression and the exact cast, which a W4A16 folder of the
    same shapes does not pay."""
    from compiler.frontend import plan_file
    from compiler.models import index_model

    seconds = {}
    for kind in ("w4a16", "nvfp4", "mxfp4"):
        source = _source(tmp_path, llama, kind)
        index = index_model(str(source))
        fp4 = 15 if kind != "w4a16" else 0  # 2 blocks of 7 Linears and the head
        assert (len(index.fp4_compressed), len(index.mxfp4_compressed)) == (fp4, fp4 if kind == "mxfp4" else 0)
        recipe = tmp_path / f"{kind}.recipe"
        recipe.write_text(f'recipe r {{\n  model "{source}"\n  backend torch\n  quantize {{ type Linear -> NVFP4A16  "lm_head" -> none }}\n'
                          f'  emit "{tmp_path / kind}.gguf"\n}}\n')  # no check process to wait for, as a folder has
        planned = plan_file(str(recipe))
        assert planned.ok, [d.message for d in planned.diagnostics]
        seconds[kind] = next(op.seconds for op in planned.plan.ops if op.kind.value == "quantize_weights")
    assert seconds["w4a16"] < seconds["nvfp4"] < seconds["mxfp4"], seconds


def test_a_compressed_w4a16_folder_compiles_to_nvfp4_and_to_a_verified_w8a8(llama, tmp_path):
    """File to file to NVFP4A16, and calibrated (static W8A8) with `verify`: both load in transformers close to the
    source they were compiled from."""
    source = _source(tmp_path, llama, "w4a16")
    reference = _logits(source)
    done, _ = _compile(tmp_path, source, "  quantize { type Linear -> NVFP4A16 }", tmp_path / "nv")
    assert done.exit_code == 0, done.output
    nv = _logits(tmp_path / "nv")
    assert torch.nn.functional.cosine_similarity(nv.flatten(), reference.flatten(), dim=0) > 0.97
    done, _ = _compile(tmp_path, source, "  scheme s = W8A8 { activations int8 per_tensor static }\n"
                       "  quantize { type Linear -> s }\n  calibrate { data synthetic { samples 8  seqlen 32 }  chunk 4 }\n"
                       "  verify { samples 8  metric cosine  at_least 0.99 }", tmp_path / "w8", "w8")
    assert done.exit_code == 0 and "passed: cosine" in done.output, done.output
    w8 = _logits(tmp_path / "w8")  # the default load: compressed-tensors' forward quantizes the inputs too
    assert torch.nn.functional.cosine_similarity(w8.flatten(), reference.flatten(), dim=0) > 0.99


def _decompressed(folder: Path) -> dict[str, torch.Tensor]:
    """Each Linear's weight as compressed-tensors decompresses it (transformers' `dequantize=True` load)."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(folder), quantization_config=transformers.CompressedTensorsConfig(dequantize=True))
    return {name: module.weight.detach().float().clone() for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and name != "lm_head"}


def test_an_mxfp4_folder_casts_to_nvfp4_bit_for_bit_and_a_wide_one_rounds(llama, tmp_path):
    """MXFP4 → NVFP4 is the exact cast: every weight of the NVFP4 folder decompresses to the very floats of the
    MXFP4 one (each block's e8m0 scale 2^e becomes the e4m3 scale 2^(e + k) under a global 2^k, the FP4 codes
    kept), q/k/v and gate/up still sharing one global scale each. Where a weight's block scales span more powers
    of two than e4m3 holds (one block 2^20 times another), NVFP4 rounds it by its ranges as usual: close, not
    equal, and the rest of the model still cast."""
    from safetensors.torch import load_file, save_file

    source = _source(tmp_path, llama, "mxfp4")
    done, _ = _compile(tmp_path, source, "  quantize { type Linear -> NVFP4A16 }", tmp_path / "nv")
    assert done.exit_code == 0, done.output
    expected, cast = _decompressed(source), _decompressed(tmp_path / "nv")
    assert expected.keys() == cast.keys() and len(expected) == 14
    for name, weight in expected.items():
        assert torch.equal(cast[name], weight), name
    tensors = load_file(tmp_path / "nv" / "model.safetensors")
    for siblings in (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), ("mlp.gate_proj", "mlp.up_proj")):
        for layer in (0, 1):
            shared = {float(tensors[f"model.layers.{layer}.{s}.weight_global_scale"]) for s in siblings}
            assert len(shared) == 1 and math.log2(shared.pop()).is_integer(), siblings
    stored = load_file(source / "model.safetensors")  # one block of down_proj 2^20 times smaller: beyond e4m3
    name = "model.layers.0.mlp.down_proj.weight_scale"
    stored[name] = stored[name].clone()
    stored[name][0, 0] -= 20
    save_file(stored, source / "model.safetensors", metadata={"format": "pt"})
    done, _ = _compile(tmp_path, source, "  quantize { type Linear -> NVFP4A16 }", tmp_path / "wide", "wide")
    assert done.exit_code == 0, done.output
    expected, rounded = _decompressed(source), _decompressed(tmp_path / "wide")
    down = "model.layers.0.mlp.down_proj"
    assert not torch.equal(rounded[down], expected[down])
    assert torch.nn.functional.cosine_similarity(rounded[down].flatten(), expected[down].flatten(), dim=0) > 0.99
    assert all(torch.equal(rounded[n], expected[n]) for n in expected if n != down)


def _nvfp4_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every NVFP4 layer's stored tensors, as raw bytes (a negative zero's code is not a positive one's)."""
    from safetensors.torch import load_file

    return {k: v.view(torch.uint8) for k, v in load_file(folder / "model.safetensors").items()
            if k.endswith(("weight_packed", "weight_scale", "weight_global_scale"))}


def test_an_nvfp4_folder_recompiled_to_nvfp4_keeps_its_tensors_and_rounds_what_changed(llama, tmp_path):
    """An NVFP4 source into NVFP4, file to file and with GPTQ: every stored tensor is the source's, byte for byte
    (rounding the decompressed weights again under their own ranges changed them). A sibling whose global scale
    differs from its fused siblings' (k_proj's doubled: half the values) makes the three round by their values
    under one shared global scale, while the other layers are still kept."""
    from safetensors.torch import load_file, save_file

    source = _source(tmp_path, llama, "nvfp4")
    expected = _nvfp4_tensors(source)
    assert len(expected) == 45  # 15 layers, 3 tensors each
    for name, body in (("rtn", ""), ("gptq", "  calibrate { data synthetic { samples 8  seqlen 32 }  chunk 4 }\n")):
        done, _ = _compile(tmp_path, source, f"  scheme s = NVFP4A16 {{ rounding {name} }}\n"
                           f"  quantize {{ type Linear -> s }}\n{body}", tmp_path / name, name)
        assert done.exit_code == 0, done.output
        kept = _nvfp4_tensors(tmp_path / name)
        assert kept.keys() == expected.keys()
        assert [k for k in expected if not torch.equal(kept[k], expected[k])] == [], name
    stored = load_file(source / "model.safetensors")
    k_proj = "model.layers.0.self_attn.k_proj.weight_global_scale"
    stored[k_proj] = stored[k_proj] * 2
    save_file(stored, source / "model.safetensors", metadata={"format": "pt"})
    done, _ = _compile(tmp_path, source, "  quantize { type Linear -> NVFP4A16 }", tmp_path / "apart", "apart")
    assert done.exit_code == 0, done.output
    rounded = load_file(tmp_path / "apart" / "model.safetensors")
    qkv = [f"model.layers.0.self_attn.{p}_proj.weight_global_scale" for p in "qkv"]
    assert len({float(rounded[k]) for k in qkv}) == 1  # one global scale again, the values' own
    changed = {k.rpartition(".")[0] for k, v in _nvfp4_tensors(tmp_path / "apart").items()
               if not torch.equal(v, expected[k] if k != k_proj else stored[k].view(torch.uint8))}
    assert changed <= {f"model.layers.0.self_attn.{p}_proj" for p in "qkv"} and changed, changed


def test_the_onnx_backend_refuses_a_compressed_folder_at_check(llama, tmp_path):
    """The exporters trace float modules: Q415 before any work, nothing written."""
    source = _source(tmp_path, llama, "w4a16")
    done, recipe = _compile(tmp_path, source, "  quantize { type Linear -> W8A16 }", tmp_path / "o.onnx", "o", "onnx")
    assert done.exit_code == 2 and "Q415" in done.output and "compressed-tensors" in done.output, done.output
    assert not (tmp_path / "o.onnx").exists()


@pytest.mark.llama_cpp
def test_a_compressed_w4a16_folder_compiles_to_a_gguf_llama_cpp_runs(llama, tmp_path):
    """Q4_0 from the W4A16 folder: llama.cpp's logits are close to transformers' of the source."""
    import numpy as np
    llama_cpp = pytest.importorskip("llama_cpp")

    source = _source(tmp_path, llama, "w4a16")
    done, _ = _compile(tmp_path, source, "  scheme q4 { weights int4 group 32 symmetric }\n"
                       "  quantize { type Linear -> q4 }", tmp_path / "o.gguf")
    assert done.exit_code == 0, done.output
    ids = list(range(5, 40))
    import transformers
    model = transformers.AutoModelForCausalLM.from_pretrained(str(source)).eval()
    with torch.no_grad():
        expected = model(torch.tensor([ids])).logits[0].float().numpy()
    runner_model = llama_cpp.Llama(str(tmp_path / "o.gguf"), logits_all=True, verbose=False, n_ctx=64)
    runner_model.eval(ids)
    got = np.array(runner_model.scores[:len(ids)])
    cosine = float((expected * got).sum() / np.linalg.norm(expected) / np.linalg.norm(got))
    assert cosine > 0.98, cosine
