"""gpt-oss's MXFP4 checkpoints as source models (issue 68): each packed expert pair indexed as the float tensor
transformers decodes from it (headers alone: `check` and `plan` read no weight bytes), decoded when read, and
recompiled: a float folder equal to transformers' own load of the source, a calibrated W4A16, a broken pair
refused naming the tensor, and a GGUF whose experts, split per expert and merged again, stay MXFP4 or become NVFP4
bit for bit, which llama.cpp runs as transformers runs the source (and a float gpt-oss's GGUF, its experts Q8_0,
likewise)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from compiling import bytes_read
from safetensors import safe_open
from typer.testing import CliRunner
from zoo import gpt_oss_mxfp4

from compiler.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    return gpt_oss_mxfp4(tmp_path_factory.mktemp("mxfp4") / "gpt-oss")


def _recipe(tmp_path: Path, model: Path, body: str, out: Path, name: str = "r") -> Path:
    recipe = tmp_path / f"{name}.recipe"
    recipe.write_text(f'recipe {name} {{\n  model "{model}"\n  backend torch\n{body}\n  emit "{out}"\n}}\n')
    return recipe


def _load(folder: Path):
    import transformers

    model, info = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32,
                                                                    output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    return model.eval()


def _logits(model) -> torch.Tensor:
    ids = torch.randint(2, 300, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return model(ids).logits.float()


def test_check_and_plan_index_the_pairs_as_float_experts_reading_no_weight_bytes(source, tmp_path):
    """The index holds `experts.gate_up_proj` [experts, in, out] where the file has `_blocks` and `_scales`; the
    fused experts are said to stay float (Q266), decoded; no weight bytes read."""
    recipe = _recipe(tmp_path, source, "  scheme w4 = W4A16 { group 32 }\n  quantize { type Linear -> w4 }",
                     tmp_path / "out")
    for command in ("check", "plan"):
        runner.invoke(app, [command, str(recipe)])  # the modules it imports read once, before the count
        before = bytes_read()
        done = runner.invoke(app, [command, str(recipe)])
        read = bytes_read() - before
        assert done.exit_code == 0, done.output
        assert read < (source / "model.safetensors").stat().st_size // 4, (command, read)
    assert "model.layers.0.mlp.experts.down_proj`" in done.output and "decoded from the source's MXFP4" in \
        done.output and "format gguf" in done.output, done.output  # where they would stay MXFP4


@pytest.mark.slow  # compiles and transformers loads
def test_every_layer_none_writes_the_floats_transformers_decodes(source, tmp_path):
    """A float folder: every expert tensor equal to transformers' MXFP4 load of the source (dequantized), no
    `_blocks` or `_scales` left, the source's `quantization_config` gone; the same logits."""
    out = tmp_path / "float"
    done = runner.invoke(app, ["compile", str(_recipe(tmp_path, source, "  quantize { type Linear -> none }", out))])
    assert done.exit_code == 0, done.output
    with safe_open(out / "model.safetensors", "pt") as f:
        names = list(f.keys())
        written = f.get_tensor("model.layers.1.mlp.experts.gate_up_proj").float()
    assert not [n for n in names if n.endswith(("_blocks", "_scales"))], names
    assert json.loads((out / "config.json").read_text())["quantization_config"].get("quant_method") != "mxfp4"
    reference = _load(source)
    assert torch.equal(written, reference.model.layers[1].mlp.experts.gate_up_proj.detach().float())
    assert torch.allclose(_logits(_load(out)), _logits(reference), atol=1e-5)


@pytest.mark.slow
def test_a_calibrated_w4a16_of_it_loads_and_verifies(source, tmp_path):
    """GPTQ on the attention layers, the model run with its decoded experts (routing as the model's): verified,
    and transformers' default load of the folder is close to the source."""
    out = tmp_path / "w4"
    body = ("  scheme w4 = W4A16 { group 32  rounding gptq }\n  quantize { type Linear -> w4 }\n"
            "  calibrate { data synthetic { samples 8  seqlen 32 }  chunk 4 }\n"
            "  verify { samples 4  metric cosine  at_least 0.95 }")
    done = runner.invoke(app, ["compile", str(_recipe(tmp_path, source, body, out))])
    assert done.exit_code == 0 and "passed: cosine" in done.output, done.output
    quantized, reference = _logits(_load(out)), _logits(_load(source))
    assert torch.nn.functional.cosine_similarity(quantized.flatten(), reference.flatten(), dim=0) > 0.95


def _broken(source: Path, folder: Path, name: str, change) -> Path:
    """The source with one tensor changed (`change` returns its new value, or None to leave it out)."""
    from safetensors.torch import load_file, save_file

    folder.mkdir()
    tensors = load_file(source / "model.safetensors")
    changed = change(tensors.pop(name))
    if changed is not None:
        tensors[name] = changed
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    (folder / "config.json").write_text((source / "config.json").read_text())
    return folder


@pytest.mark.parametrize("name", ["model.layers.1.mlp.experts.down_proj_scales",
                                  "model.layers.1.mlp.experts.down_proj_blocks"])
def test_a_pair_missing_a_half_is_refused_at_check_naming_the_tensor(source, tmp_path, name):
    """A `_blocks` tensor whose `_scales` is missing (or the other way round): Q252 at check, naming the one
    left, no traceback."""
    broken = _broken(source, tmp_path / "broken", name, lambda tensor: None)
    recipe = _recipe(tmp_path, broken, "  quantize { type Linear -> W8A16 }", tmp_path / "out")
    done = runner.invoke(app, ["check", str(recipe)])
    left = "experts.down_proj_blocks" if name.endswith("_scales") else "experts.down_proj_scales"
    assert done.exit_code == 2 and "Q252" in done.output and left in done.output, done.output
    assert "Traceback" not in done.output


@pytest.mark.slow
def test_a_nan_scale_stops_the_compile_before_anything_is_written(source, tmp_path):
    """An E8M0 scale of 255 (NaN) would decode to infinities: Q404 names the scales, nothing is written."""
    def nan(scales):
        scales[0, 0, 0] = 255
        return scales

    broken = _broken(source, tmp_path / "broken", "model.layers.0.mlp.experts.gate_up_proj_scales", nan)
    out = tmp_path / "out"
    done = runner.invoke(app, ["compile", str(_recipe(tmp_path, broken, "  quantize { type Linear -> none }", out))])
    assert done.exit_code == 2 and "Q404" in done.output and "gate_up_proj_scales" in done.output, done.output
    assert "Traceback" not in done.output and not out.exists()


def _gguf_recipe(tmp_path: Path, model: Path, out: Path, experts: str = "") -> Path:
    """Every Linear Q8_0; `experts`, a rule of the experts' own after it."""
    body = f"  scheme q8 = W8A16 {{ group 32  symmetric }}\n  quantize {{ type Linear -> q8  {experts} }}"
    recipe = tmp_path / "g.recipe"
    recipe.write_text(f'recipe g {{\n  model "{model}"\n  backend torch\n{body}\n  emit "{out}" {{ format gguf }}\n}}\n')
    return recipe


# the experts' rule, and the GGUF type their tensors then have: left as the source stores them, or NVFP4
EXPERTS = {"MXFP4": '"*.experts.*" -> none', "NVFP4": '"*.experts.*" -> NVFP4A16'}


@pytest.fixture(scope="module")
def tokenized(tmp_path_factory) -> Path:
    """The same checkpoint with a tokenizer, as a GGUF carries one."""
    from zoo import add_tokenizer

    return add_tokenizer(gpt_oss_mxfp4(tmp_path_factory.mktemp("mxfp4-gguf") / "gpt-oss"), 320)


@pytest.fixture(scope="module")
def tokenized_64(tmp_path_factory) -> Path:
    """The same with experts 64 wide: every expert row whole NVFP4 super-blocks of GGUF."""
    from zoo import add_tokenizer

    return add_tokenizer(gpt_oss_mxfp4(tmp_path_factory.mktemp("mxfp4-gguf-64") / "gpt-oss", "gpt_oss_64"), 320)


def test_for_a_gguf_check_and_plan_index_each_expert_reading_no_weight_bytes(tokenized_64, tmp_path):
    """For a GGUF output the experts are indexed per expert (2 blocks of 4 experts, 3 projections each: 24 layers,
    none of them fused), from the headers: check and plan read no weight bytes, and `inspect --recipe` lists them
    as the recipe's rules see them. Cast to NVFP4, the plan counts
    compressed-tensors' imports (it rounds them with given scales) beside the MXFP4 decoder's."""
    from compiler.frontend import plan_file
    from compiler.models import index_model

    index = index_model(str(tokenized_64), gguf_output=True)
    assert sum(".experts." in x.name for x in index.layers) == 24 and not index.fused_experts
    assert len(index.packed_experts) == 24 and index.experts_split
    assert not index_model(str(tokenized_64)).experts_split  # a folder keeps them fused (transformers loads so)
    peaks = {}
    for kind, rule in EXPERTS.items():
        recipe = _gguf_recipe(tmp_path, tokenized_64, tmp_path / f"{kind}.gguf", rule)
        for command in ("check", "plan"):
            runner.invoke(app, [command, str(recipe)])  # the modules it imports read once, before the count
            before = bytes_read()
            done = runner.invoke(app, [command, str(recipe)])
            read = bytes_read() - before
            assert done.exit_code == 0 and "Q266" not in done.output, done.output
            assert read < (tokenized_64 / "model.safetensors").stat().st_size // 4, (command, read)
        peaks[kind] = plan_file(str(recipe)).plan.peak_bytes
        listed = runner.invoke(app, ["inspect", "--recipe", str(recipe), "--format", "text"])  # as the GGUF sees it
        assert listed.exit_code == 0 and "model.layers.1.mlp.experts.3.down_proj " in listed.output, listed.output
    assert peaks["NVFP4"] - peaks["MXFP4"] >= 80 << 20, peaks


@pytest.mark.slow  # builds qrc's model and transformers' (10 s); the quick loop is near its limit
def test_qrc_runs_the_split_experts_as_transformers_runs_the_fused_ones(tokenized_64):
    """The per-expert layers qrc rounds for a GGUF (gpt-oss's biased, interleaved experts split:
    torch/experts.py) compute what transformers' fused module computes, routed as the model routes and with every
    token through every expert (calibration's `experts all`, which adds only the routed tokens' outputs)."""
    from compiler.backends.torch.experts import set_routing
    from compiler.backends.torch.model import open_model
    from compiler.ir.types import ExpertRouting
    from compiler.models import index_model

    index = index_model(str(tokenized_64), gguf_output=True)
    model = open_model(str(tokenized_64), index.blocks, None, split_experts=True)
    model.materialize(list(model.keys))
    assert "model.layers.1.mlp.experts.3.gate_proj.weight" in dict(model.module.named_parameters())
    ids = torch.randint(2, 300, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = _load(tokenized_64)(ids).logits.float()
        for routing in (ExpertRouting.ROUTED, ExpertRouting.ALL):
            set_routing(model.module, routing)
            ours = model.forward({"input_ids": ids}).float()
            assert float((ours - reference).abs().max()) < 1e-4, routing


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(EXPERTS))
def test_its_gguf_experts_hold_the_source_floats_exactly(tokenized, tokenized_64, tmp_path, kind):
    """To GGUF (attention Q8_0): llama.cpp's gpt-oss tensors, the experts split per expert (gate and up from their
    interleaved columns, every matrix [out, in]) and merged again, holding exactly the floats transformers
    decodes from the source: left MXFP4 as the source stores them, or cast to NVFP4 (each MXFP4 block's power of
    two an e4m3 block scale, the global scale 1: llama.cpp's gpt-oss graph reads no `.scale` for its experts)."""
    import gguf

    source, out = (tokenized if kind == "MXFP4" else tokenized_64), tmp_path / "oss.gguf"
    done = runner.invoke(app, ["compile", str(_gguf_recipe(tmp_path, source, out, EXPERTS[kind]))])
    assert done.exit_code == 0 and "Q266" not in done.output, done.output
    tensors = {t.name: t for t in gguf.GGUFReader(out).tensors}
    experts = _load(source).model.layers[1].mlp.experts
    gate_up, down = experts.gate_up_proj.detach(), experts.down_proj.detach()  # [E, in, 2·inner], [E, inner, out]
    expected = {"ffn_gate_exps": gate_up.transpose(1, 2)[:, 0::2], "ffn_up_exps": gate_up.transpose(1, 2)[:, 1::2],
                "ffn_down_exps": down.transpose(1, 2)}
    for name, values in expected.items():
        stored = tensors[f"blk.1.{name}.weight"]
        assert stored.tensor_type == getattr(gguf.GGMLQuantizationType, kind), name
        decoded = gguf.quants.dequantize(stored.data, stored.tensor_type).reshape(values.shape)
        assert torch.equal(torch.from_numpy(decoded), values.float()), name
        assert f"blk.1.{name}.scale" not in tensors
    assert tensors["blk.1.attn_q.weight"].tensor_type == gguf.GGMLQuantizationType.Q8_0
    assert "blk.1.attn_sinks.weight" in tensors and "blk.1.ffn_gate_exps.bias" in tensors


@pytest.mark.slow
def test_where_its_gguf_runs_is_what_the_runtimes_do(tokenized, tmp_path):
    """qrc's table says transformers does not run a gpt-oss GGUF (its GGUF loader fails on the YaRN keys), and
    transformers' load of the file fails: a release that reads them fails this test, and the table is updated."""
    import transformers

    from compiler import plan_file
    from compiler.ir.runtimes import Device, Runtime, cell

    out = tmp_path / "oss.gguf"
    recipe = _gguf_recipe(tmp_path, tokenized, out)
    said = cell(plan_file(str(recipe)).program.runtimes, Runtime.TRANSFORMERS, Device.CPU)
    assert not said.runs and "YaRN" in said.how, said
    assert runner.invoke(app, ["compile", str(recipe)]).exit_code == 0
    with pytest.raises(Exception):  # noqa: B017  # whatever the loader raises, it must not load
        transformers.AutoModelForCausalLM.from_pretrained(out.parent, gguf_file=out.name)


@pytest.mark.llama_cpp
@pytest.mark.slow
@pytest.mark.parametrize("stored, experts", [("mxfp4", "MXFP4"), ("mxfp4", "NVFP4"), ("float", "")])
def test_llama_cpp_runs_its_gguf_as_transformers_runs_the_source(stored, experts, tokenized, tokenized_64, tmp_path):
    """llama.cpp's gpt-oss graph (sinks, sliding layers, YaRN, biased experts) on the file qrc wrote agrees with
    transformers on the source, over more tokens than the sliding window: from the MXFP4 checkpoint, its experts
    kept MXFP4 or cast to NVFP4 (both exact), and from a float one, its experts Q8_0 like every other Linear."""
    llama_cpp_run = pytest.importorskip("llama_cpp_run")
    pytest.importorskip("llama_cpp", reason="llama-cpp-python (llama.cpp) runs the GGUF")
    import numpy as np
    from zoo import add_tokenizer, build

    model = {"MXFP4": tokenized, "NVFP4": tokenized_64}.get(experts) or add_tokenizer(build("gpt_oss", tmp_path / "f"), 320)
    out = tmp_path / "oss.gguf"
    done = runner.invoke(app, ["compile", str(_gguf_recipe(tmp_path, model, out, EXPERTS.get(experts, "")))])
    assert done.exit_code == 0, done.output
    ids = [int(i) for i in np.random.RandomState(0).randint(2, 300, 24)]  # the window is 16
    ran = torch.from_numpy(llama_cpp_run.logits(out, ids))
    with torch.no_grad():
        reference = _load(model)(torch.tensor([ids])).logits[0].float()
    assert torch.nn.functional.cosine_similarity(ran, reference, dim=1).min() > 0.999


@pytest.mark.llama_cpp
@pytest.mark.slow
def test_an_o200k_tokenizer_goes_in_as_gpt_4o_and_llama_cpp_splits_as_it_does(tmp_path):
    """gpt-oss's tokenizer splits text with GPT-4o's (o200k) pattern: the file names it `gpt-4o`, and llama.cpp
    tokenizes text (case runs, contractions, digits, a slash after a newline) to the ids the tokenizer gives."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python (llama.cpp) reads the GGUF's tokenizer")
    import gguf
    import llama_cpp
    from tokenizers import Tokenizer
    from zoo import add_tokenizer

    model = add_tokenizer(gpt_oss_mxfp4(tmp_path / "gpt-oss"), 320, o200k=True)
    out = tmp_path / "oss.gguf"
    done = runner.invoke(app, ["compile", str(_gguf_recipe(tmp_path, model, out))])
    assert done.exit_code == 0, done.output
    field = gguf.GGUFReader(out).fields["tokenizer.ggml.pre"]
    assert bytes(field.parts[field.data[0]]).decode() == "gpt-4o"
    text = "The QuickBrown fox don't jump 12345 times;\n/lazy DOG's models\n\n  quantize   them."
    expected = Tokenizer.from_file(str(model / "tokenizer.json")).encode(text, add_special_tokens=False).ids
    llm = llama_cpp.Llama(model_path=str(out), vocab_only=True, verbose=False)
    try:
        assert llm.tokenize(text.encode(), add_bos=False, special=False) == expected
    finally:
        llm.close()
