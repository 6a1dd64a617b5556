"""Every example in recipes/ checks clean, and its elaborated IR is a golden that parses back to itself."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from compiler import Source, check_file, check_source, print_ir
from compiler.diagnostics import render_all
from golden import assert_golden

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted((ROOT / "recipes").glob("*.recipe"))


def _relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_example_checks_clean(path):
    result = check_file(_relative(path))
    assert result.ok and not result.diagnostics, render_all(result.diagnostics)


@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_ir_golden(path, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert_golden(print_ir(check_file(_relative(path)).ir), f"ir/{path.stem}.txt")


@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_canonical_form_parses_back_to_the_same_ir(path):
    first = print_ir(check_file(path).ir)
    again = check_source(Source("canonical.recipe", first))
    assert again.ok, render_all(again.diagnostics)
    assert _without_comments(print_ir(again.ir)) == _without_comments(first)


def _without_comments(text: str) -> str:
    """The canonical form minus its trailing `# …` notes (line numbers, provenance)."""
    return re.sub(r"  # [^\"\n]*$", "", text, flags=re.MULTILINE)


def test_design_examples_are_present():
    """An int8 static, an int4 weight-only, a layer-wise percentile, a mixed precision and a torch recipe."""
    irs = [check_file(p).ir for p in RECIPES]
    assert any(s.activations for ir in irs for s in ir.schemes)
    assert any(s.weights.qtype.bits == 4 and not s.activations for ir in irs for s in ir.schemes)
    assert any(ir.calibration.method.name == "layerwise_percentile" for ir in irs)
    assert any(ir.mixed_precision for ir in irs)
    assert any(ir.backend.value == "torch" for ir in irs)
