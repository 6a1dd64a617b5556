"""The kernels `qrc plan` says onnxruntime will run each quantized layer with are the ones onnxruntime's graph
optimizer makes of the emitted file; on ONNX the presets write uint8 activations (the fused form) and a
recipe that names int8 gets Q437."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import onnx
import onnxruntime as ort
import pytest
from typer.testing import CliRunner

from compiler import check_file, plan_file
from compiler.backends.onnx.kernels import layer_kernels
from compiler.cli import app
from compiler.ir.types import QType
from compiler.plan.ops import Emit
from compiler.plugins import EMIT_FORMATS

runner = CliRunner()

CASES = {
    "llama-preset": ("builtin:tiny-llama", 'scheme s = W8A8', '"*" -> s  "lm_head" -> W8A16  "model.embed_tokens" -> none',
                     "qdq"),
    "llama-int8": ("builtin:tiny-llama", "scheme s = W8A8 { activations int8 }", '"*" -> s  "model.embed_tokens" -> none',
                   "qdq"),
    "llama-nbits": ("builtin:tiny-llama", "scheme s = W4A16 { group 32 }",
                    '"*" -> s  "lm_head" -> W8A8  "model.embed_tokens" -> none', "matmul_nbits"),
    "cnn": ("builtin:tiny-cnn", "scheme s = W8A8", "type Linear -> s  type Conv -> s", "qdq"),
    "bert-preset": ("builtin:tiny-bert", "scheme s = W8A8", "type Linear -> s", "qdq"),
    "bert-int8": ("builtin:tiny-bert", "scheme s = W8A8 { activations int8 }", "type Linear -> s", "qdq"),
}


def _recipe(tmp_path: Path, case: str) -> Path:
    model, scheme, rules, fmt = CASES[case]
    path = tmp_path / f"{case}.recipe"
    path.write_text(f'recipe k {{ model "{model}" {scheme}\n quantize {{ {rules} }}\n'
                    " calibrate { data synthetic { samples 4 seqlen 32 } chunk 4 }\n"
                    f' emit "{tmp_path / case}.onnx" {{ format {fmt} }} }}\n')
    return path


def _optimized_kernels(path: Path, tmp_path: Path) -> dict[str, str]:
    """weight name → what onnxruntime's optimized graph runs it with (the node reading its quantized form,
    or `DequantizeLinear + float OP` where a DequantizeLinear still feeds a float op)."""
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    graph = onnx.load(options.optimized_model_filepath, load_external_data=False).graph
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    found = {}
    for name, nodes in readers.items():
        for suffix in ("_quantized", "_dequantized", "_Q4", "_quantized_T"):
            if name.endswith(suffix):
                node = nodes[0]
                weight = name.removesuffix(suffix)
                if node.op_type == "DequantizeLinear":
                    node = readers[node.output[0]][0]
                    found[weight] = f"DequantizeLinear + float {node.op_type.removeprefix('Fused')}"
                else:
                    float_op = node.op_type.removeprefix("Fused")  # FusedGemm: a Gemm with its activation
                    found[weight] = node.op_type if suffix != "_dequantized" else f"DequantizeLinear + float {float_op}"
    return found


@pytest.mark.parametrize("case", list(CASES))
def test_plan_names_the_kernels_onnxruntime_runs(tmp_path: Path, case: str) -> None:
    recipe = _recipe(tmp_path, case)
    result = plan_file(recipe)
    assert result.plan is not None, [d.message for d in result.diagnostics]
    assignment = result.check.assignment
    fmt = EMIT_FORMATS.lookup(CASES[case][3])
    planned = {assignment.of(name).layer.weight: kernel for name, kernel in layer_kernels(assignment, fmt).items()}
    emit = result.plan.first(Emit)
    assert emit is not None and "onnxruntime CPU kernels:" in emit.summary
    assert runner.invoke(app, ["compile", str(recipe)]).exit_code == 0
    measured = _optimized_kernels(tmp_path / f"{case}.onnx", tmp_path)
    assert measured == planned
    for kernel, n in Counter(planned.values()).items():
        assert f"{n} {kernel}" in emit.summary


def test_onnx_presets_write_uint8_activations_and_named_int8_warns(tmp_path: Path) -> None:
    preset = check_file(_recipe(tmp_path, "llama-preset"), with_model=True)
    assert preset.ir is not None and preset.ir.scheme("s").activations.qtype is QType.UINT8
    assert not [d for d in preset.diagnostics if d.code == "Q437"]
    named = check_file(_recipe(tmp_path, "llama-int8"), with_model=True)
    assert named.ir is not None and named.ir.scheme("s").activations.qtype is QType.INT8
    assert [d.code for d in named.diagnostics] == ["Q437"]
    torch_side = tmp_path / "t.recipe"
    torch_side.write_text('recipe t { model "builtin:tiny-llama" backend torch\n quantize { type Linear -> W8A8 } }\n')
    ir = check_file(torch_side).ir
    assert ir is not None and ir.scheme("W8A8").activations.qtype is QType.INT8  # compressed-tensors' W8A8
