"""The model zoo on the torch backend: tiny random models that transformers builds from a config (no
download), compiled W4A16 (offload) and W8A8_STATIC (low_memory), verified, and loaded back with transformers."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from compiling import assert_ran_the_plan, compile_program
from typer.testing import CliRunner
from zoo import (
    FAMILIES,
    FUSED_MOE,
    HOLDOUT_FUSED_MOE,
    HOLDOUT_MOE,
    MOE,
    PER_EXPERT_FUSED_MOE,
    VLM,
    build,
    build_all,
    transformers_cosines,
)

from compiler.cli import app
from compiler.data import verify_batches

pytestmark = pytest.mark.slow  # minutes of compiles: `pytest -m "not slow"` skips them

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

DENSE = [f for f in FAMILIES if f != "gpt2"]
SCHEMES = {"w4a16": "scheme s = W4A16 { group 32 }", "w8a8": "scheme s = W8A8_STATIC"}
PLAIN_SCHEME = "scheme s = W4A16 { group 16 }"  # divides every layer of the tiny zoo (DeepSeek's kv_b_proj: 16)
MODES = ("low_memory", "offload")
RECIPE = """recipe zoo {{
    model "{model}"
    backend torch
    {scheme}
    quantize {{ type Linear -> s }}
    calibrate {{ data synthetic {{ samples 8  seqlen 32 }}  chunk 4 }}
    memory {{ mode {mode}  disk "{disk}" }}
    verify {{ samples 4  metric cosine  at_least 0.5 }}
    emit "{out}"
}}
"""


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    root = tmp_path_factory.mktemp("zoo")
    return lambda family: build(family, root / family) if not (root / family).exists() else root / family


def _recipe(tmp_path, folder, scheme: str, mode: str = "offload") -> str:
    """The zoo recipe for `folder`; `scheme` is a key of SCHEMES or a scheme declaration."""
    path = tmp_path / "r.recipe"
    path.write_text(RECIPE.format(model=folder, scheme=SCHEMES.get(scheme, scheme), mode=mode, disk=tmp_path / "disk",
                                  out=tmp_path / "out"))
    return str(path)


# each scheme in one block-wise mode per family, the pairing alternating between families, so that every family
# runs both schemes and both modes and every scheme × mode pair runs on half the families (the full product
# doubled these compiles and no longer fit CI's 30 minutes beside llama.cpp's build)
PAIRS = {family: [("w4a16", MODES[i % 2]), ("w8a8", MODES[(i + 1) % 2])] for i, family in enumerate(DENSE)}


@pytest.mark.parametrize(("family", "scheme", "mode"), [(f, s, m) for f in DENSE for s, m in PAIRS[f]])
def test_family_compiles_verifies_and_loads(zoo, family, scheme, mode, tmp_path):
    """Each family in each scheme, and in each block-wise mode: verified, loaded by transformers (its weights are
    the ones qrc rounded: the SQNR qrc reports for a layer is the one the loaded weights give), and generating."""
    folder = zoo(family)
    result, planned = compile_program(_recipe(tmp_path, folder, scheme, mode), tmp_path / "out")
    assert result.verify_passed, result.verify
    assert_ran_the_plan(result, planned)
    config = transformers.CompressedTensorsConfig(dequantize=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"), quantization_config=config).eval()
    original = dict(transformers.AutoModelForCausalLM.from_pretrained(str(folder)).named_parameters())
    loaded = dict(model.named_parameters())
    for layer in [a.layer for a in planned.check.assignment.layers if not a.scheme.is_none][:3]:
        w, q = original[layer.weight].double(), loaded[layer.weight].double()
        sqnr = 10 * float(torch.log10(w.pow(2).sum() / (w - q).pow(2).sum()).detach())
        assert abs(sqnr - result.weight_sqnr[layer.name]) < 0.05, (layer.name, sqnr, result.weight_sqnr[layer.name])
    ids = torch.randint(0, 320, (1, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        generated = model.generate(ids, max_new_tokens=3, do_sample=False)
    assert generated.shape == (1, 9)
    if family.endswith("-tied") or model.config.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_bert_encoder_compiles_and_loads(zoo, scheme, mode, tmp_path):
    """A BERT encoder (token types, no LM head): verified on its hidden states, loaded with AutoModel; for
    weight-only W4A16 transformers measures the cosine qrc reported."""
    folder = zoo("bert")
    result, planned = compile_program(_recipe(tmp_path, folder, scheme, mode), tmp_path / "out")
    assert result.verify_passed, result.verify
    batches, _ = verify_batches(planned.check.ir.calibration.data, planned.check.assignment.model, 4, 4)
    cosines, _ = transformers_cosines(folder, tmp_path / "out", transformers.AutoModel, batches)
    if scheme == "w4a16":
        assert abs(result.verify["cosine"] - sum(cosines) / len(cosines)) < 2e-3, (result.verify, cosines)


def test_gpt2_conv1d_is_refused_at_check(zoo, tmp_path):
    """GPT-2's projections are transformers' Conv1D (weights stored [in, out]): refused by `qrc check`."""
    result = CliRunner().invoke(app, ["check", _recipe(tmp_path, zoo("gpt2"), "w4a16")])
    assert result.exit_code == 2 and "Q411" in result.output and "Conv1D" in result.output, result.output
    assert "Traceback" not in result.output


DATA_FREE_MOE = """recipe moe {{
    model "{model}"
    backend torch
    scheme w4 = W4A16 {{ group 32 }}
    quantize {{
        type Linear -> w4
        re".*\\.(mlp|block_sparse_moe)\\.gate" -> none
    }}
    memory {{ mode offload }}
    emit "{out}"
}}
"""


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    """Tiny Mixtral (per-expert w1/w2/w3 names), Qwen3-MoE and DeepSeek-V3 folders as transformers saves them."""
    return build_all(tmp_path_factory.mktemp("moe"), MOE)


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_moe_data_free_compiles_file_to_file_with_every_expert_quantized(moe, family, tmp_path):
    """Data-free W4A16 of an MoE folder runs file to file: every expert projection is in the output as packed
    int4 under the checkpoint's own names (what vLLM reads), equal to compressed-tensors' decompression."""
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32
    from safetensors import safe_open

    recipe = tmp_path / "r.recipe"
    recipe.write_text(DATA_FREE_MOE.format(model=moe / family, out=tmp_path / "out"))
    result, planned = compile_program(str(recipe), tmp_path / "out")
    assert_ran_the_plan(result, planned)
    assert "no model definition is built" in planned.plan.ops[0].summary
    source = safe_open(str(moe / family / "model.safetensors"), "pt")
    output = safe_open(str(tmp_path / "out" / "model.safetensors"), "pt")
    experts = [k.removesuffix(".weight") for k in source.keys() if ".experts." in k and k.endswith(".weight")]
    assert experts and all(f"{e}.weight_packed" in output.keys() for e in experts)
    routers = [k for k in source.keys() if k.endswith(".gate.weight")]
    assert routers and all(r in output.keys() for r in routers)  # kept in float
    for expert in experts:  # unpacked with compressed-tensors' own unpacker: close to the float weight
        shape = output.get_tensor(f"{expert}.weight_shape").tolist()
        q = unpack_from_int32(output.get_tensor(f"{expert}.weight_packed"), 4, torch.Size(shape)).float()
        scale = output.get_tensor(f"{expert}.weight_scale").float()
        dequantized = q * scale.repeat_interleave(q.shape[1] // scale.shape[1], dim=1)
        original = source.get_tensor(f"{expert}.weight").float()
        assert torch.nn.functional.cosine_similarity(dequantized.flatten(), original.flatten(), dim=0) > 0.98


def test_quantized_routers_are_warned(moe, tmp_path):
    recipe = tmp_path / "r.recipe"
    recipe.write_text(DATA_FREE_MOE.format(model=moe / "qwen3_moe", out=tmp_path / "out").replace(
        '        re".*\\.(mlp|block_sparse_moe)\\.gate" -> none\n', '        re".*\\.mlp\\.gate" -> w4\n'))
    result = CliRunner().invoke(app, ["check", str(recipe)])
    assert result.exit_code == 0 and "Q247" in result.output, result.output


RUN = """recipe run {{
    model "{model}"
    backend torch
    scheme s = {scheme}
    quantize {{
        type Linear -> s
{ignore}    }}
    calibrate {{ data synthetic {{ samples 8  seqlen 32 }}  chunk 4 }}
    memory {{ mode {mode} }}
    verify {{ samples 8  metric cosine  at_least 0.5 }}
    emit "{out}"
}}
"""
ROUTERS = '        re".*\\.(mlp|block_sparse_moe)\\.gate" -> none\n'
# data-driven on purpose: GPTQ's Hessians and static input ranges must reach every expert
RUNS = {"w4a16-gptq": "W4A16 { group 16  rounding gptq }", "w8a8-static": "W8A8_STATIC { activations int8 per_tensor static }"}


def _run(tmp_path, folder, run: str, ignore: str = "", mode: str = "offload"):
    scheme = RUNS[run]
    path = tmp_path / "r.recipe"
    path.write_text(RUN.format(model=folder, scheme=scheme, ignore=ignore, mode=mode, out=tmp_path / "out"))
    result, planned = compile_program(str(path), tmp_path / "out")
    assert result.verify_passed, result.verify
    assert_ran_the_plan(result, planned)
    return result, planned


def _independent_cosine(planned, float_folder, out_folder, auto) -> float:
    """The cosine transformers measures between the float folder and the emitted one, on qrc's own
    held-out samples (compressed-tensors dequantizes the weights)."""
    batches, _ = verify_batches(planned.check.ir.calibration.data, planned.check.assignment.model, 8, 4)
    cosines, quantized = transformers_cosines(float_folder, out_folder, auto, batches)
    ids = torch.randint(0, 300, (1, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert quantized.generate(input_ids=ids, max_new_tokens=3, do_sample=False).shape == (1, 9)
    return sum(cosines) / len(cosines)


def _output_keys(folder):
    from safetensors import safe_open

    return set(safe_open(str(folder / "model.safetensors"), "pt").keys())


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("run", list(RUNS))
@pytest.mark.parametrize("family", MOE)
def test_moe_calibrates_every_expert_and_agrees_with_transformers(moe, family, run, mode, tmp_path):
    """An MoE model runs block by block with its experts split per expert: calibration reaches every expert
    (no Q248), every expert projection is in the output, quantized, under the checkpoint's names, and qrc's
    cosine equals the one transformers measures on the emitted folder."""
    result, planned = _run(tmp_path, moe / family, run, ROUTERS, mode)
    assert not [w for w in result.warnings if w.code == "Q248"]
    source, output = _output_keys(moe / family), _output_keys(tmp_path / "out")
    experts = [k.removesuffix(".weight") for k in source if ".experts." in k and k.endswith(".weight")]
    stored = "weight_packed" if run.startswith("w4") else "weight_scale"
    assert experts and all(f"{e}.{stored}" in output for e in experts)
    if run.startswith("w8"):
        # transformers 5.23 cannot dequantize int8 (int-quantized) experts into its fused 3-D parameters
        # (its converter finds no tensors to concatenate); vLLM reads them per expert
        assert all(f"{e}.input_scale" in output for e in experts)
        return
    independent = _independent_cosine(planned, moe / family, tmp_path / "out", transformers.AutoModelForCausalLM)
    assert independent < 0.9999 and abs(result.verify["cosine"] - independent) < 2e-3, (result.verify, independent)


def test_a_blocks_experts_round_as_gptq_batches_with_the_integers_one_at_a_time_gives(moe, tmp_path, monkeypatch):
    """GPTQ rounds each block's same-shape experts as batches (its four experts' gate and up projections, one
    shape: a batch of eight; their down projections: four), and the folder is byte for byte the one rounding
    them one at a time writes."""
    from safetensors.numpy import load_file

    from compiler.backends.torch import rounding

    batches: list[int] = []
    batched = rounding.gptq_batched
    monkeypatch.setattr(rounding, "gptq_batched", lambda ws, *a, **k: batches.append(len(ws)) or batched(ws, *a, **k))
    for run in ("batched", "alone"):
        (tmp_path / run).mkdir()
    _run(tmp_path / "batched", moe / "qwen3_moe", "w4a16-gptq", ROUTERS)
    blocks = len({k.split(".mlp.")[0] for k in _output_keys(tmp_path / "batched" / "out") if ".experts." in k})
    assert batches == [8, 4] * blocks
    monkeypatch.setattr("compiler.plan.memory.EXPERT_BATCH_BYTES", 0)  # no batch fits: one at a time
    _run(tmp_path / "alone", moe / "qwen3_moe", "w4a16-gptq", ROUTERS)
    assert len(batches) == 2 * blocks
    together, alone = (load_file(tmp_path / run / "out" / "model.safetensors") for run in ("batched", "alone"))
    assert together.keys() == alone.keys()
    for name, tensor in together.items():
        np.testing.assert_array_equal(tensor, alone[name], err_msg=name)


def test_experts_all_shows_every_token_to_each_expert_and_multiplies_only_the_routed_ones():
    """With `experts all` each expert's projections see every token (their statistics hooks get all rows, the
    down projection included), while the down projection multiplies only the rows the router sent to the
    expert, and the block computes what transformers' fused experts compute either way."""
    import torch
    import transformers

    from compiler.backends.torch.experts import ExpertNames, Experts
    from compiler.ir.types import ExpertRouting

    config = transformers.Qwen3MoeConfig(hidden_size=32, moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2)
    torch.manual_seed(0)
    fused = transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeExperts(config)
    with torch.no_grad():
        for p in fused.parameters():
            p.normal_()
    experts = Experts(fused, ExpertNames("gate_proj", "up_proj", "down_proj")).to_empty(device="cpu")
    with torch.no_grad():
        for e, expert in enumerate(experts.children()):
            gate, up = fused.gate_up_proj[e].chunk(2)
            expert.gate_proj.weight.copy_(gate)
            expert.up_proj.weight.copy_(up)
            expert.down_proj.weight.copy_(fused.down_proj[e])
    tokens = torch.randn(24, 32)
    index = torch.stack([torch.arange(24) % 4, (torch.arange(24) + 1) % 4], dim=1)
    weights = torch.rand(24, 2)
    seen: dict[str, int] = {}
    multiplied: list[int] = []
    down = experts.get_submodule("2.down_proj")
    handles = [down.register_forward_pre_hook(lambda m, args: seen.__setitem__("down", args[0].shape[0])),
               experts.get_submodule("2.gate_proj").register_forward_pre_hook(
                   lambda m, args: seen.__setitem__("gate", args[0].shape[0]))]
    linear = torch.nn.functional.linear
    expected = fused(tokens, index, weights)
    routed = experts(tokens, index, weights)
    assert seen == {"down": 12, "gate": 12}  # routed: expert 2 is first or second choice of 12 tokens
    experts.routing = ExpertRouting.ALL
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.nn.functional, "linear", lambda x, *a: multiplied.append(x.shape[0]) or linear(x, *a))
        every = experts(tokens, index, weights)
    for handle in handles:
        handle.remove()
    assert seen == {"down": 24, "gate": 24}
    assert multiplied == [24, 24, 12] * 4  # gate and up of every token, down of the routed ones
    torch.testing.assert_close(routed, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(every, routed, rtol=1e-6, atol=1e-6)


def test_an_expert_no_token_reached_is_warned_and_rounded_data_free(moe, tmp_path):
    """`experts routed` with one two-token sample: most experts see nothing; one Q248 names them, they are
    rounded with rtn, and no scale is NaN."""
    from safetensors import safe_open

    path = tmp_path / "r.recipe"
    path.write_text(RUN.format(model=moe / "qwen3_moe", scheme=RUNS["w8a8-static"], ignore=ROUTERS,
                               mode="offload", out=tmp_path / "out")
                    .replace("samples 8  seqlen 32 }  chunk 4", "samples 1  seqlen 2 }  chunk 1  experts routed")
                    .replace("verify { samples 8", "verify { samples 1"))
    result, _ = compile_program(str(path), tmp_path / "out")
    warned = [w for w in result.warnings if w.code == "Q248"]
    assert len(warned) == 1 and "expert layers" in warned[0].message, result.warnings
    output = safe_open(str(tmp_path / "out" / "model.safetensors"), "pt")
    scales = [output.get_tensor(k) for k in output.keys() if k.endswith("_scale")]
    assert scales and all(torch.isfinite(s).all() and (s > 0).all() for s in scales)


@pytest.fixture(scope="module")
def vlms(tmp_path_factory):
    return build_all(tmp_path_factory.mktemp("vlm"), VLM)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("run", list(RUNS))
@pytest.mark.parametrize("family", VLM)
def test_vlm_quantizes_the_language_model_and_loads_as_image_text_to_text(vlms, family, run, mode, tmp_path):
    """`type Linear` quantizes the language model's Linears; the vision tower and projector stay float
    (byte for byte); the output loads with AutoModelForImageTextToText and generates, and for weight-only
    schemes transformers measures the cosine qrc reported."""
    from compiler import check_file

    result, planned = _run(tmp_path, vlms / family, run, mode=mode)
    index = planned.check.assignment.model
    towers = [x for x in index.layers if x.named_only]
    assert towers and not [a for a in planned.check.assignment.layers if a.layer.named_only and not a.scheme.is_none]
    source = safe_open_all(vlms / family)
    output = safe_open_all(tmp_path / "out")
    for layer in towers:
        assert torch.equal(source.get_tensor(layer.weight), output.get_tensor(layer.weight)), layer.name
    language = [a.layer for a in planned.check.assignment.layers if not a.scheme.is_none]
    stored = "weight_packed" if run.startswith("w4") else "weight_scale"
    assert language and all(f"{x.name}.{stored}" in output.keys() for x in language)
    independent = _independent_cosine(planned, vlms / family, tmp_path / "out",
                                      transformers.AutoModelForImageTextToText)
    if run.startswith("w4"):  # transformers' dequantize leaves static inputs in float: weight-only schemes agree
        assert independent < 0.9999 and abs(result.verify["cosine"] - independent) < 2e-3, (result.verify, independent)
    # a name rule selects the tower (data-free rounding: calibration feeds the language model only)
    tower_rule = tmp_path / "tower.recipe"
    tower_rule.write_text((tmp_path / "r.recipe").read_text().replace(
        "type Linear -> s\n", f'type Linear -> s\n        re"{towers[-1].name}" -> W8A16\n'))
    checked = check_file(tower_rule, with_model=True)
    assert checked.ok and any(a.layer.named_only and not a.scheme.is_none for a in checked.assignment.layers)


def safe_open_all(folder):
    from safetensors import safe_open

    return safe_open(str(folder / "model.safetensors"), "pt")


def test_a_router_the_running_model_cannot_round_is_refused_before_work(moe, tmp_path):
    """transformers 5's routers are not nn.Linear modules: a name rule that quantizes them on a run that
    calibrates is Q411 at the start of compile, with nothing written."""
    path = tmp_path / "r.recipe"
    path.write_text(RUN.format(model=moe / "qwen3_moe", scheme=RUNS["w4a16-gptq"], ignore='        re".*\\.mlp\\.gate" -> s\n',
                               mode="offload", out=tmp_path / "out"))
    result = CliRunner().invoke(app, ["compile", str(path)])
    assert result.exit_code == 2 and "Q411" in result.output and "not an nn.Linear" in result.output, result.output
    assert f"--> {path}" in " ".join(result.output.split()), result.output  # at the rule that chose the router
    assert "Traceback" not in result.output and not (tmp_path / "out").exists()


def test_a_tied_head_is_one_tensor_selectable_by_name(zoo, tmp_path):
    """A tied LM head is a layer of the index (`lm_head`, reading the embedding's tensor) that `type Linear`
    leaves tied and float; a rule naming it quantizes it, and the output unties it: the embedding stays
    byte for byte, the head has quantized tensors of its own, and transformers loads both."""
    import json

    folder = zoo("llama-tied")
    _, planned = _run(tmp_path, folder, "w4a16-gptq")
    head = next(a for a in planned.check.assignment.layers if a.layer.name == "lm_head")
    assert head.layer.named_only and head.scheme.is_none and head.layer.weight == "model.embed_tokens.weight"
    named = tmp_path / "named"
    named.mkdir()
    text = (tmp_path / "r.recipe").read_text().replace("type Linear -> s\n", 'type Linear -> s\n        "lm_head" -> s\n')
    (named / "r.recipe").write_text(text.replace(str(tmp_path / "out"), str(named / "out")))
    result, _ = compile_program(str(named / "r.recipe"), named / "out")
    assert result.verify_passed
    assert json.loads((named / "out" / "config.json").read_text())["tie_word_embeddings"] is False
    assert "lm_head.weight_packed" in _output_keys(named / "out")
    quantized = transformers.AutoModelForCausalLM.from_pretrained(
        str(named / "out"), quantization_config=transformers.CompressedTensorsConfig(dequantize=True)).eval()
    original = transformers.AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    assert torch.equal(quantized.model.embed_tokens.weight, original.model.embed_tokens.weight)
    assert quantized.lm_head.weight.data_ptr() != quantized.model.embed_tokens.weight.data_ptr()
    error = (quantized.lm_head.weight - original.model.embed_tokens.weight).abs()
    assert 0 < float(error.max()) < 0.05


def test_group_auto_gives_each_experts_gate_and_up_one_scheme(moe, tmp_path):
    """`group auto` aligns q/k/v and every MLP's and expert's gate/up pair (Mixtral's w1/w3): a rule that
    widens one expert's w3 promotes its w1 (Q211), and leaves the other experts alone."""
    from compiler import check_file

    recipe = tmp_path / "r.recipe"
    recipe.write_text(DATA_FREE_MOE.format(model=moe / "mixtral", out=tmp_path / "out").replace(
        "    }\n    memory", '        re".*experts\\.1\\.w3" -> W8A16\n    }\n    group auto\n    memory'))
    checked = check_file(recipe, with_model=True)
    assert checked.ok, checked.diagnostics
    schemes = {a.layer.name: a.scheme.name for a in checked.assignment.layers}
    assert schemes["model.layers.0.block_sparse_moe.experts.1.w1"] == "W8A16"
    assert schemes["model.layers.0.block_sparse_moe.experts.0.w1"] == "w4"
    assert any(d.code == "Q211" for d in checked.diagnostics)


TASK = {"bert": "AutoModel", **{f: "AutoModelForImageTextToText" for f in VLM}}


def _loaded(auto, folder):
    model, info = auto.from_pretrained(str(folder), output_loading_info=True)
    return model.eval(), info


def _unexpected_modules(info) -> set[str]:
    return {k.rsplit(".", 1)[0] for k in info["unexpected_keys"]}


@pytest.mark.parametrize("family", [*DENSE, "bert", *VLM, *MOE, *FUSED_MOE, *PER_EXPERT_FUSED_MOE])
def test_plain_type_linear_folder_loads_in_the_task_class_and_the_base_class(family, tmp_path):
    """The recipe people write (`type Linear -> W4A16`; group 16 divides every layer of the tiny zoo) on every
    zoo family (dense, tied, BERT, VLM, MoE; routers stay float): transformers loads the folder with
    its task class and with AutoModel (the base class embedding users load, which drops the `model.` prefix)
    with no key missing and none unexpected but the head's (a base class has no head: the float folder's
    head is unexpected there too); the task class's cosine against float on qrc's held-out samples agrees
    with qrc's verify within 0.03, and the base class computes the task class's hidden states."""
    folder = build(family, tmp_path / family)
    result, planned = compile_program(_recipe(tmp_path, folder, PLAIN_SCHEME, "full"), tmp_path / "out")
    assert result.verify_passed, result.verify
    fused_warned = [d for d in planned.check.diagnostics if d.code == "Q266"]
    assert bool(fused_warned) == (family in FUSED_MOE), planned.check.diagnostics  # fused experts stay float, said
    task = getattr(transformers, TASK.get(family, "AutoModelForCausalLM"))
    for auto in (task, transformers.AutoModel):
        quantized, info = _loaded(auto, tmp_path / "out")
        _, float_info = _loaded(auto, folder)
        assert not info["missing_keys"] and not info["mismatched_keys"], (auto.__name__, info)
        assert _unexpected_modules(info) <= _unexpected_modules(float_info), (auto.__name__, info)
    batches, _ = verify_batches(planned.check.ir.calibration.data, planned.check.assignment.model, 4, 4)
    cosines, loaded = transformers_cosines(folder, tmp_path / "out", task, batches)
    # verify runs the emitted folder as transformers does: the same figure, not merely a close one
    assert abs(sum(cosines) / len(cosines) - result.verify["cosine"]) < 1e-3, (cosines, result.verify)
    if task is not transformers.AutoModel:
        base, _ = _loaded(transformers.AutoModel, tmp_path / "out")
        feed = {k: torch.from_numpy(v) for k, v in next(iter(batches)).items()}
        with torch.no_grad():
            hidden = loaded.model(**feed)[0]
            assert torch.allclose(base(**feed)[0], hidden, atol=1e-5), family


def test_mixed_schemes_name_layers_so_both_classes_load_a_vlm(tmp_path):
    """Two schemes (names, not the `Linear` class): a LLaVA folder still loads in the task and base class with
    nothing missing, and its targets also match the checkpoint's names (what vLLM's VLMs keep)."""
    import json
    import re

    folder = build("llava", tmp_path / "llava")
    path = Path(_recipe(tmp_path, folder, PLAIN_SCHEME, "full"))
    path.write_text(path.read_text().replace("type Linear -> s }", 'type Linear -> s\n        "*.mlp.down_proj" -> W8A16 }'))
    result, _ = compile_program(str(path), tmp_path / "out")
    assert result.verify_passed
    groups = json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]["config_groups"]
    assert len(groups) == 2
    targets = [t for g in groups.values() for t in g["targets"]]
    for name in ("language_model.model.layers.0.mlp.down_proj", "model.language_model.layers.0.mlp.down_proj",
                 "language_model.layers.0.mlp.down_proj"):
        assert any(re.match(t.removeprefix("re:"), name) for t in targets), name
    for auto in (transformers.AutoModelForImageTextToText, transformers.AutoModel):
        _, info = _loaded(auto, tmp_path / "out")
        assert not info["missing_keys"], (auto.__name__, info)


@pytest.mark.parametrize("damage", ["missing", "reshaped"])
def test_an_moe_checkpoint_missing_an_expert_or_with_a_wrong_shaped_one_is_refused_at_check(moe, damage, tmp_path):
    """A Mixtral folder without one expert's w2, or with it transposed: data-free rounding would write it through
    file to file with exit 0. `qrc check` refuses it (Q252, exit 2) naming the tensor."""
    import shutil

    from safetensors.torch import load_file, save_file

    folder = tmp_path / "mixtral"
    shutil.copytree(moe / "mixtral", folder)
    tensors = load_file(str(folder / "model.safetensors"))
    name = "model.layers.1.block_sparse_moe.experts.2.w2.weight"
    if damage == "missing":
        del tensors[name]
    else:
        tensors[name] = tensors[name].t().contiguous()
    save_file(tensors, str(folder / "model.safetensors"))
    recipe = tmp_path / "r.recipe"
    recipe.write_text(DATA_FREE_MOE.format(model=folder, out=tmp_path / "out"))
    result = CliRunner().invoke(app, ["compile", str(recipe)])
    assert result.exit_code == 2 and "Q252" in result.output and "experts.2.w2" in result.output, result.output
    assert "Traceback" not in result.output and not (tmp_path / "out").exists()


def test_a_folder_transformers_would_open_with_missing_weights_is_q426_and_nothing_is_written(tmp_path, monkeypatch):
    """The load check runs transformers' own loader on the staged folder (meta device, task and base class):
    with the config naming LLaVA's layers by checkpoint paths (what qrc wrote before, which transformers 5 does
    not match), the compile stops with Q426 naming the keys, instead of a folder that loads with random weights
    while verify passes."""
    from compiler.backends.torch import loader_names, output_layout

    def checkpoint_paths(model, quantized, floating, groups, layers, provisional=False):
        return loader_names.LoaderNames({name: name for name in quantized}, tuple(floating))
    monkeypatch.setattr(output_layout, "loader_names", checkpoint_paths)
    folder = build("llava", tmp_path / "llava")
    result = CliRunner().invoke(app, ["compile", _recipe(tmp_path, folder, PLAIN_SCHEME, "full")])
    assert result.exit_code == 2 and "Q426" in result.output and "missing" in result.output, result.output
    assert "Traceback" not in result.output and not (tmp_path / "out").exists()


@pytest.mark.parametrize("check_process", ["started", "unstartable", "died", "hung", "imported here"])
def test_a_data_free_folder_with_missing_weights_is_q426_from_the_check_beside_the_rounding(tmp_path, monkeypatch,
                                                                                              check_process):
    """File to file, the load check runs in a process of its own while the weights round (torch/early_check.py,
    check_process.py), or, where that process cannot start, dies or gives no answer in time, or where this process
    has imported transformers and compressed-tensors already (as the tests have), in the compile's: what it finds
    is raised where the compile would have raised it, and nothing is written."""
    from compiler.backends.torch import check_process as process
    from compiler.backends.torch import early_check, loader_names, output_layout

    if check_process == "imported here":  # as a notebook that loaded a model has, whatever the tests ran before
        pytest.importorskip("compressed_tensors")
        pytest.importorskip("transformers")
    else:  # a `qrc` process, which has imported neither when it starts the child
        monkeypatch.setattr(process, "imported_here", lambda: False)
    if check_process == "unstartable":
        monkeypatch.setattr(process, "WORKER", (str(tmp_path / "no-such-python"),))
    elif check_process == "died":
        monkeypatch.setattr(process, "WORKER", (sys.executable, "-c", "raise SystemExit(3)"))
    elif check_process == "hung":  # a child that never answers: the run ends it after ANSWER_SECONDS
        monkeypatch.setattr(process, "WORKER", (sys.executable, "-c", "import os, sys, time; open(sys.argv[1], 'w')"
                                                ".write(str(os.getpid())); time.sleep(600)", str(tmp_path / "pid")))
        monkeypatch.setattr(process, "ANSWER_SECONDS", 2.0)
        rescue = _rescue_after(120.0, tmp_path / "pid")  # the test's own watchdog, if the run waited on

    def checkpoint_paths(model, quantized, floating, groups, layers, provisional=False):
        return loader_names.LoaderNames({name: name for name in quantized}, tuple(floating))
    monkeypatch.setattr(output_layout, "loader_names", checkpoint_paths)
    started = []
    monkeypatch.setattr(early_check.EarlyCheck, "__init__", _recorded(early_check.EarlyCheck.__init__, started))
    folder = build("llava", tmp_path / "llava")
    recipe = tmp_path / "r.recipe"
    recipe.write_text(f'recipe r {{ model "{folder}"  backend torch  {PLAIN_SCHEME}\n'
                      f'  quantize {{ type Linear -> s  "*lm_head" -> none }}  emit "{tmp_path / "out"}" }}')
    result = CliRunner().invoke(app, ["compile", str(recipe)])
    assert started, result.output
    assert result.exit_code == 2 and "Q426" in result.output and "missing" in result.output, result.output
    assert "Traceback" not in result.output and not (tmp_path / "out").exists()
    child = started[0][-1]._child  # EarlyCheck's process: a child was started, or (imported here) none
    assert (child is None) == (check_process in ("imported here", "unstartable")), child
    if check_process == "hung":
        rescue.cancel()
        assert not rescue.killed, "the run waited on a check process that never answered"


class _Rescue(threading.Timer):
    killed = False


def _rescue_after(seconds: float, pid_file: Path) -> _Rescue:
    """Kills the process whose id `pid_file` holds after `seconds`, and records that it had to."""
    def kill() -> None:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
            rescue.killed = True
    rescue = _Rescue(seconds, kill)
    rescue.daemon = True
    rescue.start()
    return rescue


def _recorded(init, calls: list):
    def recording(self, *args, **kwargs):
        calls.append(args)
        init(self, *args, **kwargs)
    return recording


@pytest.mark.parametrize("mode", ["full", "offload"])
def test_verify_measures_the_emitted_folder_not_qrcs_model(mode, tmp_path, monkeypatch):
    """Bytes written wrong while qrc's own rounded model is right (one layer's scales written ×4): verify
    measures the folder as transformers loads it, so the gate fails (Q501) and says what it measured; the
    same compile without the fault passes, and its figure is transformers' own (default load, activations
    quantized by compressed-tensors) on the same samples."""
    from compiler.backends.torch import rounding

    folder = build("llama", tmp_path / "llama")
    recipe = Path(_recipe(tmp_path, folder, "scheme s = W8A8_STATIC", mode))
    recipe.write_text(recipe.read_text().replace("at_least 0.5", "at_least 0.99"))
    result, planned = compile_program(str(recipe), tmp_path / "out")
    assert result.verify_passed and "emitted folder" in result.verified_on, result.verified_on
    batches, _ = verify_batches(planned.check.ir.calibration.data, planned.check.assignment.model, 4, 4)
    cosines, _ = transformers_cosines(folder, tmp_path / "out", transformers.AutoModelForCausalLM, batches,
                                      dequantize=False)
    assert abs(sum(cosines) / len(cosines) - result.verify["cosine"]) < 1e-4, (cosines, result.verify)

    real = rounding.layer_tensors

    def wrong_scales(layer, scheme, q, act, dtype):
        tensors = real(layer, scheme, q, act, dtype)
        if layer.name == "model.layers.0.mlp.down_proj":
            tensors = {k: v * 4 if k.endswith("weight_scale") else v for k, v in tensors.items()}
        return tensors
    monkeypatch.setattr(rounding, "layer_tensors", wrong_scales)
    out = tmp_path / "bad"
    result = CliRunner().invoke(app, ["compile", str(recipe), "-o", str(out)])
    assert result.exit_code == 2 and "Q501" in result.output, result.output
    assert "emitted folder" in (tmp_path / "bad.verify.json").read_text()


def test_a_folder_transformers_cannot_open_is_verified_and_says_how(moe, tmp_path):
    """transformers 5.24 cannot fuse int8 experts back into its 3-D parameters, so it does not open a W8A8_STATIC
    Mixtral folder (Q427; vLLM reads it per expert). Verification still decodes the folder's own tensors with
    compressed-tensors, layer by layer, and says that is what it measured rather than claiming a transformers
    load."""
    path = tmp_path / "r.recipe"
    path.write_text(RUN.format(model=moe / "mixtral", scheme="W8A8_STATIC", ignore="", mode="low_memory",
                               out=tmp_path / "out"))
    result, planned = compile_program(str(path), tmp_path / "out")
    assert result.verify_passed and "Q427" in {w.code for w in result.warnings}, result.warnings
    assert "decoded layer by layer" in result.verified_on, result.verified_on


@pytest.mark.parametrize("family", [*HOLDOUT_MOE, *HOLDOUT_FUSED_MOE, *PER_EXPERT_FUSED_MOE])
def test_holdout_moe_families_compile_with_gptq_and_load_in_transformers(family, tmp_path):
    """MoE families no other test was written for (issue 68), with `type Linear -> W4A16` and GPTQ on data:
    from a per-expert checkpoint every routed expert of every block is quantized in the folder (counted against
    the checkpoint's expert tensors), routers of every kind left float; from a fused one that transformers
    opens per expert (Llama 4) every expert's gate, up and down projection is quantized under
    `experts.{e}.…` (counted against the fused tensors' first axis); from any other fused one (GraniteMoE,
    gpt-oss) Q266 says the experts stay float. Either way transformers loads the folder with no key missing,
    mismatched or unexpected, and qrc's verify is the cosine transformers measures on it, within 1e-3."""
    folder = build(family, tmp_path / family)
    result, planned = _run(tmp_path, folder, "w4a16-gptq", mode="low_memory")
    warned = {d.code for d in planned.check.diagnostics}
    source, output = _output_keys(folder), _output_keys(tmp_path / "out")
    experts = [k.removesuffix(".weight") for k in source if ".experts." in k and k.endswith(".weight")]
    if family in PER_EXPERT_FUSED_MOE:
        experts = [f"{k.removesuffix('gate_up_proj')}{e}.{leaf}" for k in source if k.endswith(".experts.gate_up_proj")
                   for e in range(_shape(folder, k)[0]) for leaf in ("gate_proj", "up_proj", "down_proj")]
    packed = [k for k in output if ".experts." in k and k.endswith(".weight_packed")]
    if family in HOLDOUT_FUSED_MOE:
        assert "Q266" in warned and not packed, warned
    else:
        assert experts and len(packed) == len(experts) and all(f"{e}.weight_packed" in output for e in experts)
        assert "Q266" not in warned and not any(k.endswith(("gate_up_proj", "experts.down_proj")) for k in output)
    loaded, info = _loaded(transformers.AutoModelForCausalLM, tmp_path / "out")
    assert not info["missing_keys"] and not info["mismatched_keys"] and not info["unexpected_keys"], info
    batches, _ = verify_batches(planned.check.ir.calibration.data, planned.check.assignment.model, 8, 4)
    cosines, _ = transformers_cosines(folder, tmp_path / "out", transformers.AutoModelForCausalLM, batches)
    assert abs(sum(cosines) / len(cosines) - result.verify["cosine"]) < 1e-3, (cosines, result.verify)


def _shape(folder, key: str) -> tuple[int, ...]:
    from safetensors import safe_open

    return tuple(safe_open(str(folder / "model.safetensors"), "pt").get_slice(key).get_shape())


def test_experts_stored_fused_are_written_per_expert_as_their_slices_of_the_fused_tensors(tmp_path):
    """Llama 4's experts, stored fused ([E, in, 2·inner] gate/up, [E, inner, out] down), left float by a rule: the
    folder holds each expert's projections as nn.Linear stores them, equal bit for bit to their slices of the
    fused tensors (gate the first half), and transformers opens it with one Linear per expert, no key missing or
    unexpected, computing close to what the float model computes."""
    from safetensors.torch import load_file

    folder = build("llama4_text", tmp_path / "llama4_text")
    recipe = tmp_path / "r.recipe"
    recipe.write_text(f'recipe fused {{\n model "{folder}"\n backend torch\n scheme s = W4A16 {{ group 16 }}\n'
                      '  quantize { type Linear -> s  re".*\\.experts\\..*" -> none }\n'
                      f'  emit "{tmp_path / "out"}"\n}}\n')
    compiled = CliRunner().invoke(app, ["compile", str(recipe)])
    assert compiled.exit_code == 0, compiled.output
    source, out = load_file(str(folder / "model.safetensors")), load_file(str(tmp_path / "out" / "model.safetensors"))
    fused = [k for k in source if k.endswith(".experts.gate_up_proj")]
    assert fused
    for key in fused:
        base, gate_up, down = key.removesuffix("gate_up_proj"), source[key], source[key.replace("gate_up", "down")]
        inner = gate_up.shape[2] // 2
        for e in range(gate_up.shape[0]):
            assert torch.equal(out[f"{base}{e}.gate_proj.weight"], gate_up[e, :, :inner].t())
            assert torch.equal(out[f"{base}{e}.up_proj.weight"], gate_up[e, :, inner:].t())
            assert torch.equal(out[f"{base}{e}.down_proj.weight"], down[e].t())
        assert key not in out
    loaded, info = _loaded(transformers.AutoModelForCausalLM, tmp_path / "out")
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert type(loaded.model.layers[0].feed_forward.experts).__name__ == "SequentialLlama4TextExperts"
    reference = transformers.AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    ids = torch.randint(2, 300, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference_logits, logits = reference(ids).logits, loaded(ids).logits
    # attention and the shared expert are int4 (0.989 here); experts loaded wrong would be far from it
    assert torch.nn.functional.cosine_similarity(reference_logits.flatten(), logits.flatten(), dim=0) > 0.95


def test_an_expert_its_router_never_chooses_is_warned_and_rounded_data_free_not_zeroed(tmp_path):
    """Llama 4 sends every token through every expert, scaled by the router's score (0 where not chosen): an
    expert the router never chooses sees only zero rows. GPTQ's Hessian of zeros would zero its weights (dead
    columns); qrc counts routed rows only, so Q248 names the expert and it is rounded with rtn, its scales
    those of its real weights."""
    from safetensors.torch import load_file, save_file

    folder = build("llama4_text", tmp_path / "llama4_text")
    weights = load_file(str(folder / "model.safetensors"))
    for key in [k for k in weights if k.endswith("router.weight")]:
        router = weights[key].clone()
        router[1], router[3] = -router[0], 0.0  # top-1 over logits (u·h, -u·h, ·, 0): expert 3 never wins
        weights[key] = router
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    result, planned = _run(tmp_path, folder, "w4a16-gptq", mode="low_memory")
    unseen = [w for w in result.warnings if w.code == "Q248"]
    assert unseen and "experts.3." in unseen[0].message and "experts.0." not in unseen[0].message, result.warnings
    out = load_file(str(tmp_path / "out" / "model.safetensors"))
    for block in (0, 1):
        scale = out[f"model.layers.{block}.feed_forward.experts.3.gate_proj.weight_scale"]
        assert scale.abs().min() > 0 and out[f"model.layers.{block}.feed_forward.experts.3.gate_proj.weight_packed"].any()


def test_a_fused_expert_tensor_of_another_layout_is_refused_at_check(tmp_path):
    """A Llama 4 checkpoint whose fused gate/up tensor cannot be split into a gate and an up half (an odd last
    axis) is refused by `qrc check` (Q411) before any work, and `compile` writes nothing: a folder keeping it
    fused would not load."""
    from safetensors.torch import load_file, save_file

    folder = build("llama4_text", tmp_path / "llama4_text")
    weights = load_file(str(folder / "model.safetensors"))
    key = next(k for k in weights if k.endswith(".experts.gate_up_proj"))
    weights[key] = weights[key][:, :, :-1].contiguous()
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    recipe = _recipe(tmp_path, folder, PLAIN_SCHEME, "full")
    checked = CliRunner().invoke(app, ["check", recipe])
    assert checked.exit_code == 2 and "Q411" in checked.output and "per expert" in checked.output, checked.output
    compiled = CliRunner().invoke(app, ["compile", recipe, "-o", str(tmp_path / "out")])
    assert compiled.exit_code == 2 and "Q411" in compiled.output and not (tmp_path / "out").exists()


def test_a_model_class_that_fails_to_run_is_q452_and_nothing_is_written(tmp_path, monkeypatch):
    """transformers 5.24's Llama4ForConditionalGeneration fails on text-only samples (it reads `image_outputs`
    from its language model's output). A model class that raises on the data stops the compile with Q452, the
    class and its error at the recipe's `model` line, not a traceback; nothing is written."""
    folder = build("llama", tmp_path / "llama")

    def broken(self, *args, **kwargs):
        raise AttributeError("'CausalLMOutputWithPast' object has no attribute 'image_outputs'")
    monkeypatch.setattr(transformers.LlamaForCausalLM, "forward", broken)
    compiled = CliRunner().invoke(app, ["compile", _recipe(tmp_path, folder, PLAIN_SCHEME, "low_memory"),
                                        "-o", str(tmp_path / "out")])
    assert compiled.exit_code == 2 and "error[Q452]" in compiled.output, compiled.output
    assert "LlamaForCausalLM" in compiled.output and "image_outputs" in compiled.output and "r.recipe:2" in compiled.output
    assert not (tmp_path / "out").exists()
