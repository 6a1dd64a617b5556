"""Chat templates are code from a download: each hostile or broken template (a loop past the deadline, an output
past the cap, a memory bomb, sandbox escapes, an include, a syntax error, `raise_exception`, an undefined name, a
recursive macro), an empty conversation and a template linked outside its folder is one coded diagnostic (Q442,
Q434 or Q401) naming the template and the row, exit 2, within the deadline and a few seconds, nothing written."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from compiler.cli import app

pytest.importorskip("transformers")
runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "recipes" / "data" / "tokenizer"

TEMPLATES = {
    "endless_loop": "{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}x"
                    "{% endfor %}{% endfor %}{% endfor %}",
    "huge_string": "{{ 'A' * (10**10) }}",
    "long_output": "{% for a in range(100000) %}{{ 'B' * 1000 }}{% endfor %}",
    "class_escape": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "globals_escape": "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    "include": "{% include '/etc/passwd' %}",
    "syntax_error": "{% for m in messages %}{{ m.content }",
    "raise_exception": "{% for m in messages %}{% if m.role == 'user' %}{{ raise_exception('roles must "
                       "alternate') }}{% endif %}{% endfor %}",
    "undefined_name": "{{ messages[0].content | no_such_filter }}",
    "undefined_call": "{{ not_defined_anywhere() }}",
    "recursive_macro": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
}


def _tokenizer_with(tmp_path: Path, template: str) -> Path:
    folder = tmp_path / "tok"
    shutil.copytree(TOKENIZER, folder)
    for name in ("chat_template.jinja", "chat_template.json"):
        (folder / name).unlink(missing_ok=True)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "chat_template.jinja").write_text(template)
    return folder


def _recipe(tmp_path: Path, tokenizer: Path, rows: list) -> Path:
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps({"messages": r}) + "\n" for r in rows))
    path = tmp_path / "r.recipe"
    path.write_text(f'recipe r {{\n    model "builtin:tiny-llama"\n    backend torch\n'
                    '    quantize { type Linear -> W8A8_STATIC  "lm_head" -> none }\n'
                    f'    calibrate {{\n        data dataset "{data}" {{ messages "messages"  tokenizer "{tokenizer}"'
                    '  rows pack  samples 4  seqlen 16 }\n        chunk 4\n    }\n'
                    f'    verify {{ samples 2 }}\n    emit "{tmp_path / "out"}"\n}}\n')
    return path


ROWS = [[{"role": "user", "content": "hello there"}, {"role": "assistant", "content": "hi"}]] * 40


# each case starts the sandbox's child (about 1.5 s): two stay in the quick loop, the rest are slow, so the quick
# loop keeps its margin on CI's machine (the endless loop runs out the whole deadline)
QUICK_TEMPLATES = ("class_escape", "syntax_error")


@pytest.mark.parametrize("name", [n if n in QUICK_TEMPLATES else pytest.param(n, marks=pytest.mark.slow)
                                  for n in sorted(TEMPLATES)])
def test_a_hostile_template_is_q442_within_the_deadline(name, tmp_path, monkeypatch):
    monkeypatch.setenv("QRC_TEMPLATE_SECONDS", "3")
    monkeypatch.setenv("QRC_TEMPLATE_CHARS", "1000000")
    recipe = _recipe(tmp_path, _tokenizer_with(tmp_path, TEMPLATES[name]), ROWS)
    start = time.monotonic()
    result = runner.invoke(app, ["compile", str(recipe)])
    took = time.monotonic() - start
    assert result.exit_code == 2 and "Q442" in result.output and "Traceback" not in result.output, result.output
    assert "chat_template.jinja" in result.output and "row 0" in result.output, result.output
    assert took < 3 + 30, took  # the deadline, the child's start and the compile's own checks
    assert not (tmp_path / "out").exists()


def test_a_template_error_names_its_line(tmp_path):
    template = "{% for m in messages %}\n{{ m.content }}\n{{ raise_exception('no system role') }}\n{% endfor %}"
    recipe = _recipe(tmp_path, _tokenizer_with(tmp_path, template), ROWS)
    result = runner.invoke(app, ["compile", str(recipe)])
    assert result.exit_code == 2 and "Q442" in result.output and "line 3" in result.output, result.output
    assert "no system role" in result.output


def test_an_empty_conversation_is_q434(tmp_path):
    recipe = _recipe(tmp_path, TOKENIZER, [[]] + ROWS)
    result = runner.invoke(app, ["compile", str(recipe)])
    assert result.exit_code == 2 and "Q434" in result.output and "Traceback" not in result.output, result.output


def test_a_template_linked_outside_its_folder_is_never_read(tmp_path):
    folder = _tokenizer_with(tmp_path, "")
    secret = tmp_path / "secret.txt"
    secret.write_text("the secret text\n")
    (folder / "chat_template.jinja").unlink()
    (folder / "chat_template.jinja").symlink_to(secret)
    result = runner.invoke(app, ["compile", str(_recipe(tmp_path, folder, ROWS))])
    assert result.exit_code == 2 and "links outside" in result.output, result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("variable, junk", [
    ("QRC_TEMPLATE_SECONDS", "nan"), ("QRC_TEMPLATE_SECONDS", "inf"), ("QRC_TEMPLATE_SECONDS", "-1"),
    ("QRC_TEMPLATE_SECONDS", "0"), ("QRC_TEMPLATE_SECONDS", "ten"), ("QRC_TEMPLATE_SECONDS", "1e400"),
    ("QRC_TEMPLATE_CHARS", "2.5e99"), ("QRC_TEMPLATE_CHARS", "1.5"), ("QRC_TEMPLATE_CHARS", "nan"),
    ("QRC_TEMPLATE_MEMORY", "-5"), ("QRC_TEMPLATE_MEMORY", "lots"), ("QRC_TEMPLATE_MEMORY", "1e300")])
def test_junk_template_limits_are_q443(variable, junk, tmp_path, monkeypatch):
    monkeypatch.setenv(variable, junk)
    result = runner.invoke(app, ["compile", str(_recipe(tmp_path, TOKENIZER, ROWS))])
    assert result.exit_code == 2 and "Q443" in result.output and variable in result.output, result.output


def test_a_good_template_renders_as_transformers_does(tmp_path):
    """The child renders with transformers' own sandboxed renderer: the same text apply_chat_template gives."""
    from transformers import PreTrainedTokenizerFast

    from compiler.data.templates import TemplateRenderer

    tok = PreTrainedTokenizerFast.from_pretrained(str(TOKENIZER), local_files_only=True)
    with TemplateRenderer(tok, TOKENIZER, None) as renderer:
        for row in ROWS[:2] + [[{"role": "system", "content": "be brief"}, {"role": "user", "content": "ünïcode"}]]:
            assert renderer.render(row, 0) == tok.apply_chat_template(row, tokenize=False)
