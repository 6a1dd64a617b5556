"""`qrc inspect`: goldens per example recipe and per built-in; JSON; bad models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from compiler import check_file
from compiler.cli import app
from golden import assert_golden

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted((ROOT / "recipes").glob("*.recipe"))
runner = CliRunner()


@pytest.fixture(autouse=True)
def _at_root(monkeypatch):
    monkeypatch.chdir(ROOT)


@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_inspect_with_recipe_golden(path):
    rel = path.relative_to(ROOT).as_posix()
    model = check_file(rel).ir.model
    result = runner.invoke(app, ["inspect", model, "--recipe", rel, "--format", "text"])
    assert result.exit_code == 0, result.output
    assert_golden(result.stdout, f"inspect/{path.stem}.txt")


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-bert", "tiny-cnn"])
def test_inspect_builtin_golden(name):
    result = runner.invoke(app, ["inspect", f"builtin:{name}", "--format", "text"])
    assert result.exit_code == 0, result.output
    assert_golden(result.stdout, f"inspect/builtin-{name}.txt")


def test_inspect_json_has_every_layer_with_scheme_and_rule():
    result = runner.invoke(app, ["inspect", "builtin:tiny-llama", "-r", "recipes/tiny-llama-w4a16.recipe", "--json"])
    data = json.loads(result.stdout)
    assert len(data["layers"]) == 16
    assert all(layer["scheme"] for layer in data["layers"])
    assert data["layers"][1]["rule"] == "recipes/tiny-llama-w4a16.recipe:18"
    assert {t["scheme"] for t in data["totals"]} == {"none", "w4", "w8a8"}


def test_inspect_rich_table_renders():
    result = runner.invoke(app, ["inspect", "builtin:tiny-bert", "-r", "recipes/tiny-bert-lwp.recipe"],
                           env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "encoder.layer.0.attention.self.query" in result.output


def test_inspect_missing_model_is_a_diagnostic():
    result = runner.invoke(app, ["inspect", "nope.onnx"])
    assert result.exit_code == 2 and "error[Q250]" in result.output
