"""Runs every case of tests/cases/diagnostics/*.recipe: expected (line, severity, code) set, rendered golden."""

from __future__ import annotations

from pathlib import Path

import pytest
from diagnostic_cases import Case, load_cases

from compiler import Source, check_source
from compiler.diagnostics import render_all
from golden import assert_golden

CASE_DIR = Path(__file__).parent / "cases" / "diagnostics"
FILES = sorted(CASE_DIR.glob("*.recipe"))
CASES = [case for path in FILES for case in load_cases(path)]


def _name(case: Case) -> str:
    return case.file.relative_to(CASE_DIR.parents[2]).as_posix()


def _diagnostics(case: Case):
    # Paths in cases (models) are relative to the repository root, like the commands in the README.
    return check_source(Source(_name(case), case.text), with_model=True).diagnostics


@pytest.fixture(autouse=True)
def _at_repository_root(monkeypatch):
    monkeypatch.chdir(CASE_DIR.parents[2])


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_case_reports_exactly_the_expected_diagnostics(case: Case):
    got = {(d.span.line if d.span else 0, d.severity.value, d.code) for d in _diagnostics(case)}
    assert got == set(case.expected), "\n" + render_all(_diagnostics(case))


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_rendered_diagnostics_match_golden(path: Path):
    parts = []
    for case in load_cases(path):
        rendered = render_all(_diagnostics(case)) or "(no diagnostics)"
        parts.append(f"# ----- case {case.index} (line {case.first_line})\n{rendered}\n")
    assert_golden("\n".join(parts), f"diagnostics/{path.stem}.txt")


def test_cases_cover_enough_distinct_mistakes():
    assert len(CASES) >= 40
    assert all(case.expected for case in CASES), "every case states what it expects"
