"""Shared by the compile tests: which example models are installed, and `qrc compile` through typer."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from compiler.cli import app

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def available(model: str) -> bool:
    """The model can be compiled here: its package is installed, and it is not a config-only folder."""
    from compiler.models import ModelError, resolve_path

    try:
        resolve_path(model)
    except ModelError:
        return False
    return not model.startswith("tests/")


def compile_(recipe: str, out: Path, *sets: str):
    args = ["compile", recipe, "-o", str(out)]
    for s in sets:
        args += ["--set", s]
    return runner.invoke(app, args)
