"""qrc's regenerable caches (a GGUF file's side folders, an HF folder's ONNX export) stay within $QRC_CACHE_LIMIT:
a run that makes an entry removes the least recently used others, never one another run is using and never a
folder qrc did not make; a limit that is no size is Q250 before any work (compiler/models/cache_entries.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from compiling import SMOLLM2 as SMOL
from typer.testing import CliRunner

from compiler.cli import app
from compiler.models.gguf_source import side_folder

runner = CliRunner()


def _wheel_gguf() -> Path:
    from compiler.models import resolve_path

    return resolve_path(SMOL)


def _gguf_copy(path: Path) -> Path:
    """Another file version of the wheel's GGUF (a link of its own: a cache key of its own), no bytes copied."""
    try:
        os.link(_wheel_gguf(), path)
    except OSError:  # another file system
        path.write_bytes(_wheel_gguf().read_bytes())
    return path


def _recipe(tmp_path: Path, model: Path) -> Path:
    recipe = tmp_path / f"{model.stem}.recipe"
    recipe.write_text(f'recipe r {{\n  model "{model}"\n  backend torch\n  quantize {{ type Linear -> W8A16 '
                      f'"lm_head" -> none }}\n  emit "{tmp_path / "out"}"\n}}\n')
    return recipe


def _check(recipe: Path, env: dict) -> None:
    done = subprocess.run([sys.executable, "-m", "compiler", "check", str(recipe)], env=env, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def _entries(cache: Path) -> set[str]:
    return {p.name for p in (cache / "gguf").iterdir()}


@pytest.mark.slow  # three runs and a holder, each a process of its own: 5 s
def test_a_run_that_makes_an_entry_prunes_the_least_recently_used_ones_it_may(tmp_path):
    cache = tmp_path / "cache"
    env = {**os.environ, "QRC_CACHE": str(cache), "QRC_CACHE_LIMIT": "1KiB"}
    first, second, third = (_gguf_copy(tmp_path / f"{name}.gguf") for name in ("first", "second", "third"))
    _check(_recipe(tmp_path, first), env)
    (held,) = _entries(cache)
    mine = cache / "gguf" / "mine"  # a model folder of the user's in the cache: not qrc's entry
    mine.mkdir()
    (mine / "config.json").write_text("{}")
    (mine / "notes.txt").write_text("keep me" * 1000)
    elsewhere = tmp_path / "elsewhere"  # and a link to a folder that looks like an entry
    elsewhere.mkdir()
    (elsewhere / "qrc-cache-entry").write_text("" + " " * 5000)
    (cache / "gguf" / "linked").symlink_to(elsewhere)
    # another run holds the first entry: a second run's pruning leaves it
    holder = subprocess.Popen([sys.executable, "-c", "import sys\nfrom pathlib import Path\n"
                               "from compiler.models import cache_entries\n"
                               f"assert cache_entries.use(Path({str(cache / 'gguf' / held)!r}))\n"
                               "print('held', flush=True)\nsys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    assert holder.stdout.readline().strip() == "held"
    _check(_recipe(tmp_path, second), env)
    assert held in _entries(cache) and len(_entries(cache)) == 4  # first (held), second (just made), mine, linked
    holder.communicate("")
    # once no run holds it, the next run that makes an entry removes it, and the second's (least recently used)
    _check(_recipe(tmp_path, third), env)
    left = _entries(cache)
    assert held not in left and len(left) == 3 and {"mine", "linked"} <= left, left
    assert (mine / "notes.txt").read_text() == "keep me" * 1000 and (elsewhere / "qrc-cache-entry").is_file()


def test_an_entry_in_use_is_found_again_and_a_pruned_one_made_again(tmp_path, monkeypatch):
    """A run finds its entry and holds it; one a run removed before it was held is made again, not read."""
    from compiler.models import cache_entries

    monkeypatch.setenv("QRC_CACHE", str(tmp_path / "cache"))
    model = _gguf_copy(tmp_path / "m.gguf")
    try:
        made = side_folder(model, "m.gguf")
        assert side_folder(model, "m.gguf") == made
        cache_entries.release_held()
        assert cache_entries.prune(tmp_path / "cache" / "gguf" / "other") == []  # within the 20 GiB default
        monkeypatch.setenv("QRC_CACHE_LIMIT", "1")
        assert cache_entries.prune(tmp_path / "cache" / "gguf" / "other") == [made]
        again = side_folder(model, "m.gguf")
        assert again == made and (again / "config.json").is_file() and (again / "tokenizer.json").is_file()
    finally:
        cache_entries.release_held()


def test_a_limit_that_is_no_size_is_q250_at_check(tmp_path, monkeypatch):
    monkeypatch.setenv("QRC_CACHE", str(tmp_path / "cache"))
    for value in ("abc", "-3GiB", "0", "20 parsecs"):
        monkeypatch.setenv("QRC_CACHE_LIMIT", value)
        done = runner.invoke(app, ["check", str(_recipe(tmp_path, _wheel_gguf()))])
        assert done.exit_code == 2 and "Q250" in done.output and "QRC_CACHE_LIMIT" in done.output, done.output
        assert "Traceback" not in done.output
    monkeypatch.setenv("QRC_CACHE_LIMIT", "2.5 GiB")
    assert runner.invoke(app, ["check", str(_recipe(tmp_path, _wheel_gguf()))]).exit_code == 0


def test_what_a_killed_run_left_is_removed_a_day_later(tmp_path, monkeypatch):
    """Staging folders of exports and side folders, and entries half removed, by runs killed before they could
    clean up: gone once a day old, when a run next makes an entry; younger ones (a run still writing) stay."""
    from compiler.models import cache_entries

    cache = tmp_path / "cache"
    monkeypatch.setenv("QRC_CACHE", str(cache))
    names = {"exported": (".qrc-export-k1ll3d", ".0123456789abcdef.qrc-pruned-77-1"),
             "gguf": (".m-0123.qrc-x1y2", ".m-0123-float32.qrc-z9")}
    stale = time.time() - 2 * 24 * 3600
    for kind, pair in names.items():
        for n, name in enumerate(pair):
            folder = cache / kind / name
            folder.mkdir(parents=True)
            (folder / "model.onnx.data").write_bytes(b"\0" * 4096)
            if n == 0:
                os.utime(folder, (stale, stale))
    (cache / "gguf" / ".mine").mkdir()  # hidden, but no name qrc gives: not qrc's
    os.utime(cache / "gguf" / ".mine", (stale, stale))
    made = side_folder(_gguf_copy(tmp_path / "m.gguf"), "m.gguf")
    try:
        assert sorted(p.name for p in (cache / "exported").iterdir()) == [names["exported"][1]]
        assert sorted(p.name for p in (cache / "gguf").iterdir()) == sorted([".mine", names["gguf"][1], made.name])
    finally:
        cache_entries.release_held()


def _other_file_system(tmp_path: Path) -> Path:
    """A folder on another file system than the temp folder where there is one (/dev/shm), else under tmp_path."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK) and shm.stat().st_dev != tmp_path.stat().st_dev:
        return Path(tempfile.mkdtemp(dir=shm, prefix="qrc-test-cache-"))
    return tmp_path / "cache"


@pytest.mark.slow
def test_an_hf_folders_export_past_the_limit_is_removed_and_made_again_when_needed(tmp_path, monkeypatch):
    """Two decoder folders on ONNX under a 1 KiB limit: the second compile's export removes the first's; the
    first compiles again, exporting anew, and its output runs as before. The cache lies on another file system than
    the temp folder where the machine has one (a tmpfs /tmp, a cache on a scratch disk): exports are staged beside
    the entries, so their moves into place are renames (they failed across file systems, Q417). With tokenizers,
    so onnxruntime-genai's builder exports them (8 s each here, where the dynamo exporter takes 20 s): the cache
    treats either exporter's entry alike."""
    from zoo import add_tokenizer, build

    cache = _other_file_system(tmp_path)
    monkeypatch.setenv("QRC_CACHE", str(cache))
    monkeypatch.setenv("QRC_CACHE_LIMIT", "1KiB")
    folders = [add_tokenizer(build(family, tmp_path / name), 320) for family, name in (("llama", "a"), ("qwen2", "b"))]
    outputs = []
    try:
        for n, folder in enumerate([*folders, folders[0]]):
            out = tmp_path / f"o{n % 2}.onnx"  # the third the first's recipe again: its output the same bytes
            recipe = tmp_path / f"r{n}.recipe"
            recipe.write_text(f'recipe r {{\n  model "{folder}"\n  backend onnx\n'
                              f'  quantize {{ type Linear -> W8A16 }}\n  emit "{out}"\n}}\n')
            done = runner.invoke(app, ["compile", str(recipe)], env={"COLUMNS": "300"})
            assert done.exit_code == 0 and "export from the cache" not in done.output, done.output
            assert len(list((cache / "exported").iterdir())) == 1  # the one this compile made
            outputs.append(out.read_bytes())
    finally:
        if not cache.is_relative_to(tmp_path):
            shutil.rmtree(cache)
    assert outputs[2] == outputs[0]
