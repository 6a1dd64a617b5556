"""The habits the tools enforce, run with the tests (so `.ci/run` runs them): ruff (style, docstrings of
public symbols, heavy runtimes imported only inside the backends) and mypy over the package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True)


def test_ruff_passes():
    result = _run("ruff", "check", "compiler", "tests", "bench")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_passes():
    result = _run("mypy")
    assert result.returncode == 0, result.stdout + result.stderr
