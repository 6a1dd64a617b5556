"""GGUF output for llama.cpp: zoo decoders (random weights, a BPE tokenizer trained in the test) compiled to
Q4_0/Q8_0, then run by llama.cpp itself (llama-cpp-python): its logits on held-out ids against the float
model's in transformers, what it generates, the file's types as the recipe's rules say; and the recipes
`qrc check` refuses for GGUF, with their codes."""

from __future__ import annotations

import json
import os
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
RECIPE = """recipe gguf_test {{
    model "{model}"
    backend {backend}
    {transform}
    scheme q4 {{ weights int4 group {group} symmetric  rounding {rounding} }}
    scheme q8 {{ weights int8 group 32 symmetric }}
    quantize {{
        type Linear -> q4
        "*.mlp.down_proj" -> q8
        "lm_head" -> {head}
    }}
    calibrate {{ data synthetic {{ samples 8  seqlen 32 }}  chunk 4 }}
    {extra}
    verify {{ samples 8  metric kld  at_most 0.05 }}
    emit "{out}" {{ format gguf }}
}}
"""


@pytest.fixture(scope="module")
def decoders(tmp_path_factory):
    """family → a zoo folder with a tokenizer of the model's 320 ids; `FAMILY-256`: the same family with rows
    of 256 and 512 weights (whole K-quant super-blocks)."""
    root = tmp_path_factory.mktemp("gguf-zoo")

    def made(family: str) -> Path:
        folder = root / family
        if not folder.exists():
            add_tokenizer(_wide(family.removesuffix("-256"), folder) if family.endswith("-256") else
                          build(family, folder), 320)
        return folder
    return made


def _wide(family: str, folder: Path) -> Path:
    config, cls = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
                   "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM)}[family]
    torch.manual_seed(0)
    cls(config(vocab_size=320, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=64, max_position_embeddings=128, tie_word_embeddings=False)
        ).eval().save_pretrained(folder)
    return folder


def _recipe(tmp_path: Path, model, out: Path, group: int = 32, head: str = "q8", extra: str = "",
            backend: str = "torch", rounding: str = "rtn", transform: str = "") -> str:
    path = tmp_path / "r.recipe"
    path.write_text(RECIPE.format(model=model, out=out, group=group, head=head, extra=extra, backend=backend,
                                  rounding=rounding, transform=transform))
    return str(path)


def _float_and_llama_cpp(folder: Path, out: Path, llama_cpp_run) -> tuple[np.ndarray, np.ndarray]:
    """The float model's logits in transformers and llama.cpp's of the GGUF, on the same 32 held-out ids."""
    ids = [int(i) for i in np.random.default_rng(7).integers(1, 320, 32)]
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        reference = model(torch.tensor([ids])).logits[0].float().numpy()
    return reference, llama_cpp_run.logits(out, ids)


def _types(path: Path) -> dict[str, str]:
    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}


@pytest.mark.slow
@pytest.mark.llama_cpp
@pytest.mark.parametrize("family, rounding", [("llama", "rtn"), ("qwen3", "rtn"), ("qwen3-tied", "rtn"),
                                              ("qwen2", "rtn"), ("llama", "gptq+awq")])
def test_gguf_runs_in_llama_cpp_like_the_float_model(decoders, family, rounding, tmp_path):
    """llama.cpp loads the file with nothing beside it, its logits on held-out ids stay within the formats'
    error of the float model's (the KL qrc's verify reports is of the same size), it tokenizes and generates
    text, and every tensor has the type its rule gives; GPTQ behind AWQ too (AWQ's scales folded into the norms
    the file carries)."""
    llama_cpp_run = pytest.importorskip("llama_cpp_run")
    pytest.importorskip("llama_cpp", reason="llama-cpp-python (llama.cpp) runs the GGUF")
    folder, out = decoders(family), tmp_path / f"{family}.gguf"
    awq = rounding == "gptq+awq"
    recipe = _recipe(tmp_path, folder, out, rounding="gptq" if awq else "rtn",
                     transform="transform awq { grid 20 }" if awq else "")
    result, _ = compile_program(recipe, out)
    assert result.verify_passed, result.verify
    types = _types(out)
    assert types["blk.0.attn_q.weight"] == types["blk.1.ffn_up.weight"] == "Q4_0"
    assert types["blk.0.ffn_down.weight"] == "Q8_0"
    assert types["token_embd.weight"] == "F32" and types["output_norm.weight"] == "F32"
    assert types["output.weight"] == "Q8_0"  # the tied head too: the rule gives it a tensor of its own
    reference, ran = _float_and_llama_cpp(folder, out, llama_cpp_run)
    kl = logit_kl(reference, ran)
    cosine = float(np.mean((ran * reference).sum(-1) / np.linalg.norm(ran, axis=-1) / np.linalg.norm(reference, axis=-1)))
    assert kl < 2e-3 and cosine > 0.98, (kl, cosine)
    assert 0.3 < kl / result.verify["kld"] < 3, (kl, result.verify)  # qrc's figure is what llama.cpp shows
    text = llama_cpp_run.generate(out, "The quick brown")
    assert isinstance(text, str) and text, "llama.cpp generated nothing"


MOE_RECIPE = """recipe gguf_moe {{
    model "{model}"
    backend torch
    scheme q4 {{ weights int4 group 32 symmetric  rounding {rounding} }}
    scheme q8 {{ weights int8 group 32 symmetric }}
    quantize {{
        type Linear -> q4
        "*.experts.*.{down}" -> q8
        re".*\\.(mlp|block_sparse_moe)\\.gate" -> none
        "lm_head" -> q8
    }}
    calibrate {{ data synthetic {{ samples 8  seqlen 32 }}  chunk 4 }}
    verify {{ samples 8  metric kld  at_most 0.05 }}
    emit "{out}" {{ format gguf }}
}}
"""


@pytest.mark.slow
@pytest.mark.llama_cpp
@pytest.mark.parametrize("family, down, rounding", [("qwen3_moe", "down_proj", "gptq"), ("mixtral", "w2", "rtn")])
def test_moe_experts_go_into_llama_cpps_merged_tensors_and_run_there(family, down, rounding, tmp_path):
    """Each block's experts are written into llama.cpp's merged tensors (`ffn_gate_exps`, `ffn_up_exps`,
    `ffn_down_exps`: [experts, rows, columns], every expert's rows rounded as a layer of its own, here by GPTQ
    from the tokens routed to it) beside the router in float (`ffn_gate_inp`, F32, as llama.cpp's converter keeps
    it); llama.cpp loads the file alone and its logits stay within the formats' error of the float model's, at
    the KL qrc's verify reported (measured: Qwen3-MoE 0.00074 against verify's 0.00065, Mixtral 0.00054 against
    0.00048)."""
    llama_cpp_run = pytest.importorskip("llama_cpp_run")
    pytest.importorskip("llama_cpp", reason="llama-cpp-python (llama.cpp) runs the GGUF")
    folder, out = routed_moe(family, tmp_path / family), tmp_path / f"{family}.gguf"
    recipe = tmp_path / "moe.recipe"
    recipe.write_text(MOE_RECIPE.format(model=folder, out=out, down=down, rounding=rounding))
    result, _ = compile_program(str(recipe), out)
    assert result.verify_passed, result.verify
    reader = gguf.GGUFReader(out)
    tensors = {t.name: t for t in reader.tensors}
    for name, kind in (("ffn_gate_exps", "Q4_0"), ("ffn_up_exps", "Q4_0"), ("ffn_down_exps", "Q8_0")):
        merged = tensors[f"blk.1.{name}.weight"]
        assert merged.tensor_type.name == kind and int(merged.shape[-1]) == 8, (name, merged.shape)
    assert tensors["blk.0.ffn_gate_inp.weight"].tensor_type.name == "F32"
    assert int(reader.fields[f"{reader.fields['general.architecture'].contents()}.expert_count"].contents()) == 8
    kl = logit_kl(*_float_and_llama_cpp(folder, out, llama_cpp_run))
    assert kl < 5e-3, kl
    assert 0.3 < kl / result.verify["kld"] < 3, (kl, result.verify)  # qrc's figure is what llama.cpp shows


@pytest.mark.slow
@pytest.mark.parametrize("case", ["mixed_experts", "router", "unnormalised"])
def test_check_refuses_an_moe_gguf_llama_cpp_would_compute_differently(case, tmp_path):
    """Experts of one projection with two types (one merged tensor has one type), a rounded router (llama.cpp
    keeps it float), a Qwen3-MoE that does not renormalise its chosen experts' weights (llama.cpp's graph does):
    Q438, Q438 and Q439 from `qrc check`, exit 2, nothing written."""
    folder = routed_moe("qwen3_moe", tmp_path / "moe")
    text = MOE_RECIPE.format(model=folder, out=tmp_path / "o.gguf", down="down_proj", rounding="rtn")
    if case == "mixed_experts":
        text = text.replace('"lm_head" -> q8', '"lm_head" -> q8\n        "*.experts.3.up_proj" -> q8')
    elif case == "router":
        text = text.replace('re".*\\.(mlp|block_sparse_moe)\\.gate" -> none', 're".*\\.mlp\\.gate" -> q8')
    else:
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "norm_topk_prob": False}))
    recipe = tmp_path / "r.recipe"
    recipe.write_text(text)
    result = runner.invoke(app, ["check", str(recipe)])
    code = {"mixed_experts": "Q438", "router": "Q438", "unnormalised": "Q439"}[case]
    assert result.exit_code == 2 and f"error[{code}]" in result.output, result.output
    said = {"mixed_experts": "experts.up_proj", "router": "ffn_gate_inp", "unnormalised": "norm_topk_prob"}[case]
    assert said in result.output.replace("\n", " "), result.output
    assert not (tmp_path / "o.gguf").exists()


K_RECIPE = """recipe gguf_k {{
    model "{model}"
    backend torch
    scheme q4k {{ weights q4_k  rounding {rounding} }}
    scheme q6k {{ weights q6_k  rounding {rounding} }}
    quantize {{
        type Linear -> q4k
        "*.mlp.down_proj", "*.self_attn.v_proj", "lm_head" -> q6k
    }}
    calibrate {{ data synthetic {{ samples 16  seqlen 64 }}  chunk 8 }}
    verify {{ samples 8  metric kld  at_most 0.05 }}
    emit "{out}" {{ format gguf }}
}}
"""


@pytest.mark.slow
@pytest.mark.llama_cpp
@pytest.mark.parametrize("family, rounding", [("llama-256", "imatrix"), ("qwen3-256", "imatrix"), ("llama-256", "rtn"),
                                              ("qwen3-256", "gptq")])
def test_k_quants_run_in_llama_cpp(decoders, family, rounding, tmp_path):
    """Q4_K with Q6_K for v_proj, down_proj and the head (llama.cpp's Q4_K_M choice for those tensors), searched
    data-free or with the importance matrix qrc gathers: llama.cpp runs the file, within the formats' error of the
    float model and of the size qrc's verify reports."""
    llama_cpp_run = pytest.importorskip("llama_cpp_run")
    pytest.importorskip("llama_cpp", reason="llama-cpp-python (llama.cpp) runs the GGUF")
    folder, out = decoders(family), tmp_path / "k.gguf"
    recipe = tmp_path / "k.recipe"
    recipe.write_text(K_RECIPE.format(model=folder, out=out, rounding=rounding))
    result, planned = compile_program(str(recipe), out)
    assert result.verify_passed, result.verify
    calibrates = any(op.kind.value in ("calibrate_chunk", "cache_block_inputs") for op in planned.plan.ops)
    assert calibrates == (rounding != "rtn")  # the importance matrix (and GPTQ's Hessians) from a calibration pass
    types = _types(out)
    assert types["blk.0.attn_q.weight"] == types["blk.1.ffn_gate.weight"] == "Q4_K"
    assert types["blk.0.attn_v.weight"] == types["blk.1.ffn_down.weight"] == types["output.weight"] == "Q6_K"
    ids = [int(i) for i in np.random.default_rng(9).integers(1, 320, 32)]
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        reference = model(torch.tensor([ids])).logits[0].float().numpy()
    kl = logit_kl(reference, llama_cpp_run.logits(out, ids))
    assert kl < 5e-3 and 0.3 < kl / result.verify["kld"] < 3, (kl, result.verify)


@pytest.mark.slow
def test_gptq_onto_the_k_quant_grid_beats_the_imatrix_search(decoders, tmp_path):
    """`rounding gptq` on K-quants keeps the grid of llama.cpp's imatrix search (every super-block's scales and
    mins are the imatrix file's) and rounds onto it with GPTQ: the model's KL against float on held-out samples
    is lower than the imatrix search's on the same calibration."""
    folder = decoders("llama-256")
    found = {}
    for rounding in ("imatrix", "gptq"):
        out = tmp_path / f"{rounding}.gguf"
        recipe = tmp_path / f"{rounding}.recipe"
        recipe.write_text(K_RECIPE.format(model=folder, out=out, rounding=rounding))
        result, _ = compile_program(str(recipe), out)
        assert result.verify_passed, result.verify
        reader = gguf.GGUFReader(out)
        found[rounding] = (result.verify["kld"], {t.name: np.array(t.data) for t in reader.tensors})
    (imatrix_kl, imatrix), (gptq_kl, rounded) = found["imatrix"], found["gptq"]
    assert gptq_kl < 0.8 * imatrix_kl, (gptq_kl, imatrix_kl)
    q4k, q6k = "blk.0.attn_q.weight", "blk.0.ffn_down.weight"
    # the grid: Q4_K's d, dmin and 6-bit scales (bytes 0-15 of each 144-byte block), Q6_K's scales and d (the last 18
    # of each 210-byte block) are the imatrix search's; the integers differ
    assert np.array_equal(imatrix[q4k].reshape(-1, 144)[:, :16], rounded[q4k].reshape(-1, 144)[:, :16])
    assert np.array_equal(imatrix[q6k].reshape(-1, 210)[:, 192:], rounded[q6k].reshape(-1, 210)[:, 192:])
    assert not np.array_equal(imatrix[q4k], rounded[q4k])


def test_data_free_gguf_streams_file_to_file_to_the_same_bytes(decoders, tmp_path):
    """Without calibration or verification nothing runs the model: each weight is read, rounded and written at
    its offset (the plan says file to file), and the file is byte for byte the one a verified compile writes."""
    from compiler.frontend import plan_file

    folder = decoders("llama-256")
    files = {}
    for verified in (True, False):
        recipe, out = tmp_path / f"{verified}.recipe", tmp_path / f"{verified}.gguf"
        text = K_RECIPE.format(model=folder, out=out, rounding="rtn")
        recipe.write_text(text if verified else text.replace("    verify {{ samples 8  metric kld  at_most 0.05 }}\n"
                                                              .replace("{{", "{").replace("}}", "}"), ""))
        planned = plan_file(str(recipe))
        strategies = {op.strategy.value for op in planned.plan.ops if op.kind.value == "quantize_weights"}
        assert strategies == ({"in_place"} if verified else {"file_to_file"}), strategies
        assert runner.invoke(app, ["compile", str(recipe)]).exit_code == 0
        files[verified] = _without_recipe_hash(out)
    assert files[True] == files[False]


def _without_recipe_hash(path: Path) -> bytes:
    """The file's bytes with the recipe's hash (its provenance key, which differs between two recipes) blanked."""
    field = gguf.GGUFReader(path).fields["qrc.recipe_sha256"]
    value = bytes(field.parts[field.data[0]])
    data = path.read_bytes()
    assert data.count(value) == 1
    return data.replace(value, b"0" * len(value))


@pytest.mark.slow
@pytest.mark.llama_cpp
def test_llama_gguf_decodes_in_transformers_as_llama_cpp_runs_it(decoders, tmp_path):
    """A second reader of the same file: transformers' GGUF loader (which dequantizes with the gguf package's
    tables) gives the logits llama.cpp computes, so the Q/K row order, the names and the blocks are read the
    same way by both."""
    llama_cpp_run = pytest.importorskip("llama_cpp_run")
    pytest.importorskip("llama_cpp", reason="llama-cpp-python (llama.cpp) runs the GGUF")
    out = tmp_path / "llama.gguf"
    assert runner.invoke(app, ["compile", _recipe(tmp_path, decoders("llama"), out)]).exit_code == 0
    ids = [int(i) for i in np.random.default_rng(8).integers(1, 320, 24)]
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=out.name).eval()
    with torch.no_grad():
        decoded = loaded(torch.tensor([ids])).logits[0].float().numpy()
    assert logit_kl(decoded, llama_cpp_run.logits(out, ids)) < 1e-4


def test_gguf_blocks_decode_to_qrc_rounding(decoders, tmp_path):
    """The file's blocks are llama.cpp's reference rounding of the weights (rtn Q4_0), the q/k rows in
    llama.cpp's RoPE order, and the tokenizer llama.cpp's byte-level BPE."""
    folder, out = decoders("llama"), tmp_path / "llama.gguf"
    result = runner.invoke(app, ["compile", _recipe(tmp_path, folder, out, extra="", head="none")])
    assert result.exit_code == 0, result.output
    reader = {t.name: t for t in gguf.GGUFReader(out).tensors}
    assert "output.weight" in reader and reader["output.weight"].tensor_type.name == "F32"
    from safetensors.numpy import load_file
    weights = load_file(folder / "model.safetensors")
    w = weights["model.layers.0.mlp.gate_proj.weight"]
    t = reader["blk.0.ffn_gate.weight"]
    # rtn Q4_0 is llama.cpp's reference rounding, byte for byte (the gguf package's port of it)
    assert np.array_equal(np.asarray(t.data).reshape(-1), gguf.quants.quantize(w, t.tensor_type).reshape(-1))
    q = reader["blk.0.attn_q.weight"]
    heads = 4
    dq = gguf.quants.dequantize(q.data, q.tensor_type)
    float_q = weights["model.layers.0.self_attn.q_proj.weight"]
    reordered = float_q.reshape(heads, 2, float_q.shape[0] // heads // 2, -1).swapaxes(1, 2).reshape(float_q.shape)
    assert np.corrcoef(dq.ravel(), reordered.ravel())[0, 1] > 0.99  # rows in llama.cpp's RoPE order
    assert np.corrcoef(dq.ravel(), float_q.ravel())[0, 1] < 0.9
    fields = gguf.GGUFReader(out).fields
    assert bytes(fields["tokenizer.ggml.model"].parts[-1]).decode() == "gpt2"
    assert bytes(fields["tokenizer.ggml.pre"].parts[-1]).decode() == "gpt-2"
    assert len(fields["tokenizer.ggml.tokens"].data) == 320


@pytest.mark.parametrize("case, code", [
    ("group", "Q438"), ("activations", "Q438"), ("builtin", "Q439"), ("no_tokenizer", "Q439"), ("family", "Q439"),
    ("onnx", "Q220"), ("kv_cache", "Q438"), ("k_rows", "Q438"), ("yarn_added", "Q439"),
    ("tokenizer_wider", "Q439"), ("tokenizer_a_list", "Q439"), ("tokenizer_ids_not_integers", "Q439"),
    ("tokenizer_config_a_list", "Q439"), ("tokenizer_config_a_fifo", "Q439"), ("tokenizer_nested_deep", "Q439")])
def test_check_refuses_what_gguf_cannot_hold(decoders, tmp_path, case, code):
    """Each refusal comes from `qrc check`, with its code and exit 2, before any weight is read."""
    folder = decoders("llama")
    model, group, extra, backend = str(folder), 32, "", "torch"
    if case == "group":
        group = 16
    elif case == "activations":
        extra = "scheme a = W8A8_STATIC"
        model_recipe = _recipe(tmp_path, model, tmp_path / "o.gguf", head="a", extra=extra)
    elif case == "builtin":
        model = "builtin:tiny-llama"
    elif case == "no_tokenizer":
        bare = tmp_path / "bare"
        bare.mkdir()
        for name in ("config.json", "model.safetensors"):
            (bare / name).symlink_to(folder / name)
        model = str(bare)
    elif case == "family":
        model = str(build("phi3", tmp_path / "phi3"))
    elif case == "onnx":
        backend = "onnx"
    elif case == "kv_cache":
        extra = "kv_cache { fp8 }"
    elif case == "yarn_added":  # the edit Qwen's docs tell users to make, beside transformers 5's rope_parameters
        edited = tmp_path / "yarn"
        edited.mkdir()
        for path in folder.iterdir():
            (edited / path.name).symlink_to(path)
        config = json.loads((folder / "config.json").read_text())
        config["rope_scaling"] = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}
        (edited / "config.json").unlink()
        (edited / "config.json").write_text(json.dumps(config))
        model = str(edited)
    elif case == "tokenizer_wider":  # ids past the embedding's 320 rows: the writer had raised a traceback at compile
        edited = tmp_path / "wider"
        edited.mkdir()
        for path in folder.iterdir():
            if path.suffix == ".json":  # copies, which add_tokenizer rewrites
                (edited / path.name).write_bytes(path.read_bytes())
            else:
                (edited / path.name).symlink_to(path)
        model = str(add_tokenizer(edited, 384))
    elif case.startswith("tokenizer_"):  # a tokenizer.json of another shape: a diagnostic, not a traceback
        edited = tmp_path / "odd"
        edited.mkdir()
        for path in folder.iterdir():
            (edited / path.name).symlink_to(path)
        tokenizer = json.loads((folder / "tokenizer.json").read_text())
        tokenizer["added_tokens"].append({"content": "<odd>", "id": "not a number"})
        odd = {"tokenizer_a_list": ("tokenizer.json", "[1, 2]"), "tokenizer_config_a_list": ("tokenizer_config.json", "[1]"),
               "tokenizer_ids_not_integers": ("tokenizer.json", json.dumps(tokenizer)),
               "tokenizer_nested_deep": ("tokenizer.json", "[" * 100_000 + "]" * 100_000)}  # RecursionError once
        if case == "tokenizer_config_a_fifo":  # refused, not read: reading one would wait forever
            (edited / "tokenizer_config.json").unlink()
            os.mkfifo(edited / "tokenizer_config.json")
        else:
            name, text = odd[case]
            (edited / name).unlink()
            (edited / name).write_text(text)
        model = str(edited)
    elif case == "k_rows":  # the zoo model's rows of 64 and 128 weights are no whole super-block of 256
        model_recipe = _recipe(tmp_path, model, tmp_path / "o.gguf", head="k", extra="scheme k { weights q4_k }")
    if case not in ("activations", "k_rows"):
        model_recipe = _recipe(tmp_path, model, tmp_path / "o.gguf", group=group, extra=extra, backend=backend)
    result = runner.invoke(app, ["check", model_recipe])
    assert result.exit_code == 2, result.output
    assert code in result.output, result.output
    assert case != "tokenizer_wider" or "token ids up to 383, beyond the embedding's 320 rows" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "o.gguf").exists()


def test_a_gguf_path_without_format_writes_gguf(decoders, tmp_path):
    """`emit "m.gguf"` with no `format`: the extension names the format (a safetensors folder named m.gguf was
    written before, which no runtime opens as GGUF); `format` written out still wins."""
    from compiler.frontend import plan_file

    recipe, out = tmp_path / "r.recipe", tmp_path / "m.gguf"
    recipe.write_text(RECIPE.format(model=decoders("llama"), out=out, group=32, head="q8", extra="", backend="torch",
                                    rounding="rtn", transform="").replace(" { format gguf }", ""))
    emit = next(op for op in plan_file(str(recipe)).plan.ops if op.kind.value == "emit")
    assert emit.format.name == "gguf", emit.format
    assert runner.invoke(app, ["compile", str(recipe)]).exit_code == 0
    assert out.is_file() and gguf.GGUFReader(out).tensors
    explicit = tmp_path / "e.recipe"
    explicit.write_text(recipe.read_text().replace(f'emit "{out}"', f'emit "{tmp_path / "f.gguf"}" {{ format safetensors }}'))
    emit = next(op for op in plan_file(str(explicit)).plan.ops if op.kind.value == "emit")
    assert emit.format.name == "safetensors", emit.format
