"""The habits the tools enforce, run with the tests (so `.ci/run` runs them): ruff (style, docstrings of
public symbols, heavy runtimes imported only inside the backends) and mypy over the package, strict about None."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True)


def test_ruff_passes():
    result = _run("ruff", "check", "compiler", "tests", "bench")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow  # cold (a clean clone, as CI times the quick loop) 18-29 s of the quick loop's 180: warm, 5 s
def test_mypy_passes():
    result = _run("mypy")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_narrows_optionals():
    """strict_optional stays on: a `T | None` is checked before it is used as a T."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]
    assert config.get("strict_optional", True) is True
