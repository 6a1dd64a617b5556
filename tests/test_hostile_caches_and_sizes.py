"""Hostile caches, states and sizes: built-in sizes, FP8 scale shapes, a tampered export cache, resume state out of range,
hostile configs beside models, a full disk under the torch block cache, npz arrays of different lengths, and a
Markdown link in a layer name. Each is a coded diagnostic (or a correct result), never a traceback."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from typer.testing import CliRunner

from compiler.cli import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]


def _no_traceback(result) -> None:
    assert "Traceback" not in result.output, result.output


# ---- built-in sizes ------------------------------------------------------------------------------------
@pytest.mark.parametrize("query", ["layers=100000000", "hidden=1000000", "seed=100000000000000000000000",
                                   "vocab=99999999999999", "layers=4000&hidden=1024"])
def test_builtin_sizes_beyond_a_test_model_are_q251(query):
    """Built-ins are generated in memory: sizes that would take gigabytes (or a seed numpy cannot take) are
    Q251 at once, not a MemoryError after minutes."""
    result = runner.invoke(app, ["inspect", f"builtin:tiny-llama?{query}"])
    assert result.exit_code == 2 and "Q251" in result.output, result.output
    _no_traceback(result)


# ---- FP8 source scales ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fp8_source(tmp_path_factory):
    from test_float_formats import _fp8_source
    from zoo import build

    root = tmp_path_factory.mktemp("fp8")
    return _fp8_source(build("llama", root / "float"), root)["fp8"]


@pytest.mark.parametrize(("case", "value"), [("block", [7, 7]), ("block", [10**12, 10**12]), ("block", [0, 0]),
                                             ("block", "x"), ("block", [32, 32, 32]), ("scale", "1-D"),
                                             ("scale", "1x1")])
def test_fp8_block_sizes_and_scale_shapes_that_do_not_tile_are_q252(fp8_source, case, value, tmp_path):
    """An FP8 source whose `weight_block_size` is odd, huge, zero, not a pair, or whose `weight_scale_inv` is
    1-D or a single value: Q252 at `qrc check`, naming the tensor."""
    from safetensors.torch import load_file, save_file
    from test_float_formats import FP8_SOURCE_RECIPE

    folder = tmp_path / "fp8"
    shutil.copytree(fp8_source, folder)
    if case == "block":
        config = json.loads((folder / "config.json").read_text())
        config["quantization_config"]["weight_block_size"] = value
        (folder / "config.json").write_text(json.dumps(config))
    else:
        tensors = load_file(str(folder / "model.safetensors"))
        name = "model.layers.0.mlp.down_proj.weight_scale_inv"
        tensors[name] = tensors[name].reshape(-1) if value == "1-D" else tensors[name][:1, :1].contiguous()
        save_file(tensors, str(folder / "model.safetensors"))
    recipe = tmp_path / "r.recipe"
    recipe.write_text(FP8_SOURCE_RECIPE.format(model=folder, mode="low_memory", out=tmp_path / "out"))
    result = runner.invoke(app, ["check", str(recipe)])
    assert result.exit_code == 2 and "Q252" in result.output and "weight_scale_inv" in result.output, result.output
    _no_traceback(result)


# ---- hostile configs -----------------------------------------------------------------------------------
@pytest.fixture(scope="session")  # the export fixture below is session-wide, and depends on it
def zoo_folders(tmp_path_factory):
    from zoo import build

    root = tmp_path_factory.mktemp("zoo3")
    return {family: build(family, root / family) for family in ("llama", "mixtral", "llava")}


CONFIGS = {
    "experts per token above the experts": ("mixtral", lambda c: c.update(num_experts_per_tok=99), "num_experts_per_tok"),
    "no expert per token": ("mixtral", lambda c: c.update(num_experts_per_tok=0), "num_experts_per_tok"),
    "vision hidden size 0": ("llava", lambda c: c["vision_config"].update(hidden_size=0), "vision_config.hidden_size"),
    "heads null": ("llama", lambda c: c.update(num_attention_heads=None), "llama"),
    "no hidden size": ("llama", lambda c: c.pop("hidden_size"), "hidden_size"),
}


@pytest.mark.parametrize("case", list(CONFIGS))
def test_hostile_configs_are_q250_at_check(zoo_folders, case, tmp_path):
    family, mutate, named = CONFIGS[case]
    folder = tmp_path / family
    shutil.copytree(zoo_folders[family], folder)
    config = json.loads((folder / "config.json").read_text())
    mutate(config)
    (folder / "config.json").write_text(json.dumps(config))
    recipe = tmp_path / "r.recipe"
    recipe.write_text(f'recipe r {{\n model "{folder}"\n backend torch\n scheme s = W4A16 {{ group 16 }}\n'
                      f' quantize {{ type Linear -> s }}\n verify {{ samples 2  metric cosine  at_least 0 }}\n'
                      f' emit "{tmp_path / "out"}"\n}}\n')
    result = runner.invoke(app, ["check", str(recipe)])
    assert result.exit_code == 2 and "Q250" in result.output and named in result.output, result.output
    _no_traceback(result)


def test_a_config_nested_100000_deep_is_q250(zoo_folders, tmp_path):
    folder = tmp_path / "deep"
    shutil.copytree(zoo_folders["llama"], folder)
    (folder / "config.json").write_text('{"model_type": "llama", "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    result = runner.invoke(app, ["inspect", str(folder)])
    assert result.exit_code == 2 and "Q250" in result.output and "nests deeper" in result.output, result.output


# ---- the export cache ------------------------------------------------------------------------------------
def _compile_in_child(recipe: Path, cache: Path, out: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, QRC_CACHE=str(cache), COLUMNS="200")
    elsewhere = ["-o", str(out)] if out is not None else []  # the recipe unchanged: its digest is in the model
    return subprocess.run([sys.executable, "-m", "compiler", "compile", str(recipe), *elsewhere], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def _written(onnx_file: Path) -> bytes:
    """The weights an ONNX compile wrote: the external data file, or the model file where there is none."""
    data = onnx_file.with_name(onnx_file.name + ".data")
    return (data if data.exists() else onnx_file).read_bytes()


@pytest.fixture(scope="session")
def llama_on_onnx(zoo_folders, tmp_path_factory) -> SimpleNamespace:
    """The zoo's tiny Llama, with a tokenizer, compiled W8A16 on ONNX in a child with a cache of its own: the
    folder, the recipe, its output, the cache (holding the export) and the weights written. Session-wide, so each
    xdist worker exports once: as a module fixture it was made again each time a worker was handed this module's
    tests anew (three exports in one run, 47 s). The tokenizer makes the export onnxruntime-genai's builder's
    (export_builder.py), 8 s here where torch.onnx's dynamo exporter takes 20 s: the cache's checks are the same
    for either exporter's entry, and the dynamo export has tests of its own (test_onnx_decoders.py)."""
    from zoo import add_tokenizer

    root = tmp_path_factory.mktemp("decoder")
    folder = add_tokenizer(Path(shutil.copytree(zoo_folders["llama"], root / "llama")), 320)
    recipe, out = root / "r.recipe", root / "out.onnx"
    recipe.write_text(f'recipe r {{\n model "{folder}"\n backend onnx\n quantize {{ type Linear -> W8A16 }}\n'
                      f' emit "{out}"\n}}\n')
    done = _compile_in_child(recipe, root / "cache")
    assert done.returncode == 0, done.stdout + done.stderr
    return SimpleNamespace(folder=folder, recipe=recipe, out=out, cache=root / "cache", written=_written(out))


@pytest.mark.slow
@pytest.mark.parametrize("case", ["empty graph", "truncated data", "data linked elsewhere", "swapped"])
def test_a_tampered_or_swapped_export_cache_entry_is_made_again(llama_on_onnx, case, tmp_path):
    """The cached export of an HF folder is reused only when it is intact and the folder's own: an empty graph,
    truncated data, data linked elsewhere, or the entry of another model (same layer names, other weights) is
    removed and exported again; the compile succeeds and writes the same model as with a fresh export. (A graph
    cut short fails the same digest as an empty one.)"""
    import torch
    import transformers
    from zoo import add_tokenizer, configs

    cache = tmp_path / "cache"
    shutil.copytree(llama_on_onnx.cache, cache, symlinks=True)
    entry = next((cache / "exported").iterdir())
    graph, data = entry / "model.onnx", entry / "model.onnx.data"
    if case == "empty graph":
        graph.write_bytes(b"")
    elif case == "truncated data":
        data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    elif case == "data linked elsewhere":
        shutil.move(data, tmp_path / "elsewhere")
        data.symlink_to(tmp_path / "elsewhere")
    else:  # another model's entry under this folder's key
        config, cls = configs(transformers)["llama"]
        torch.manual_seed(1)
        other = tmp_path / "other"
        cls(config).eval().save_pretrained(other)
        add_tokenizer(other, 320)  # exported as this folder's entry was (by the builder)
        other_recipe = tmp_path / "other.recipe"
        other_recipe.write_text(llama_on_onnx.recipe.read_text().replace(str(llama_on_onnx.folder), str(other)))
        assert _compile_in_child(other_recipe, cache, tmp_path / "other.onnx").returncode == 0
        theirs = next(e for e in (cache / "exported").iterdir() if e != entry)
        for path in theirs.iterdir():
            shutil.copyfile(path, entry / path.name)
    done = _compile_in_child(llama_on_onnx.recipe, cache, tmp_path / "out.onnx")
    assert done.returncode == 0 and "Traceback" not in done.stdout + done.stderr, (done.stdout, done.stderr)
    assert _written(tmp_path / "out.onnx") == llama_on_onnx.written
    assert not data.is_symlink()


# ---- resume state ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("damage", ["range 1e308", "bins 10^10", "exponent 10^6", "negative count", "truncated"])
def test_resume_state_out_of_range_is_not_trusted(damage, tmp_path):
    """A resume state whose numbers no calibration gives (a range beyond float32, 10^10 bins, an exponent
    ldexp overflows on, a negative count) or a truncated archive is not trusted: `load` returns None (the run
    starts over with Q408), never an OverflowError, MemoryError or BadZipFile."""
    from compiler.backends.onnx.resume import ResumeState
    from compiler.quant.observers import HistogramObserver, MinMaxObserver

    state = ResumeState.for_run(tmp_path / "disk", "recipe", "model", "0")
    histogram = HistogramObserver(bins=64)
    histogram.update(np.linspace(-3, 5, 1000, dtype=np.float32))
    minmax = MinMaxObserver()
    minmax.update(np.array([1.0, -2.0], np.float32))
    state.save(2, {"a": histogram, "b": minmax})
    assert state.load() is not None
    if damage == "truncated":
        state.path.write_bytes(state.path.read_bytes()[:200])
    else:
        with np.load(state.path, allow_pickle=False) as archive:
            arrays = {k: archive[k] for k in archive.files}
        meta = json.loads(str(arrays["meta"]))
        a, b = meta["observers"]
        if damage == "range 1e308":
            b["max"] = 1e308
        elif damage == "bins 10^10":
            a["bins"] = 10**10
        elif damage == "exponent 10^6":
            a["exponent"] = 10**6
        else:
            b["finite"] = -5
        arrays["meta"] = np.array(json.dumps(meta))
        np.savez(state.path, **arrays)
    assert state.load() is None


# ---- the torch block cache on a full disk ----------------------------------------------------------------
def test_a_full_disk_under_the_torch_block_cache_is_q417_naming_the_cache(tmp_path):
    """offload with `disk` on a 256 KiB filesystem: the block cache fills it. Q417 names the cache file (not
    the output), no partial cache file is left, and nothing is at the destination."""
    disk = tmp_path / "small"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("this machine does not let the tests mount a small filesystem")
    try:
        out = tmp_path / "out"
        result = runner.invoke(app, ["compile", "recipes/tiny-llama-torch-w8a8.recipe", "-o", str(out), "--set",
                                     "memory.mode=offload", "--set", f'memory.disk="{disk}"'])
        assert result.exit_code == 2 and "Q417" in result.output and str(disk) in result.output, result.output
        _no_traceback(result)
        assert not out.exists() and not list(disk.rglob("*.safetensors"))
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


# ---- npz rows, a Markdown link, help lines -----------------------------------------------------------------
def test_an_npz_whose_mask_has_fewer_rows_than_its_ids_is_q403_at_check(tmp_path):
    ids = np.random.RandomState(0).randint(0, 500, (16, 16))
    np.savez(tmp_path / "d.npz", input_ids=ids, attention_mask=np.ones((8, 16), np.int64))
    recipe = tmp_path / "r.recipe"
    recipe.write_text(f'recipe r {{\n    model "builtin:tiny-llama"\n    quantize {{ type Linear -> W8A8_STATIC }}\n'
                      f'    calibrate {{ data npz "{tmp_path / "d.npz"}" {{ samples 4 }} }}\n}}\n')
    result = runner.invoke(app, ["check", str(recipe)])
    assert result.exit_code == 2 and "Q403" in result.output and "`attention_mask` 8" in result.output, result.output


def test_a_layer_name_cannot_become_a_markdown_link():
    """Every cell of the Markdown report goes through one filter: a layer named `[x](javascript:…)` stays text."""
    from compiler.report.render import _md_cell

    cell = _md_cell("[x](javascript:alert(1))")
    assert "](" not in cell and "<" not in _md_cell("<img src=x>")


@pytest.mark.parametrize(("body", "code"), [("quantize { type Linear -> W8A16 } calibrate { chunk 0 }", "Q217"),
                                            ("quantize { type Linear -> W8A16 } calibrate { chunk 2.5 }", "Q217"),
                                            ("quantize { type Linear -> }", "Q104"),
                                            ("quantize { type Linear -> W8A16", "Q10")])
def test_syntax_and_number_errors_have_a_help_line(body, code, tmp_path):
    recipe = tmp_path / "r.recipe"
    recipe.write_text(f'recipe r {{\n    model "builtin:tiny-llama"\n    {body}\n}}\n')
    result = runner.invoke(app, ["check", str(recipe)])
    assert result.exit_code == 2 and code in result.output and "= help:" in result.output, result.output


# ---- hostile JSON beside an ONNX decoder -------------------------------------------------------------------
@pytest.fixture(scope="session")
def decoder(llama_on_onnx) -> Path:
    """The tiny Llama exported to ONNX by qrc (a decoder with a cache): its cache entry's folder."""
    return next((llama_on_onnx.cache / "exported").iterdir())


SIDE_JSON = {"genai_config.json": ('{"model": [1, 2]}', '{"model": {"decoder": 3}}'),
             "config.json": ('{"model_type": "llama", "num_attention_heads": 0, "hidden_size": 64, "num_hidden_layers": 2}',
                             '{"model_type": "llama", "num_attention_heads": null, "hidden_size": 64}',
                             '{"model_type": "llama", "num_attention_heads": 4}',
                             '{"model_type": "llama", "x": ' + "[" * 100_000 + "]" * 100_000 + "}")}


@pytest.mark.parametrize(("name", "text"), [(n, t) for n, texts in SIDE_JSON.items() for t in texts],
                         ids=lambda v: v if len(v) < 30 else v[:30])
@pytest.mark.slow
def test_hostile_json_beside_an_onnx_decoder_is_not_a_traceback(decoder, name, text, tmp_path):
    """A genai_config.json or config.json beside a decoder that is not what it should be (a list where an
    object goes, heads 0 or null, no hidden size, nested 100,000 deep): the model compiles (its genai files are
    what a sound config gives, or none) or is refused with a code; never a traceback."""
    folder = tmp_path / "m"
    folder.mkdir()
    for part in ("model.onnx", "model.onnx.data"):
        shutil.copyfile(decoder / part, folder / part)
    (folder / name).write_text(text)
    recipe = tmp_path / "r.recipe"
    recipe.write_text(f'recipe r {{\n model "{folder / "model.onnx"}"\n quantize {{ type Linear -> W8A16 }}\n'
                      f' emit "{tmp_path / "out" / "q.onnx"}"\n}}\n')
    result = runner.invoke(app, ["compile", str(recipe)])
    _no_traceback(result)
    assert result.exit_code in (0, 2), result.output
    if result.exit_code == 2:
        assert "error[Q" in result.output


@pytest.mark.slow  # exports a decoder: about 20 s
def test_a_tokenizer_beside_an_onnx_decoder_linking_outside_is_not_copied(decoder, tmp_path):
    """onnxruntime-genai's side files beside the ONNX output are copied only when they resolve inside the
    model's folder: a tokenizer.json linking to a secret is left out, a real one is copied."""
    folder = tmp_path / "m"
    folder.mkdir()
    for part in ("model.onnx", "model.onnx.data", "config.json"):
        shutil.copyfile(decoder / part, folder / part)
    (tmp_path / "secret").write_text("PRIVATE KEY")
    (folder / "tokenizer.json").symlink_to(tmp_path / "secret")
    (folder / "generation_config.json").write_text("{}")
    recipe = tmp_path / "r.recipe"
    recipe.write_text(f'recipe r {{\n model "{folder / "model.onnx"}"\n quantize {{ type Linear -> W8A16 }}\n'
                      f' emit "{tmp_path / "out" / "q.onnx"}"\n}}\n')
    result = runner.invoke(app, ["compile", str(recipe)])
    assert result.exit_code == 0, result.output
    out = tmp_path / "out"
    assert (out / "genai_config.json").exists() and (out / "generation_config.json").exists()
    assert not (out / "tokenizer.json").exists()
    assert not any(b"PRIVATE KEY" in p.read_bytes() for p in out.iterdir() if p.is_file())
