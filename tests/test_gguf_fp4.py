"""GGUF's FP4 types from qrc's FP4 presets: `NVFP4A16` as GGUF's NVFP4 (blocks of 16 with UE4M3 scales in
super-blocks of 64, and each tensor's F32 `.scale`), `MXFP4A16` as its MXFP4. The file decodes to the values the
compressed-tensors folder of the same recipe holds; llama.cpp runs both types, dense and MoE, at the error qrc's
verify reports; rows that are no whole super-block are refused at check."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from compiling import compile_program, logit_kl
from typer.testing import CliRunner
from zoo import add_tokenizer, build, routed_moe

from compiler.cli import app

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
runner = CliRunner()

RECIPE = """recipe gguf_fp4 {{
    model "{model}"
    backend torch
    scheme s = {preset} {{ rounding {rounding} }}
    quantize {{ type Linear -> s  "lm_head" -> none{router} }}
    {calibrate}
    {verify}
    emit "{out}" {{ format {fmt} }}
}}
"""
# e2m1's codes (the sign in the top bit), as compressed-tensors packs them two to a byte
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32)


def _recipe(tmp_path: Path, model: Path, out: Path, preset: str, fmt: str = "gguf", rounding: str = "rtn",
            verify: bool = False, moe: bool = False) -> Path:
    calibrate = "calibrate { data synthetic { samples 8  seqlen 32 }  chunk 4 }" if rounding == "gptq" or verify else ""
    path = tmp_path / f"{out.stem}.recipe"
    path.write_text(RECIPE.format(model=model, out=out, preset=preset, rounding=rounding, fmt=fmt, calibrate=calibrate,
                                  verify="verify { samples 8  metric kld  at_most 0.05 }" if verify else "",
                                  router='  "*.mlp.gate" -> none' if moe else ""))
    return path


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    """The zoo Llama (rows of 64 and 128 weights: whole NVFP4 super-blocks) with a tokenizer."""
    return add_tokenizer(build("llama", tmp_path_factory.mktemp("fp4") / "llama"), 320)


def _folder_values(folder: Path) -> dict[str, np.ndarray]:
    """Each FP4 layer of a compressed-tensors folder decoded from its stored tensors: e2m1 × its block scale (E4M3
    over the global scale, or E8M0's power of two), by weight name."""
    from safetensors.torch import load_file

    stored = load_file(folder / "model.safetensors")
    values = {}
    for key in (k for k in stored if k.endswith(".weight_packed")):
        stem = key.removesuffix(".weight_packed")
        packed = stored[key].numpy()
        codes = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(packed.shape[0], -1)
        scale = stored[f"{stem}.weight_scale"]
        if f"{stem}.weight_global_scale" in stored:
            block = scale.float().numpy() / stored[f"{stem}.weight_global_scale"].float().numpy()
        else:
            block = np.ldexp(np.float32(1), scale.numpy().astype(np.int32) - 127)
        values[f"{stem}.weight"] = E2M1[codes] * np.repeat(block, codes.shape[1] // block.shape[1], axis=1)
    return values


def _file_values(path: Path) -> dict[str, np.ndarray]:
    """Each FP4 tensor of a GGUF decoded by the gguf package (llama.cpp's decoders), times its `.scale` if any."""
    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    values = {}
    for name, t in tensors.items():
        if t.tensor_type.name in ("NVFP4", "MXFP4"):
            decoded = gguf.quants.dequantize(t.data, t.tensor_type)
            scale = tensors.get(name.removesuffix(".weight") + ".scale")
            values[name] = decoded * (np.asarray(scale.data)[0] if scale is not None else 1)
    return values


@pytest.mark.slow  # a compile each: kept out of the quick loop's three minutes
@pytest.mark.parametrize("preset, kind, source", [("NVFP4A16", "NVFP4", "float"), ("MXFP4A16", "MXFP4", "float"),
                                                   ("NVFP4A16", "NVFP4", "folder")])
def test_the_file_holds_the_values_of_the_folder(llama, tmp_path, preset, kind, source):
    """The same recipe written as a compressed-tensors folder and as a GGUF: every quantized layer decodes (the
    gguf package's decoder, NVFP4's `.scale` applied) to the folder's values, q/k rows in llama.cpp's RoPE order;
    NVFP4 tensors have their `.scale` (one F32), MXFP4 none. `folder`: the GGUF compiled from that NVFP4 folder
    rather than from the float model, its values the folder's still (not rounded again)."""
    folder, out = tmp_path / "folder", tmp_path / "m.gguf"
    for target, fmt in ((folder, "safetensors"), (out, "gguf")):
        model = folder if source == "folder" and fmt == "gguf" else llama
        done = runner.invoke(app, ["compile", str(_recipe(tmp_path, model, target, preset, fmt))])
        assert done.exit_code == 0, done.output
    expected, found = _folder_values(folder), _file_values(out)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
    assert len(found) == len(expected) == 14
    for key, value in expected.items():
        name = names.get_name(key, try_suffixes=(".weight",))
        heads = {"q_proj": 4, "k_proj": 2}.get(key.split(".")[-2])  # the zoo Llama's heads and KV heads
        if heads:
            value = value.reshape(heads, 2, value.shape[0] // heads // 2, -1).swapaxes(1, 2).reshape(value.shape)
        np.testing.assert_allclose(found[name], value, rtol=1e-6, atol=0, err_msg=key)
    tensors = {t.name: t for t in gguf.GGUFReader(out).tensors}
    assert {t.tensor_type.name for n, t in tensors.items() if n in found} == {kind}
    scales = [n for n in tensors if n.endswith(".scale")]
    assert len(scales) == (14 if kind == "NVFP4" else 0)
    assert all(tensors[n].tensor_type.name == "F32" and int(tensors[n].n_elements) == 1 for n in scales)


def test_nvfp4_rows_must_be_whole_super_blocks(tmp_path):
    """NVFP4 rows of 160 weights (ten blocks of 16, not whole super-blocks of 64): Q438 at check, nothing written;
    one error for the layers refused alike (each block's down projection), not one a layer (a gpt-oss-120b to
    Q4_K had 13,932)."""
    torch.manual_seed(0)
    folder = tmp_path / "narrow"
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=320, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128)).save_pretrained(folder)
    add_tokenizer(folder, 320)
    out = tmp_path / "o.gguf"
    result = runner.invoke(app, ["check", str(_recipe(tmp_path, folder, out, "NVFP4A16"))])
    assert result.exit_code == 2 and "error[Q438]" in result.output, result.output
    assert "super-blocks of 64" in result.output.replace("\n", " ") and "down_proj" in result.output
    assert result.output.count("error[Q438]") == 1 and "(and 1 more layer like it)" in result.output, result.output
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.llama_cpp
@pytest.mark.parametrize("model, preset, rounding", [("llama", "NVFP4A16", "rtn"), ("llama", "MXFP4A16", "gptq"),
                                                     ("qwen3_moe", "NVFP4A16", "gptq"), ("gpt_oss_64", "NVFP4A16", "gptq")])
def test_fp4_files_run_in_llama_cpp_at_the_error_verify_reports(llama, tmp_path, model, preset, rounding):
    """llama.cpp loads the file alone; on held-out ids its KL to the float model in transformers is of the size
    qrc's verify reported for the file's values (llama.cpp also rounds the inputs of each product to Q8_0). With
    NVFP4 the `.scale` tensors are what make it so: each is a global scale's inverse (about 1e-4 here), which
    llama.cpp must multiply in. The MoE's merged experts carry one `.scale` per expert; gpt-oss's none (its graph
    reads none for its experts), whose experts are rounded, calibrated per expert, with a global scale of 1."""
    llama_cpp_run = pytest.importorskip("llama_cpp_run")
    pytest.importorskip("llama_cpp", reason="llama-cpp-python (llama.cpp) runs the GGUF")
    folder = {"llama": llama, "qwen3_moe": routed_moe("qwen3_moe", tmp_path / "moe")}.get(model) or \
        add_tokenizer(build(model, tmp_path / "oss"), 320)
    out = tmp_path / "m.gguf"
    result, _ = compile_program(str(_recipe(tmp_path, folder, out, preset, rounding=rounding, verify=True,
                                            moe=model == "qwen3_moe")), out)
    assert result.verify_passed, result.verify
    tensors = {t.name: t for t in gguf.GGUFReader(out).tensors}
    if model == "qwen3_moe":
        merged, scale = tensors["blk.1.ffn_up_exps.weight"], tensors["blk.1.ffn_up_exps.scale"]
        assert merged.tensor_type.name == "NVFP4" and int(merged.shape[-1]) == 8 and int(scale.n_elements) == 8
        assert len(set(np.asarray(scale.data).tolist())) == 8  # each expert its own global scale
    if model.startswith("gpt_oss"):
        merged = tensors["blk.1.ffn_up_exps.weight"]
        assert merged.tensor_type.name == "NVFP4" and int(merged.shape[-1]) == 4
        assert "blk.1.ffn_up_exps.scale" not in tensors and "blk.1.attn_q.scale" in tensors
    ids = [int(i) for i in np.random.default_rng(7).integers(1, 320, 32)]
    reference = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        logits = reference(torch.tensor([ids])).logits[0].float().numpy()
    kl = logit_kl(logits, llama_cpp_run.logits(out, ids))
    assert kl < 0.02 and 0.3 < kl / result.verify["kld"] < 3, (kl, result.verify)
