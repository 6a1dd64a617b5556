"""`qrc check` and `qrc plan` are pure functions of the recipe and the model's metadata: they read no weight
bytes (measured by the kernel's count of bytes this process read) and do not depend on an earlier compile."""

from __future__ import annotations

import subprocess
import sys

import pytest
from compiling import ROOT, available

from compiler import check_file

MINILM = ["recipes/minilm-w8a8.recipe", "recipes/minilm-torch-w8a8.recipe"]  # HF folder on onnx and on torch


def _bytes_read(code: str) -> int:
    """Bytes the process read (/proc/self/io rchar) while running `code`, after a warm-up of the same code
    on a built-in model, so that imports are not counted."""
    probe = (
        "from compiler import check_file, plan_file\n"
        "check_file('recipes/tiny-llama-w4a16.recipe', with_model=True)\n"
        "plan_file('recipes/tiny-llama-w4a16.recipe', detected_free=1 << 34)\n"
        "def rchar():\n"
        "    return int(next(l for l in open('/proc/self/io') if l.startswith('rchar')).split()[1])\n"
        f"before = rchar()\n{code}\nprint(rchar() - before)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True)
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/io is Linux's")
@pytest.mark.parametrize("recipe", MINILM)
def test_check_and_plan_of_an_hf_folder_read_no_weight_bytes(recipe):
    ir = check_file(ROOT / recipe).ir
    if not available(ir.model):
        pytest.skip("the MiniLM package is not installed")
    from compiler.models import resolve_path

    weights = sum(p.stat().st_size for p in resolve_path(ir.model).glob("*.safetensors"))
    read = _bytes_read(f"r = check_file({recipe!r}, with_model=True); assert r.ok, r.diagnostics\n"
                       f"p = plan_file({recipe!r}, detected_free=1 << 34); assert p.ok, p.diagnostics")
    assert weights > 80 << 20
    assert read < 2 << 20, f"check + plan read {read} bytes of a folder with {weights} bytes of weights"


@pytest.mark.slow
def test_a_cached_export_is_planned_against_its_graph(tmp_path, monkeypatch):
    """The ONNX export of an HF folder is an op of the plan whether or not it is cached already; once it
    is, the plan walks its graph (what the compile runs) instead of estimating activations from the config,
    and its export op costs nothing."""
    monkeypatch.chdir(ROOT)
    from compiler import plan_file
    from compiler.backends.onnx.export import export_folder
    from compiler.models import resolve_path

    recipe = "recipes/minilm-w8a8.recipe"
    ir = check_file(recipe).ir
    if not available(ir.model):
        pytest.skip("the MiniLM package is not installed")
    monkeypatch.setenv("QRC_CACHE", str(tmp_path / "cache"))
    before = plan_file(recipe, detected_free=1 << 34).plan
    export_folder(resolve_path(ir.model))
    after = plan_file(recipe, detected_free=1 << 34).plan
    assert [op.kind for op in after.ops] == [op.kind for op in before.ops]
    assert before.ops[0].kind.value == after.ops[0].kind.value == "export_onnx"
    assert before.ops[0].peak_bytes > 1 << 30 and after.ops[0].peak_bytes < 200 << 20
    assert any("no graph shapes" in n for n in before.notes)
    assert any("cached ONNX export" in n for n in after.notes)
    assert after.quantized_layers == before.quantized_layers
