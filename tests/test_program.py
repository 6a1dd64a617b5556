"""The plan is the program: in every memory mode, a compile runs exactly the plan's ops, in order, each by
its backend's handler (the example recipes as they are are covered by the golden compile tests)."""

from __future__ import annotations

import pytest
from compiling import ROOT, assert_ran_the_plan, compile_program

from compiler import plan_file
from compiler.backends.onnx.spec import SPEC as ONNX
from compiler.backends.program import missing_handlers
from compiler.backends.torch.spec import SPEC as TORCH
from compiler.plan import ops

CASES = [(recipe, mode) for recipe in ("recipes/tiny-llama-w8a8.recipe", "recipes/tiny-bert-lwp.recipe")
         for mode in ("full", "low_memory", "offload")]
CASES += [(recipe, mode) for recipe in ("recipes/tiny-llama-torch-w8a8.recipe", "recipes/tiny-llama-torch-gptq.recipe")
          for mode in ("full", "low_memory", "offload")]


@pytest.fixture(autouse=True)
def _at_root(monkeypatch):
    monkeypatch.chdir(ROOT)


@pytest.mark.parametrize(("recipe", "mode"), CASES, ids=[f"{r.split('/')[-1][:-7]}-{m}" for r, m in CASES])
@pytest.mark.slow
def test_compile_runs_the_plan_in_every_mode(recipe, mode, tmp_path):
    result, planned = compile_program(recipe, tmp_path / "out", f"memory.mode={mode}", f"memory.disk={tmp_path / 'disk'}")
    assert planned.plan.mode.value == mode
    assert_ran_the_plan(result, planned)
    assert result.verify_passed is not False


@pytest.mark.slow
def test_torch_weight_only_without_verification_streams_every_layer(tmp_path):
    """No layer needs data and nothing is verified: one op rounds every layer, block by block from disk."""
    text = (ROOT / "recipes/tiny-llama-torch-w4a16.recipe").read_text()
    recipe = tmp_path / "no-verify.recipe"
    recipe.write_text("\n".join(line for line in text.splitlines() if not line.strip().startswith("verify")))
    result, planned = compile_program(str(recipe), tmp_path / "out")
    assert planned.check.ir.verify is None
    kinds = [op.kind for op in planned.plan.ops]
    assert ops.OpKind.RUN_BLOCK not in kinds and kinds.count(ops.OpKind.QUANTIZE_WEIGHTS) == 1
    assert_ran_the_plan(result, planned)


@pytest.mark.parametrize("recipe", sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "recipes").glob("*.recipe")))
def test_every_example_plan_has_a_handler_for_each_op(recipe):
    """Checked without running: a planner/backend mismatch shows here even for plan-only examples."""
    from compiler.backends.onnx import execute as onnx_execute

    planned = plan_file(recipe, detected_free=16 << 30)
    if planned.plan is None:
        pytest.skip("the model is not installed here")
    spec = {ONNX.backend: ONNX, TORCH.backend: TORCH}[planned.plan.backend]
    if spec is ONNX:
        handlers = onnx_execute._OnnxRun(planned.plan, None, None, 0.0).handlers()
    else:
        from compiler.backends.torch import execute as torch_execute

        handlers = torch_execute._Run(planned.plan, None, None, 0.0).handlers()
    assert missing_handlers(planned.plan, handlers) == []


@pytest.mark.parametrize(("recipe", "sets"), [("recipes/tiny-llama-w8a8.recipe", ()),
                                              ("recipes/tiny-llama-w4a16.recipe", ()),
                                              ("recipes/tiny-llama-w4a16.recipe", ("emit.format=qdq",)),
                                              ("recipes/tiny-bert-lwp.recipe", ())],
                         ids=["w8a8-qdq", "w4a16-matmul_nbits", "w4a16-qdq", "bert-qdq"])
@pytest.mark.slow
def test_onnx_emitter_specs_are_what_it_writes(recipe, sets, tmp_path):
    """The emitter knows every tensor it writes (name, dtype, shape) before writing any."""
    import onnx

    from compiler.backends.onnx.emitters import emitter_for
    from compiler.backends.onnx.execute import model_path
    from compiler.backends.onnx.files import open_model
    from compiler.backends.onnx.rewrite import WeightJob

    out = tmp_path / "m.onnx"
    result, planned = compile_program(recipe, out, *sets)
    jobs = {a.layer.weight: WeightJob(a.layer, a.scheme) for a in result.assignment.layers if not a.scheme.is_none}
    files = open_model(model_path(planned.check.ir.model))
    specs = emitter_for(planned.check.ir.emit.format, files, jobs, out, False).specs()
    files.close()
    names = {onnx.TensorProto.FLOAT: "float32"}
    written = {t.name: (names.get(t.data_type, onnx.TensorProto.DataType.Name(t.data_type).lower()), tuple(t.dims))
               for t in onnx.load(str(out), load_external_data=False).graph.initializer}
    assert specs and all(written.get(s.name) == (s.dtype, s.shape) for s in specs), \
        [(s, written.get(s.name)) for s in specs if written.get(s.name) != (s.dtype, s.shape)][:3]
