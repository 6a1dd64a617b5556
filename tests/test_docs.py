"""The README is a door and docs/ holds the rest: the README stays short, the diagnostics catalogue is
generated from compiler/codes/ (so it cannot drift), every recipe the docs show checks clean, every recipe
file they name exists and checks, and every relative link points at a file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import golden
from compiler import Source, check_file, check_source
from compiler.codes import CODES

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "README.md"]
CLASSES = {"1": "syntax", "2": "meaning: the recipe against the model", "3": "plan and memory",
           "4": "backend and execution", "5": "verification"}
ITEMS = ("model", "backend", "scheme", "kv_cache", "transform", "quantize", "group", "calibrate",
         "mixed_precision", "memory", "verify", "emit")


def catalogue() -> str:
    """docs/diagnostics.md, rendered from the code table behind `qrc explain`."""
    out = ["# Diagnostic codes", "",
           "Generated from `compiler/codes/` (`python -m pytest tests/test_docs.py --update-golden` rewrites it);",
           "`qrc explain CODE` prints the same. Codes are stable. Every diagnostic says where the problem is and",
           "what to do; errors end `qrc` with exit code 2, warnings with 0 (1 with `--strict`).", ""]
    for digit, name in CLASSES.items():
        codes = sorted((c for c in CODES if c.code[1] == digit), key=lambda c: c.code)
        out += [f"## Q{digit}xx: {name}", "", "| code | meaning |", "|---|---|"]
        out += [f"| [`{c.code}`](#{c.code.lower()}) | {c.title.replace('|', chr(92) + '|')} |" for c in codes]
        out.append("")
        for c in codes:
            out += [f"### {c.code}", "", f"**{c.title}.** {c.why}", "", "```text", c.example, "```", ""]
    return "\n".join(out)


def _blocks(page: Path):
    text = page.read_text(encoding="utf-8")
    for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M):
        yield text[:m.start()].count("\n") + 2, m.group(2)


def _recipes():
    """(page:line, text, whole) for every fenced block that is a recipe (whole) or recipe items."""
    for page in PAGES:
        if page.name == "diagnostics.md":
            continue  # its examples are mistakes on purpose (each shows what triggers its code)
        for line, body in _blocks(page):
            first = next((t.strip() for t in body.splitlines() if t.strip() and not t.lstrip().startswith("#")), "")
            word = first.split(" ")[0]
            if word == "recipe" or word in ITEMS:
                yield f"{page.relative_to(ROOT)}:{line}", body, word == "recipe"


def _items(body: str) -> list[str]:
    """Top-level items of a snippet, split where braces balance."""
    items, current, depth = [], [], 0
    for line in body.splitlines():
        code = line.split("#")[0]
        current.append(line)
        depth += code.count("{") - code.count("}")
        if depth == 0 and code.strip():
            items.append("\n".join(current))
            current = []
    return items


def test_the_readme_is_a_door():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert 50 <= len(lines) <= 200, f"README.md has {len(lines)} lines"
    for page in ("docs/recipe-language.md", "docs/backends.md", "docs/memory.md", "docs/models.md",
                 "docs/diagnostics.md", "bench/README.md"):
        assert f"]({page})" in "\n".join(lines), f"README.md does not point to {page}"


def test_ci_runs_exactly_the_readmes_test_command():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    command = re.search(r"## Tests\n\n```bash\n(.+?)\n```", readme, re.S)
    assert command is not None and "\n" not in command.group(1), "the README's Tests section shows one command"
    ci = [line for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
          if line.strip() and not line.startswith("#") and not line.startswith(("set ", "cd "))]
    assert ci == [command.group(1)]


def test_the_diagnostics_catalogue_is_generated_from_the_codes():
    golden.assert_file(catalogue(), ROOT / "docs" / "diagnostics.md")
    text = (ROOT / "docs" / "diagnostics.md").read_text(encoding="utf-8")
    assert [c.code for c in CODES if f"### {c.code}\n" not in text] == []


def test_the_docs_show_recipes():
    found = list(_recipes())
    assert sum(whole for _, _, whole in found) >= 1 and len(found) >= 2, found


@pytest.mark.parametrize(("where", "body", "whole"), list(_recipes()), ids=lambda v: v if isinstance(v, str)
                         and ":" in v and "\n" not in v else "")
def test_every_recipe_in_the_docs_checks(where, body, whole, monkeypatch):
    """A whole recipe checks clean against its model; each item of a snippet parses and elaborates inside a
    recipe on the built-in Llama (errors about the model, such as a transform's mapping, are allowed)."""
    monkeypatch.chdir(ROOT)
    if whole:  # "your own folder" recipes are compiled against one below
        result = check_source(Source(where, body), with_model=YOUR_MODEL not in body)
        assert result.ok, [d.message for d in result.diagnostics]
        return
    for item in _items(body):
        text = f'recipe doc {{\n  model "builtin:tiny-llama"\n  backend torch\n{item}\n}}\n'
        result = check_source(Source(where, text))
        syntax = [f"{d.code}: {d.message}" for d in result.diagnostics if d.is_error and d.code < "Q200"]
        assert syntax == [], f"{where}: {item!r}"


YOUR_MODEL = 'model "./my-model"'


def _your_folder_recipes() -> list[tuple[str, str]]:
    return [(where, body) for where, body, whole in _recipes() if whole and YOUR_MODEL in body]


def test_the_readme_shows_a_recipe_for_each_output_people_come_for():
    formats = sorted(re.search(r"format (\w+)", body).group(1) for _, body in _your_folder_recipes())
    assert formats == ["gguf", "safetensors", "safetensors"], formats


@pytest.mark.slow
@pytest.mark.parametrize(("where", "body"), _your_folder_recipes(), ids=lambda v: v if ":" in v else "")
def test_the_readme_recipes_compile_a_hugging_face_folder(where, body, tmp_path, monkeypatch):
    """The README's "your own Hugging Face folder" recipes, as written, compile a random-weight Llama folder
    saved by transformers (with a tokenizer) on calibration text from Python's own documentation; only the
    number and length of the samples are cut, to keep the test short."""
    from pydoc_data.topics import topics

    from compiling import compile_
    from zoo import tokenized_llama

    monkeypatch.chdir(tmp_path)
    tokenized_llama(tmp_path / "my-model", layers=2)
    lines = [line.strip() for text in topics.values() for line in text.splitlines() if len(line.split()) > 6]
    Path("calibration.txt").write_text("\n".join(lines[:200]) + "\n", encoding="utf-8")
    Path("my.recipe").write_text(body, encoding="utf-8")
    out = tmp_path / ("out.gguf" if "format gguf" in body else "out")
    result = compile_("my.recipe", out, 'calibrate.data=text "calibration.txt" { samples 8  seqlen 64 }')
    assert result.exit_code == 0, result.output
    assert out.is_file() if out.suffix == ".gguf" else (out / "config.json").is_file()


def test_every_recipe_file_the_docs_name_checks(monkeypatch):
    monkeypatch.chdir(ROOT)
    named = sorted({m for page in PAGES if page.name != "diagnostics.md"
                    for m in re.findall(r"recipes/[\w.-]+\.recipe", page.read_text("utf-8"))})
    assert named
    for path in named:
        assert (ROOT / path).is_file(), path
        result = check_file(path)
        assert result.ok, (path, [d.message for d in result.diagnostics])


def test_relative_links_point_at_files():
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            if "://" not in target and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} → {target}")
    assert broken == []
