"""Hostile or careless inputs other than the output: a model folder whose weights are not its architecture's, a
tensor renamed out of its model, FIFOs where files belong, numbers no float holds, junk in the environment
variables qrc reads, terminal escapes and rich markup in arguments and paths. Each is a coded diagnostic (or a
correct result) with exit 2, no traceback, nothing written."""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner
from zoo import build

from compiler.backends.torch.compiled_steps import compiler_found as REAL_COMPILER_FOUND
from compiler.cli import app
from compiler.quant.loop_cache import uncached as REAL_UNCACHED

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
TORCH_RECIPE = str(ROOT / "recipes/tiny-llama-torch-w8a8.recipe")
ONNX_RECIPE = str(ROOT / "recipes/tiny-llama-w8a8.recipe")
LEARNED_RECIPE = """recipe learned {{
    model "builtin:tiny-llama"
    backend torch
    scheme s = W4A16 {{ group 32  rounding autoround {{ iters 20 }} }}
    quantize {{ "model.layers.*" -> s }}
    calibrate {{ data synthetic {{ samples 8  seqlen 32 }} }}
    emit "{out}"
}}
"""


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    pytest.importorskip("transformers")
    return build("llama", tmp_path_factory.mktemp("hostile-inputs") / "llama")


def _copy(llama: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(llama, folder)
    return folder


def _recipe(tmp_path: Path, model: Path, extra: str = "") -> Path:
    path = tmp_path / "r.recipe"
    path.write_text(f'recipe r {{\n    model "{model}"\n    backend torch\n    quantize {{ type Linear -> w4 }}\n'
                    f'    scheme w4 = W4A16 {{ group 32 }}\n{extra}    emit "{tmp_path / "out"}"\n}}\n')
    return path


def _edit_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


# ---- model folders ----------------------------------------------------------------------------------------
@pytest.mark.slow  # seconds each (tests/run.sh keeps the quick loop under 3 minutes)
def test_llama_weights_under_another_architecture_are_refused(llama, tmp_path):
    """`architectures: [BertModel]` over Llama weights: transformers would load a BertModel with every weight
    random. The compile says so (Q250) and writes nothing."""
    folder = _copy(llama, tmp_path)
    _edit_config(folder, architectures=["BertModel"])
    result = runner.invoke(app, ["compile", str(_recipe(tmp_path, folder))])
    assert result.exit_code == 2 and "Q250" in result.output and "BertModel" in result.output, result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # seconds each (tests/run.sh keeps the quick loop under 3 minutes)
@pytest.mark.parametrize("name, said", [("../../etc/passwd", "not a module path"),
                                        ("model.layers.0.self_attn.qq_proj.weight", "q_proj")])
def test_a_tensor_renamed_out_of_its_model_is_refused(llama, tmp_path, name, said):
    """A q_proj renamed `../../etc/passwd` (not a module path: Q250 from `check` on) or to another parameter's
    name (the folder would load with q_proj random: Q250 from the load check); nothing written."""
    from safetensors.torch import load_file, save_file

    folder = _copy(llama, tmp_path)
    tensors = load_file(str(folder / "model.safetensors"))
    tensors[name] = tensors.pop("model.layers.0.self_attn.q_proj.weight")
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    result = runner.invoke(app, ["compile", str(_recipe(tmp_path, folder))])
    assert result.exit_code == 2 and "Q250" in result.output and said in result.output, result.output
    assert not (tmp_path / "out").exists() and not Path("/etc/passwd.qrc").exists()


def test_a_size_written_as_a_string_is_shown_as_one(llama, tmp_path):
    folder = _copy(llama, tmp_path)
    _edit_config(folder, num_hidden_layers="2")
    result = runner.invoke(app, ["check", str(_recipe(tmp_path, folder))])
    assert result.exit_code == 2 and '"2"' in result.output and "a string" in result.output, result.output


def test_a_five_thousand_digit_number_in_config_json_is_q250(llama, tmp_path):
    folder = _copy(llama, tmp_path)
    text = (folder / "config.json").read_text().replace('"vocab_size": 320', '"vocab_size": 1' + "0" * 5000)
    (folder / "config.json").write_text(text)
    result = runner.invoke(app, ["check", str(_recipe(tmp_path, folder))])
    assert result.exit_code == 2 and "Q250" in result.output and "Traceback" not in result.output, result.output


@pytest.mark.parametrize("command", ["check", "plan", "compile"])
def test_a_fifo_as_config_json_is_refused_not_waited_on(llama, tmp_path, command):
    """Every command refuses it at once; a watchdog opens the FIFO's other end so a regression fails the test
    instead of hanging the suite."""
    folder = _copy(llama, tmp_path)
    (folder / "config.json").unlink()
    os.mkfifo(folder / "config.json")
    release = threading.Timer(60, lambda: open(folder / "config.json", "w").close())  # noqa: SIM115
    release.start()
    try:
        result = runner.invoke(app, [command, str(_recipe(tmp_path, folder))])
    finally:
        release.cancel()
    assert result.exit_code == 2 and "Q250" in result.output and "Traceback" not in result.output, result.output


@pytest.mark.parametrize("command", ["inspect", "check"])
@pytest.mark.parametrize("kind", ["device", "fifo", "link_to_fifo"])
def test_a_model_path_that_is_no_file_or_folder_says_what_it_is(kind, command, tmp_path):
    """/dev/null, a FIFO (or a link to one) as the model: Q250 saying what is there (it said "not found"), and a
    FIFO is never opened (a watchdog writes to it, so a regression fails instead of hanging the suite)."""
    fifo = tmp_path / "m.onnx"
    os.mkfifo(fifo)
    model = {"device": Path("/dev/null"), "fifo": fifo, "link_to_fifo": tmp_path / "link.onnx"}[kind]
    if kind == "link_to_fifo":
        model.symlink_to(fifo)
    recipe = tmp_path / "r.recipe"
    recipe.write_text(f'recipe r {{\n    model "{model}"\n    quantize {{ type Linear -> W8A16 }}\n}}\n')
    release = threading.Timer(60, lambda: open(fifo, "w").close())  # noqa: SIM115
    release.start()
    try:
        result = runner.invoke(app, [command, str(model if command == "inspect" else recipe)])
    finally:
        release.cancel()
    said = "a device or socket" if kind == "device" else "a FIFO"
    assert result.exit_code == 2 and "Q250" in result.output and f"is {said}, not a model" in result.output, \
        result.output


def test_a_fifo_as_a_dataset_is_refused_at_check(tmp_path):
    fifo = tmp_path / "rows.jsonl"
    os.mkfifo(fifo)
    recipe = tmp_path / "r.recipe"
    recipe.write_text(f'recipe r {{\n    model "builtin:tiny-llama"\n    backend torch\n'
                      '    quantize { type Linear -> W8A8_STATIC  "lm_head" -> none }\n'
                      f'    calibrate {{ data dataset "{fifo}" {{ text "text"  tokenizer "{ROOT}/recipes/data/tokenizer" '
                      '  samples 4  seqlen 16 } }\n'
                      f'    emit "{tmp_path / "out"}"\n}}\n')
    release = threading.Timer(60, lambda: open(fifo, "w").close())  # noqa: SIM115
    release.start()
    try:
        result = runner.invoke(app, ["check", str(recipe)])
    finally:
        release.cancel()
    assert result.exit_code == 2 and "Q401" in result.output and "FIFO" in result.output, result.output


# ---- numbers ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("setting, code", [("verify.at_least=1e400", "Q113"), ("memory.ram=1e308GiB", "Q232"),
                                           ("verify.samples=1e300", "Q217")])
@pytest.mark.parametrize("command", ["check", "plan"])
def test_numbers_no_float_holds_are_coded(setting, code, command):
    result = runner.invoke(app, [command, ONNX_RECIPE, "--set", setting])
    assert result.exit_code == 2 and code in result.output and "Traceback" not in result.output, result.output


def test_a_missed_perplexity_bound_reads_as_a_percent_increase(tmp_path):
    result = runner.invoke(app, ["compile", TORCH_RECIPE, "-o", str(tmp_path / "out"), "--set", "verify.samples=2",
                                 "--set", "verify.metric=perplexity", "--set", "verify.at_most=-50"])
    assert result.exit_code == 2 and "Q501" in result.output, result.output
    assert "perplexity rose" in result.output and "% (" in result.output and "float →" in result.output, result.output


# ---- the environment ----------------------------------------------------------------------------------------
# every variable qrc reads, and the test that feeds it junk (GROUP_RANK is a name: any text only names a node)
JUNK_TESTED = {
    "RANK": "test_junk_in_the_environment_is_q443", "WORLD_SIZE": "test_junk_in_the_environment_is_q443",
    "LOCAL_RANK": "test_junk_in_the_environment_is_q443", "LOCAL_WORLD_SIZE": "test_junk_in_the_environment_is_q443",
    "QRC_RANK_TIMEOUT": "test_junk_in_the_environment_is_q443", "QRC_CACHE": "test_a_cache_folder_that_is_a_file_is_q250",
    "QRC_TEMPLATE_SECONDS": "test_junk_template_limits_are_q443", "QRC_TEMPLATE_CHARS": "test_junk_template_limits_are_q443",
    "QRC_TEMPLATE_MEMORY": "test_junk_template_limits_are_q443", "GROUP_RANK": None,
    "CXX": "test_junk_compiler_variables_only_decide_whether_steps_compile",
    "TORCHDYNAMO_DISABLE": "test_junk_compiler_variables_only_decide_whether_steps_compile",
    "CUDA_VISIBLE_DEVICES": "test_junk_cuda_visible_devices_only_decides_the_default_runtime_device",
    "NUMBA_CACHE_DIR": "test_junk_cache_folders_only_decide_the_first_run_note",
    "XDG_CACHE_HOME": "test_junk_cache_folders_only_decide_the_first_run_note"}
READS = re.compile(r'(?:environ\.get|getenv|env_number|env_index|_index_and_count)\(\s*"([A-Z_]+)"(?:,\s*"([A-Z_]+)")?')


def test_every_environment_variable_qrc_reads_has_a_junk_test():
    """The source's reads of the environment (os.environ.get, env_number, torchrun's pairs) are exactly the
    variables above, each fed junk by the named test: a new variable without a junk test fails here."""
    read = {name for path in (ROOT / "compiler").rglob("*.py") for pair in READS.findall(path.read_text())
            for name in pair if name}
    assert read == set(JUNK_TESTED), read ^ set(JUNK_TESTED)
    tests = "".join(path.read_text() for path in (ROOT / "tests").glob("test_hostile*.py"))
    assert all(f"def {test}(" in tests for test in JUNK_TESTED.values() if test)


@pytest.mark.parametrize("variable, junk", [("RANK", "one"), ("WORLD_SIZE", "nan"), ("WORLD_SIZE", "0"),
                                            ("RANK", "-1"), ("LOCAL_RANK", "x"), ("LOCAL_WORLD_SIZE", "2.5"),
                                            ("QRC_RANK_TIMEOUT", "inf"), ("QRC_RANK_TIMEOUT", "-5"),
                                            ("QRC_RANK_TIMEOUT", "junk")])
def test_junk_in_the_environment_is_q443(variable, junk, tmp_path, monkeypatch):
    monkeypatch.setenv(variable, junk)
    if variable in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "QRC_RANK_TIMEOUT"):  # read when ranks join: two ranks, the first of them
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv("WORLD_SIZE", "2")
    result = runner.invoke(app, ["compile", TORCH_RECIPE, "-o", str(tmp_path / "out")])
    assert result.exit_code == 2 and "Q443" in result.output and variable in result.output, result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("variable, junk", [("CXX", "no-such-compiler --x; rm -rf ~"), ("CXX", ""),
                                            ("TORCHDYNAMO_DISABLE", "perhaps"), ("TORCHDYNAMO_DISABLE", "1")])
def test_junk_compiler_variables_only_decide_whether_steps_compile(variable, junk, tmp_path, monkeypatch):
    """CXX (the C++ compiler torch's inductor calls) and TORCHDYNAMO_DISABLE (torch's switch) only decide whether
    learned rounding's steps compile (compiled_steps.py): a compiler that is not there, or compile turned off,
    plans them uncompiled; junk never stops the plan."""
    monkeypatch.setattr("compiler.backends.torch.compiled_steps.compiler_found", REAL_COMPILER_FOUND)
    monkeypatch.setattr("compiler.backends.torch.compiled_steps.COMPILE_AT_FLOPS", 0.0)
    monkeypatch.setenv(variable, junk)
    recipe = tmp_path / "r.recipe"
    recipe.write_text(LEARNED_RECIPE.format(out=tmp_path / "out"))
    result = runner.invoke(app, ["plan", str(recipe), "--format", "json"])
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    run = next(op for op in json.loads(result.output)["ops"] if op["op"] == "run_block")
    if junk in ("1", "", "no-such-compiler --x; rm -rf ~"):
        assert "compiled" not in run["summary"], run["summary"]


@pytest.mark.parametrize("junk", ["/dev/null", "relative/../x", "x" * 5000, "FILE", "~nobody/../../", " "])
@pytest.mark.parametrize("variable", ["NUMBA_CACHE_DIR", "XDG_CACHE_HOME"])
def test_junk_cache_folders_only_decide_the_first_run_note(variable, junk, tmp_path, monkeypatch):
    """NUMBA_CACHE_DIR and XDG_CACHE_HOME (where numba caches its compiled loops when qrc's own folder is read-only)
    only decide whether the plan says a first run compiles them (quant/loop_cache.py): a device, a file, a name
    too long for the file system or a relative path never stops the plan."""
    monkeypatch.setattr("compiler.backends.torch.cost.uncached", REAL_UNCACHED)
    if variable == "XDG_CACHE_HOME":  # read only where the package's folder is read-only
        monkeypatch.setattr("compiler.quant.loop_cache._in_tree_writable", lambda: False)
    if junk == "FILE":
        junk = str(tmp_path / "a-file")
        Path(junk).write_text("not a folder")
    monkeypatch.setenv(variable, junk)
    result = runner.invoke(app, ["plan", str(ROOT / "recipes/tiny-llama-torch-w4a16.recipe")])
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    assert "first run here: numba compiles the loops of quant/round_kernels.py" in " ".join(result.output.split())


def test_a_rank_whose_peers_never_come_is_q444(tmp_path, monkeypatch):
    """RANK and WORLD_SIZE without torchrun's rendezvous (no MASTER_ADDR): a coded error, not torch's traceback."""
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("QRC_RANK_TIMEOUT", "5")
    result = runner.invoke(app, ["compile", TORCH_RECIPE, "-o", str(tmp_path / "out")])
    assert result.exit_code == 2 and "Q444" in result.output and "Traceback" not in result.output, result.output
    assert not (tmp_path / "out").exists()


# ---- what is printed ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("argument", ["[/x]", "[bold]Q1", "\x1b]0;pwned\x07", "\x1b[2J"])
def test_explain_prints_its_argument_as_text(argument):
    result = runner.invoke(app, ["explain", argument])
    assert result.exit_code == 2 and "no diagnostic code" in result.output, result.output
    assert "\x1b" not in result.output and "\x07" not in result.output


def test_terminal_escapes_in_an_output_path_are_printed_escaped(tmp_path):
    out = tmp_path / "o[b]x\x1b]0;t\x07"
    result = runner.invoke(app, ["compile", TORCH_RECIPE, "-o", str(out), "--set", "verify.samples=2"])
    assert result.exit_code == 0, result.output
    # the summary wraps a long path across lines (a pytest-xdist worker's tmp_path is longer): read it unwrapped
    unwrapped = "".join(result.output.replace("│", " ").split())
    assert "\x1b" not in result.output and "\x07" not in result.output and "o[b]x\\x1b]0;t\\x07" in unwrapped


# ---- threads ------------------------------------------------------------------------------------------------
def _refuse_threads(monkeypatch, prefixes: tuple[str, ...]) -> list[str]:
    """Threads whose name starts with one of `prefixes` fail to start as under a process limit; the names of
    those refused."""
    start, refusals = threading.Thread.start, []

    def refused(self):
        if self.name.startswith(prefixes):
            refusals.append(self.name)
            raise RuntimeError("can't start new thread")
        return start(self)

    monkeypatch.setattr(threading.Thread, "start", refused)
    return refusals


def test_rounding_falls_back_to_one_thread_when_none_can_start(tmp_path, monkeypatch):
    """File to file (data-free) rounding, reading ahead and writing behind on threads: with none to be had it
    runs on the caller's thread and writes the same bytes."""
    from compiler.quant import parallel

    recipe = str(ROOT / "recipes/tiny-llama-torch-w4a16.recipe")
    first = runner.invoke(app, ["compile", recipe, "-o", str(tmp_path / "threads")])
    assert first.exit_code == 0, first.output
    refusals = _refuse_threads(monkeypatch, ("qrc-round", "qrc-ahead", "qrc-copy", "qrc-write"))
    monkeypatch.setattr(parallel, "_threads_refused", False)
    monkeypatch.setattr(parallel, "_pool", None)
    alone = runner.invoke(app, ["compile", recipe, "-o", str(tmp_path / "alone")])
    assert alone.exit_code == 0, alone.output
    assert refusals  # the run did ask for threads
    for name in ("model.safetensors", "config.json"):
        assert (tmp_path / "threads" / name).read_bytes() == (tmp_path / "alone" / name).read_bytes()


def test_a_thread_qrc_cannot_do_without_is_q445(tmp_path, monkeypatch):
    _refuse_threads(monkeypatch, ("qrc-rss",))
    result = runner.invoke(app, ["compile", TORCH_RECIPE, "-o", str(tmp_path / "out")])
    assert result.exit_code == 2 and "Q445" in result.output and "Traceback" not in result.output, result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # seconds each (tests/run.sh keeps the quick loop under 3 minutes)
def test_an_architecture_only_the_folders_own_code_defines_is_named_and_never_run(llama, tmp_path):
    """`architectures` names a class of the folder's code (`auto_map`): Q250 says the architecture is unknown to
    transformers and that qrc runs no repo code (it was Q426 blaming the output); the folder's code never ran."""
    folder = _copy(llama, tmp_path)
    _edit_config(folder, architectures=["MyLlamaForCausalLM"],
                 auto_map={"AutoModelForCausalLM": "modeling_my.MyLlamaForCausalLM"})
    ran = tmp_path / "repo-code-ran"
    (folder / "modeling_my.py").write_text(f"open({str(ran)!r}, 'w').close()\n")
    result = runner.invoke(app, ["compile", str(_recipe(tmp_path, folder))])
    assert result.exit_code == 2 and "Q250" in result.output and "MyLlamaForCausalLM" in result.output, result.output
    assert "never runs code" in result.output and not ran.exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["check", "compile"])
def test_a_cache_folder_that_is_a_file_is_q250(command, tmp_path, monkeypatch):
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("x\n")
    monkeypatch.setenv("QRC_CACHE", str(not_a_folder))
    result = runner.invoke(app, [command, ONNX_RECIPE, "-o", str(tmp_path / "m.onnx")] if command == "compile"
                           else [command, ONNX_RECIPE])
    assert result.exit_code == 2 and "Q250" in result.output and "QRC_CACHE" in result.output, result.output
    assert not_a_folder.read_text() == "x\n"


@pytest.mark.slow  # seconds each (tests/run.sh keeps the quick loop under 3 minutes)
def test_third_party_progress_bars_stay_off_the_compiles_output(llama, tmp_path):
    """transformers' and compressed-tensors' tqdm bars (the verify loads the folder as transformers does) do not
    print between qrc's own rows. A process of its own, as users run it: tqdm reads its switch when imported."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("TQDM_DISABLE", "HF_HUB_DISABLE_PROGRESS_BARS")}
    extra = ("    calibrate { data synthetic { samples 4  seqlen 16 } }\n"
             "    verify { samples 2  metric cosine  at_least 0.9 }\n")
    done = subprocess.run([sys.executable, "-m", "compiler", "compile", str(_recipe(tmp_path, llama, extra))],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "it/s]" not in done.stderr + done.stdout and "Compressing model" not in done.stderr, done.stderr


# ---- paths no file can have ---------------------------------------------------------------------------------
@pytest.mark.parametrize("setting", ["model", "emit.path", "memory.disk", "calibrate.data"])
@pytest.mark.parametrize("command", ["check", "plan", "compile"])
def test_a_path_longer_than_the_system_takes_is_q114_where_it_is_written(setting, command, tmp_path):
    """A 300-byte name or a 5000-byte path was an `OSError: File name too long` traceback from the first
    stat; now Q114 at the path's span, before anything asks the system about it."""
    long_path = str(tmp_path / ("x" * 300)) if setting != "model" else "y/" * 2500
    value = f'text "{long_path}"' if setting == "calibrate.data" else long_path
    result = runner.invoke(app, [command, TORCH_RECIPE, "--set", f"{setting}={value}"])
    assert result.exit_code == 2 and "Q114" in result.output and "Traceback" not in result.output, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("option", ["-o", "--report"])
def test_an_output_or_report_path_too_long_is_refused_with_a_code(option, tmp_path):
    path = str(tmp_path / ("z" * 300)) + (".html" if option == "--report" else "")
    extra = ["-o", str(tmp_path / "out")] if option == "--report" else []
    result = runner.invoke(app, ["compile", TORCH_RECIPE, option, path, *extra])
    assert result.exit_code == 2 and ("Q413" if option == "-o" else "Q239") in result.output, result.output
    assert "Traceback" not in result.output and sorted(tmp_path.iterdir()) == []


@pytest.mark.parametrize("junk", ["junk; rm -rf ~", "", "-1", "0,1,zz", "\x7f"])
def test_junk_cuda_visible_devices_only_decides_the_default_runtime_device(junk, tmp_path, monkeypatch):
    """CUDA_VISIBLE_DEVICES is read (without torch) only to pick `emit … { runtime NAME }`'s device where the recipe
    gives none (compiler/ir/runtimes.py): junk there is a device choice, never a traceback. The built-in Llama's
    folder runs in no runtime, so the check says Q275 whichever device it picked."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", junk)
    result = runner.invoke(app, ["check", TORCH_RECIPE, "--set", "emit.runtime=vllm", "-o", str(tmp_path / "out")])
    assert result.exit_code == 2 and "Q275" in result.output and "Traceback" not in result.output, result.output
