"""The grammar and the report templates ship inside the wheel: build it, unpack it, parse a recipe from
the installed copy."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_carries_the_grammar_and_parses_from_it(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(dist), str(ROOT)], check=True, capture_output=True)
    wheel = next(dist.glob("qrc-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        assert "compiler/grammar/recipe.lark" in archive.namelist()
        assert {"compiler/report/templates/report.md.j2", "compiler/report/templates/report.html.j2"} <= set(archive.namelist())
        archive.extractall(tmp_path / "site")
    probe = (
        "import compiler, sys\n"
        "from compiler.syntax.grammar import grammar_path\n"
        f"assert compiler.__file__.startswith({str(tmp_path / 'site')!r}), compiler.__file__\n"
        f"assert str(grammar_path()).startswith({str(tmp_path / 'site')!r}), grammar_path()\n"
        f"ir = compiler.load_recipe({str(ROOT / 'recipes' / 'tiny-llama-w4a16.recipe')!r})\n"
        "print(ir.name)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "tiny_llama_w4a16"
