"""`rounding hqq`: float zero points found by half-quadratic splitting, written as MatMulNBits takes them and run
by onnxruntime; refused where an output would round them (the Q277 cases live in tests/cases/diagnostics)."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.ir.types import Granularity, QType, Rounding, WeightQuant
from compiler.quant.weights import quantize_weight, round_weight

K, N, BLOCK = 256, 48, 32


def _heavy_tailed() -> np.ndarray:
    """A weight [K, N] as an ONNX MatMul reads it, with a few large values per column (what HQQ's Lp shrinkage
    keeps out of the zero point's fit)."""
    rng = np.random.RandomState(11)  # the same weight whichever test asks first
    return (rng.standard_t(3, (K, N)) * rng.uniform(0.01, 0.05, (1, N))).astype(np.float32)


@pytest.mark.parametrize("qtype", [QType.UINT4, QType.INT4])
def test_hqq_lowers_the_weight_error_below_rtn_with_float_zero_points(qtype):
    w = _heavy_tailed()
    spec = WeightQuant(qtype, Granularity.GROUP, BLOCK, False)
    rtn = quantize_weight(w, spec, Rounding.RTN, 1, 0)
    hqq = quantize_weight(w, spec, Rounding.HQQ, 1, 0)
    assert hqq.zero_point.dtype == np.float32 and rtn.zero_point.dtype == np.int32
    assert np.any(hqq.zero_point != np.round(hqq.zero_point)), "zero points between the integers"
    low, high = (-8, 7) if qtype is QType.INT4 else (0, 15)
    assert hqq.q.min() >= low and hqq.q.max() <= high
    assert np.abs(hqq.dequantize() - w).mean() < 0.95 * np.abs(rtn.dequantize() - w).mean()


def test_hqq_blocks_do_not_depend_on_the_slices_each_core_rounds():
    w = _heavy_tailed()
    spec = WeightQuant(QType.UINT4, Granularity.GROUP, BLOCK, False)
    whole = quantize_weight(w, spec, Rounding.HQQ, 1, 0)
    sliced = round_weight(w, spec, Rounding.HQQ, 1, 0, slice_bytes=K * 8 * 4)  # 8 columns a slice, every core
    for a, b in ((whole.q, sliced.q), (whole.scale, sliced.scale), (whole.zero_point, sliced.zero_point)):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("qtype", [QType.UINT4, QType.INT4])
def test_matmul_nbits_runs_float_zero_points_as_qrc_dequantizes_them(qtype):
    """The written node, fed the identity, gives back the weight as QuantizedWeight.dequantize computes it: the
    zero points' layout, type and unsigned domain are the ones onnxruntime's kernel reads."""
    import onnx
    import onnxruntime
    from onnx import TensorProto, helper

    from compiler.backends.onnx.rewrite import matmul_nbits

    w = _heavy_tailed()
    qw = quantize_weight(w, WeightQuant(qtype, Granularity.GROUP, BLOCK, False), Rounding.HQQ, 1, 0)
    node = helper.make_node("MatMul", ["x", "w"], ["y"], name="m")
    inits, new = matmul_nbits(node, "w", qw, symmetric=False)
    assert next(i for i in inits if i.name.endswith("_zero_points")).data_type == TensorProto.FLOAT
    graph = helper.make_graph([new], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [K, K])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [K, N])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {"x": np.eye(K, dtype=np.float32)})
    np.testing.assert_allclose(out, qw.dequantize(), rtol=0, atol=1e-6)
    assert onnx.checker.check_model(model) is None



def test_compile_writes_hqq_as_matmul_nbits_with_float_zero_points_and_onnxruntime_runs_it(tmp_path):
    """`qrc compile` on the ONNX backend: every Linear a MatMulNBits whose zero points are floats, verified on the
    emitted model in onnxruntime, its output SQNR there at or above asymmetric rtn's."""
    import onnx
    from compiling import compile_program
    from onnx import TensorProto

    verified = {}
    for rounding in ("rtn", "hqq"):
        out = tmp_path / rounding / "m.onnx"
        recipe = tmp_path / f"{rounding}.recipe"
        recipe.write_text(f'recipe r {{\n  model "builtin:tiny-llama"\n  backend onnx\n'
                          f'  scheme w4 = W4A16 {{ group 64  asymmetric  rounding {rounding} }}\n'
                          '  quantize { type Linear -> w4  "lm_head" -> none }\n'
                          '  verify { samples 4  metric sqnr  at_least 5 }\n'
                          f'  emit "{out}" {{ format matmul_nbits }}\n}}\n')
        result, _ = compile_program(str(recipe), out)
        assert result.verify_passed and "onnxruntime" in result.verified_on, result.verified_on
        verified[rounding] = result.verify["sqnr"]
        zero_points = [i for i in onnx.load(str(out)).graph.initializer if i.name.endswith("_zero_points")]
        assert len(zero_points) == 14
        assert {i.data_type for i in zero_points} == {TensorProto.FLOAT if rounding == "hqq" else TensorProto.UINT8}
    assert verified["hqq"] >= verified["rtn"], verified
