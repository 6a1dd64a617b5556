"""`import compiler` and `qrc check` stay light: no torch, no onnxruntime (checked in fresh processes)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "onnxruntime", "transformers")


def _heavy_modules_after(code: str, heavy: tuple[str, ...] = HEAVY) -> list[str]:
    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True)
    return out.stdout.split()


def test_import_compiler_is_light():
    assert _heavy_modules_after("import compiler") == []


def test_qrc_check_is_light():
    code = ("from typer.testing import CliRunner\nfrom compiler.cli import app\n"
            "r = CliRunner().invoke(app, ['check', 'recipes/tiny-llama-w4a16.recipe', '--dump-ir'])\n"
            "assert r.exit_code == 0, r.output")
    assert _heavy_modules_after(code) == []


def test_both_backends_specs_are_light():
    """check and plan of a torch recipe load the torch backend's spec, cost model and checks: no torch."""
    code = ("from compiler import plan_file\n"
            "r = plan_file('recipes/tiny-llama-torch-gptq.recipe', detected_free=1 << 34)\n"
            "assert r.ok, r.diagnostics\n"
            "from compiler.backends.registry import spec_for\nfrom compiler.ir.types import Backend\n"
            "[spec_for(b) for b in Backend]")
    assert _heavy_modules_after(code) == []


def test_a_torch_plan_does_not_import_onnx():
    """Every compile loads every backend's spec (a recipe without `backend` tries each): the ONNX one must not
    import onnx (0.9 s of a torch compile's start, mostly ml_dtypes). (The builtin models are ONNX graphs: an HF
    folder's config here.)"""
    code = ("from compiler import plan_file\n"
            "r = plan_file('recipes/llama-7b-w4a16-plan.recipe', detected_free=1 << 36)\n"
            "assert r.ok, r.diagnostics")
    assert _heavy_modules_after(code, ("onnx", "ml_dtypes")) == []


def test_qrc_plan_with_a_report_is_light(tmp_path):
    code = ("from typer.testing import CliRunner\nfrom compiler.cli import app\n"
            f"r = CliRunner().invoke(app, ['plan', 'recipes/tiny-llama-mixed.recipe', '--report', {str(tmp_path / 'p.html')!r}])\n"
            "assert r.exit_code == 0, r.output")
    assert _heavy_modules_after(code) == []
    assert (tmp_path / "p.html").read_text().startswith("<!DOCTYPE html>")
