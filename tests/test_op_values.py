"""Typed values between ops: the runner holds each buffer's value and a handler reads only what its op declares
(compiler/backends/values.py); a run state keeps services only. Every compile that goes through
`compiling.assert_ran_the_plan` also checks each handler's reads against its op's inputs."""

from __future__ import annotations

import pytest
from compiling import ROOT, assert_ran_the_plan, compile_program

from compiler.backends.values import UndeclaredBuffer, Values
from compiler.ir.types import MemoryMode
from compiler.plan import ops


def _op(inputs, outputs=()):
    return ops.SelectMemoryMode(summary="", inputs=inputs, outputs=outputs, peak_bytes=0,
                                mode=MemoryMode.FULL, requested=MemoryMode.FULL, estimate=0, ram_budget=0)


def test_a_handler_reads_only_what_its_op_declares():
    values = Values({ops.Buffer.RECIPE: "resolved", ops.Buffer.MODEL: 1})
    view = values.for_op(_op((ops.Buffer.MODEL,), (ops.Buffer.MEMORY_MODE,)))
    assert view.get(ops.Buffer.MODEL, int) == 1
    with pytest.raises(UndeclaredBuffer, match="select_memory_mode reads `recipe`, which it does not declare"):
        view.get(ops.Buffer.RECIPE, str)
    with pytest.raises(UndeclaredBuffer, match="produces `qparams`, which it does not declare"):
        view.put(ops.Buffer.QPARAMS, 2)
    with pytest.raises(UndeclaredBuffer, match="holds a int, not the str"):
        view.get(ops.Buffer.MODEL, str)
    view.put(ops.Buffer.MEMORY_MODE, "full")
    later = values.for_op(_op((ops.Buffer.MEMORY_MODE, ops.Buffer.SENSITIVITY)))
    assert later.get(ops.Buffer.MEMORY_MODE, str) == "full"
    with pytest.raises(UndeclaredBuffer, match="reads `sensitivity` before any op produced it"):
        later.get(ops.Buffer.SENSITIVITY, object)
    assert [(op.kind.value, b.value) for op, b in values.reads] == [("select_memory_mode", "model"),
                                                                    ("select_memory_mode", "memory_mode")]


@pytest.mark.parametrize("recipe", ["recipes/tiny-llama-torch-w8a8.recipe", "recipes/tiny-llama-w8a8.recipe"],
                         ids=["torch", "onnx"])
def test_a_run_state_keeps_services_only(recipe):
    """At most 8 attributes, and no op can add one: the state is slots all the way down."""
    from compiler import plan_file
    from compiler.backends.onnx.execute import _OnnxRun
    from compiler.backends.torch.execute import _Run

    planned = plan_file(str(ROOT / recipe), detected_free=16 << 30)
    kind = _Run if planned.plan.backend.value == "torch" else _OnnxRun
    run = kind(planned.plan, ROOT / "out", lambda stage, total: lambda: None, 0.0)
    slots = [name for cls in type(run).__mro__ for name in getattr(cls, "__slots__", ())]
    assert len(slots) <= 8 and not hasattr(run, "__dict__")
    with pytest.raises(AttributeError):
        run.model = None  # type: ignore[attr-defined]


@pytest.mark.parametrize(("recipe", "verified"), [
    ("recipes/tiny-llama-torch-smoothquant.recipe", True),  # full: smooth, capture, calibrate, in place, verify
    pytest.param("recipes/tiny-llama-torch-w4a16.recipe", False,  # nothing runs the model: file to file, no stream
                 marks=pytest.mark.slow),  # 4 s of the quick loop
    ("recipes/tiny-bert-lwp.recipe", True),  # ONNX: histograms, the range search and propagation
], ids=["torch-full-smoothquant", "torch-file-to-file", "onnx-ranges"])
def test_each_handler_reads_only_its_declared_inputs(recipe, verified, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    text = (ROOT / recipe).read_text()
    if not verified:
        text = "\n".join(line for line in text.splitlines() if not line.strip().startswith("verify"))
    written = tmp_path / "case.recipe"
    written.write_text(text)
    result, planned = compile_program(str(written), tmp_path / "out", "memory.mode=full")
    assert_ran_the_plan(result, planned)  # which checks the reads
    kinds = {op.kind for op in planned.plan.ops}
    if planned.plan.backend.value == "onnx":
        assert {ops.OpKind.SEARCH_PERCENTILE, ops.OpKind.PROPAGATE_RANGES, ops.OpKind.VERIFY} <= kinds
    elif verified:
        assert {ops.OpKind.SMOOTH, ops.OpKind.CAPTURE_REFERENCE, ops.OpKind.VERIFY} <= kinds
    else:
        assert planned.plan.ops[0].access is ops.ModelAccess.FILES
