"""What qrc writes never deletes or writes through what it did not write: an output path holding a user's files,
a symbolic link (to a file, to a folder, dangling), a FIFO or a folder planted where qrc keeps its lock, its
reports, its resume states or their owner records. Each case is a coded diagnostic and exit 2, and the link's
target (or the user's files) are byte for byte as they were."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from plants import plant, victims
from typer.testing import CliRunner

from compiler.cli import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
TORCH_RECIPE = str(ROOT / "recipes/tiny-llama-torch-w8a8.recipe")
ONNX_RECIPE = str(ROOT / "recipes/tiny-llama-w8a8.recipe")
QUICK = ("--set", "verify.samples=2",)
PLANTS = ("link_to_file", "link_to_folder", "dangling_link", "fifo", "folder")


def _snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every entry under `folder`, a file's bytes (None for a folder), without following links."""
    found: dict[str, bytes | None] = {}
    for path in sorted(folder.rglob("*")):
        key = path.relative_to(folder).as_posix()
        found[key] = os.readlink(path).encode() if path.is_symlink() else path.read_bytes() if path.is_file() \
            else None
    return found


_victims, _plant = victims, plant  # the names the tests here (and tests/test_distributed.py) use


# ---- the destination: replaced only where qrc wrote it --------------------------------------------------
def test_an_output_folder_of_the_users_files_is_q440_and_kept(tmp_path):
    """`-o` onto a folder of other files: Q440 before any work, exit 2, every file still there."""
    out = tmp_path / "u"
    (out / "sub").mkdir(parents=True)
    (out / "notes.txt").write_text("notes\n")
    (out / "sub" / "thesis.tex").write_text("work\n")
    before = _snapshot(tmp_path)
    result = runner.invoke(app, ["compile", TORCH_RECIPE, "-o", str(out), *QUICK])
    assert result.exit_code == 2 and "Q440" in result.output and "--overwrite" in result.output, result.output
    assert _snapshot(tmp_path) == before


def test_dot_as_the_output_is_the_working_folder_and_refused(tmp_path, monkeypatch):
    """`-o .` names the working folder (no traceback on its empty name); it holds the user's files: Q440."""
    (tmp_path / "notes.txt").write_text("notes\n")
    monkeypatch.chdir(tmp_path)
    before = _snapshot(tmp_path)
    result = runner.invoke(app, ["compile", TORCH_RECIPE, "-o", ".", *QUICK])
    assert result.exit_code == 2 and "Q440" in result.output and "Traceback" not in result.output, result.output
    assert _snapshot(tmp_path) == before


def test_the_root_as_the_output_is_q413():
    result = runner.invoke(app, ["compile", TORCH_RECIPE, "-o", "/", *QUICK])
    assert result.exit_code == 2 and "Q413" in result.output, result.output


@pytest.mark.slow  # 3-8 s: kept out of the quick loop's 3 minutes on a 2-core machine without AMX (2026-12-04)
def test_overwrite_replaces_a_foreign_folder_on_purpose_and_qrc_replaces_its_own(tmp_path):
    """With `--overwrite` the folder is replaced; a folder qrc wrote is replaced without it."""
    out = tmp_path / "u"
    out.mkdir()
    (out / "notes.txt").write_text("notes\n")
    first = runner.invoke(app, ["compile", TORCH_RECIPE, "-o", str(out), "--overwrite", *QUICK])
    assert first.exit_code == 0, first.output
    assert not (out / "notes.txt").exists() and (out / "qrc.recipe").is_file()
    again = runner.invoke(app, ["compile", TORCH_RECIPE, "-o", str(out), *QUICK])
    assert again.exit_code == 0, again.output


def test_an_onnx_file_qrc_did_not_write_is_q440_and_its_own_is_replaced(tmp_path):
    mine = tmp_path / "m.onnx"
    mine.write_text("not qrc's\n")
    result = runner.invoke(app, ["compile", ONNX_RECIPE, "-o", str(mine), *QUICK])
    assert result.exit_code == 2 and "Q440" in result.output, result.output
    assert mine.read_text() == "not qrc's\n"
    out = tmp_path / "q.onnx"
    for _ in range(2):  # the second compile replaces the first one's file
        result = runner.invoke(app, ["compile", ONNX_RECIPE, "-o", str(out), *QUICK])
        assert result.exit_code == 0, result.output


# ---- what qrc keeps beside the output: the lock ---------------------------------------------------------
@pytest.mark.parametrize("kind", PLANTS)
def test_a_lock_that_is_not_a_regular_file_is_q441_and_its_target_untouched(kind, tmp_path):
    """Anyone who can write the output's parent can plant the lock's name; the compile refuses it (Q441) and
    neither writes through it nor creates the file a dangling link points to."""
    victims = _victims(tmp_path)
    out = tmp_path / "out" / "model"
    _plant(out.with_name(".model.qrc-lock"), kind, victims)
    before = _snapshot(tmp_path)
    result = runner.invoke(app, ["compile", TORCH_RECIPE, "-o", str(out), *QUICK])
    assert result.exit_code == 2 and "Q441" in result.output and "Traceback" not in result.output, result.output
    assert _snapshot(tmp_path) == before


# ---- reports --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["link_to_file", "dangling_link", "fifo"])
@pytest.mark.parametrize("command", ["plan", "compile"])
def test_a_report_path_that_is_a_link_or_a_fifo_is_refused(command, kind, tmp_path):
    victims = _victims(tmp_path)
    report = tmp_path / "r.html"
    _plant(report, kind, victims)
    before = _snapshot(tmp_path)
    extra = ["-o", str(tmp_path / "out"), *QUICK] if command == "compile" else []
    result = runner.invoke(app, [command, TORCH_RECIPE, "--report", str(report), *extra])
    assert result.exit_code == 2 and "Q239" in result.output, result.output
    after = _snapshot(tmp_path)
    after.pop("out", None)
    assert after == before


def test_plan_never_replaces_its_recipe_with_the_report(tmp_path):
    """`qrc plan R --report R` is Q239 as compile's is: the recipe stays as written."""
    recipe = tmp_path / "r.md"
    recipe.write_text(Path(TORCH_RECIPE).read_text())
    result = runner.invoke(app, ["plan", str(recipe), "--report", str(recipe)])
    assert result.exit_code == 2 and "Q239" in result.output and "did not write" in result.output, result.output
    assert recipe.read_text() == Path(TORCH_RECIPE).read_text()


@pytest.mark.parametrize("command", ["plan", "compile"])
def test_a_report_path_holding_another_file_is_q239_and_kept(command, tmp_path):
    """A file at the report's path that is not a qrc report is not replaced (compile's --overwrite replaces
    it on purpose); a report qrc wrote there is."""
    report = tmp_path / "report.md"
    report.write_text("my notes\n")
    extra = ["-o", str(tmp_path / "out"), *QUICK] if command == "compile" else []
    result = runner.invoke(app, [command, TORCH_RECIPE, "--report", str(report), *extra])
    assert result.exit_code == 2 and "Q239" in result.output and report.read_text() == "my notes\n", result.output
    report.unlink()
    for _ in range(2):  # the second run replaces the first one's report
        result = runner.invoke(app, ["plan", TORCH_RECIPE, "--report", str(report)])
        assert result.exit_code == 0 and report.read_text().startswith("# qrc plan report"), result.output


def test_a_file_at_the_locks_name_that_is_not_a_lock_is_q441_and_kept(tmp_path):
    out = tmp_path / "out" / "model"
    out.parent.mkdir()
    lock = out.with_name(".model.qrc-lock")
    lock.write_text("someone's file\n")
    result = runner.invoke(app, ["compile", TORCH_RECIPE, "-o", str(out), *QUICK])
    assert result.exit_code == 2 and "Q441" in result.output and "not qrc's lock" in result.output, result.output
    assert lock.read_text() == "someone's file\n" and not out.exists()


@pytest.mark.slow  # a compile and its verification: 3 s of the quick loop
def test_a_verify_report_qrc_did_not_write_is_neither_replaced_nor_removed(tmp_path):
    """`<output>.verify.json` is written when verification fails and removed when a later compile passes, only
    where it is qrc's: another program's file there stays, and the figures are in the summary."""
    theirs = tmp_path / "out.verify.json"
    theirs.write_text('{"their": "data"}\n')
    for bound in ("1", "-1"):  # fails (cosine at_least 1), then passes
        result = runner.invoke(app, ["compile", TORCH_RECIPE, "-o", str(tmp_path / "out"), *QUICK, "--overwrite",
                                     "--set", f"verify.at_least={bound}"])
        assert result.exit_code == (2 if bound == "1" else 0), result.output
        assert theirs.read_text() == '{"their": "data"}\n'


def test_an_emit_path_inside_a_datasets_tokenizer_folder_is_q416(tmp_path):
    """`data dataset`'s tokenizer folder is an input: an emit path inside it is refused at check."""
    text = (ROOT / "recipes/tiny-llama-torch-parquet-gptq.recipe").read_text()
    text = text.replace('emit "out/tiny-llama-torch-parquet-gptq"', 'emit "recipes/data/tokenizer/tokenizer.json"')
    recipe = tmp_path / "r.recipe"
    recipe.write_text(text)
    before = (ROOT / "recipes/data/tokenizer/tokenizer.json").read_bytes()
    for command in ("check", "compile"):
        result = runner.invoke(app, [command, str(recipe)], env={"QRC_NO_CWD": "1"})
        assert result.exit_code == 2 and "Q416" in result.output and "tokenizer" in result.output, result.output
    assert (ROOT / "recipes/data/tokenizer/tokenizer.json").read_bytes() == before


# ---- resume states and their owner records --------------------------------------------------------------
@pytest.mark.parametrize("kind", PLANTS)
def test_an_owner_record_planted_in_a_resume_state_is_refused(kind, tmp_path):
    """torch's block resume state claims its folder with an owner record; a link (or anything but a regular
    file) at that name is never written through: the planted entry is removed with the state it claims to own
    (what it points to untouched) and the record is written new."""
    import hashlib

    from compiler.backends.ranks import Ranks
    from compiler.backends.torch.resume import OWNER, BlockResume

    victims = _victims(tmp_path)
    identity = ("recipe", "model", "out")
    key = hashlib.sha256("\x00".join((*identity, "rank 0 of 1")).encode()).hexdigest()[:24]
    disk = tmp_path / "disk"
    _plant(disk / "checkpoints" / f"blocks-{key}" / OWNER, kind, victims)
    before = _snapshot(victims)
    BlockResume.open(disk, tmp_path / "out", identity, Ranks(), None, [])
    owner = disk / "checkpoints" / f"blocks-{key}" / OWNER
    assert _snapshot(victims) == before
    assert not owner.is_symlink() and owner.is_file() and '"world": 1' in owner.read_text()


@pytest.mark.parametrize("kind", ["link_to_folder", "dangling_link"])
def test_a_checkpoints_folder_linked_elsewhere_is_refused(kind, tmp_path):
    from compiler.backends.ranks import Ranks
    from compiler.backends.torch.resume import BlockResume
    from compiler.safe_files import UnsafePath

    victims = _victims(tmp_path)
    _plant(tmp_path / "disk" / "checkpoints", kind, victims)
    before = _snapshot(victims)
    with pytest.raises(UnsafePath):
        BlockResume.open(tmp_path / "disk", tmp_path / "out", ("r", "m", "o"), Ranks(), None, [])
    assert _snapshot(victims) == before


@pytest.mark.parametrize("kind", PLANTS)
def test_a_planted_verify_report_is_q441_and_untouched(kind, tmp_path):
    """A verification that fails writes `<output>.verify.json`; a link or FIFO there is refused (Q441)."""
    victims = _victims(tmp_path)
    out = tmp_path / "out"
    _plant(tmp_path / "out.verify.json", kind, victims)
    before = _snapshot(victims)
    result = runner.invoke(app, ["compile", TORCH_RECIPE, "-o", str(out), *QUICK, "--set", "verify.at_least=1"])
    assert result.exit_code == 2, result.output
    if kind != "folder":
        assert "Q441" in result.output, result.output
    assert _snapshot(victims) == before


@pytest.mark.parametrize("kind", PLANTS)
def test_claiming_a_state_never_writes_through_what_is_planted_at_its_owner_record(kind, tmp_path):
    """Both backends claim their resume states with owners.claim, also beside a state that is kept (a run that
    resumes): what is planted at the record's name is replaced by the record, its target untouched."""
    from compiler.backends.owners import claim, owner

    victims = _victims(tmp_path)
    record = tmp_path / "checkpoints" / "calibration-x.owner.json"
    _plant(record, kind, victims)
    before = _snapshot(victims)
    claim(record, owner(tmp_path / "out", "recipe", world=1))
    assert _snapshot(victims) == before
    assert not record.is_symlink() and record.is_file() and '"world": 1' in record.read_text()


@pytest.mark.parametrize("kind", PLANTS)
def test_a_staged_output_planted_at_a_resume_name_is_removed_never_its_target(kind, tmp_path):
    """torch's resumable runs stage the output at `.<name>.qrc-resume-<key>` beside it; what is planted there
    with no state to resume is removed (a link itself, not what it points to) before the run stages its own."""
    import hashlib

    from compiler.backends.ranks import Ranks
    from compiler.backends.torch.resume import BlockResume

    victims = _victims(tmp_path)
    identity = ("recipe", "model", str(tmp_path / "out"))
    shared = hashlib.sha256("\x00".join(identity).encode()).hexdigest()[:24]
    staged = tmp_path / f".out.qrc-resume-{shared}"
    _plant(staged, kind, victims)
    before = _snapshot(victims)
    resume = BlockResume.open(tmp_path / "disk", tmp_path / "out", identity, Ranks(), None, [])
    assert resume.staged == staged and not staged.exists() and not staged.is_symlink()
    assert _snapshot(victims) == before
