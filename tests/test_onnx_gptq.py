"""GPTQ on the ONNX backend: Hessians of MatMul inputs gathered by the calibration passes, weights rounded
against them, emitted as MatMulNBits or QDQ. Judged outside qrc: the emitted models run in onnxruntime on
held-out token ids and are compared with the float model's logits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from compiling import runner
from onnx import numpy_helper

from compiler.cli import app

pytestmark = pytest.mark.slow  # minutes of compiles: `pytest -m "not slow"` skips them

ort = pytest.importorskip("onnxruntime")

RECIPE = """recipe r {{
    model "builtin:tiny-llama"
    scheme w4 {{ weights int4 group 32 symmetric  rounding {rounding} }}
    scheme w8a8 {{ weights int8 per_channel symmetric  activations int8 per_tensor asymmetric  rounding {rounding} }}
    quantize {{ type Linear -> w4  {extra} }}
    calibrate {{ data synthetic {{ samples 64  seqlen 64  seed 0 }}  chunk 16 }}
    memory {{ mode {mode} }}
    emit "{out}" {{ format {fmt} }}
}}
"""


def _compile(tmp: Path, name: str, rounding: str, mode: str = "full", fmt: str = "matmul_nbits",
             extra: str = "") -> Path:
    out = tmp / f"{name}.onnx"
    recipe = tmp / f"{name}.recipe"
    recipe.write_text(RECIPE.format(rounding=rounding, mode=mode, fmt=fmt, extra=extra, out=out))
    result = runner.invoke(app, ["compile", str(recipe)])
    assert result.exit_code == 0, result.output
    return out


def _logits(path: Path, ids: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(["logits"], {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0]


def _kl(reference: np.ndarray, candidate: np.ndarray) -> float:
    def log_softmax(x):
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    p, q = log_softmax(reference.astype(np.float64)), log_softmax(candidate.astype(np.float64))
    return float((np.exp(p) * (p - q)).sum(-1).mean())


def test_gptq_int4_is_closer_to_float_than_rtn_in_onnxruntime(tmp_path):
    from compiler.models import builtin

    ids = np.random.default_rng(123).integers(0, 512, (4, 48), dtype=np.int64)  # not the calibration data
    reference = _logits(builtin.onnx_path("builtin:tiny-llama"), ids)
    kl = {r: _kl(reference, _logits(_compile(tmp_path, r, r), ids)) for r in ("rtn", "gptq")}
    assert kl["gptq"] < 0.95 * kl["rtn"], kl
    model = onnx.load(str(tmp_path / "gptq.onnx"))
    assert sum(n.op_type == "MatMulNBits" for n in model.graph.node) == 15


def test_every_memory_mode_rounds_the_same_bytes_in_qdq(tmp_path):
    """Full (one session), low_memory and offload (one segment at a time, each segment's layers rounded as
    soon as it has seen every chunk) gather the same Hessians and write the same integers; W8A8 layers get
    both an input range and a Hessian from one observed tensor."""
    extra = '"*.self_attn.*" -> w8a8'
    models = [_compile(tmp_path, mode, "gptq", mode, "qdq", extra) for mode in ("full", "low_memory", "offload")]
    inits = [{t.name: numpy_helper.to_array(t) for t in onnx.load(str(m)).graph.initializer} for m in models]
    assert inits[0].keys() == inits[1].keys() == inits[2].keys()
    for other in inits[1:]:
        assert all(np.array_equal(inits[0][k], other[k]) for k in inits[0])
    onnx.checker.check_model(onnx.load(str(models[0])), full_check=True)
    rtn = _compile(tmp_path, "rtn", "rtn", "full", "qdq", extra)
    rounded = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(rtn)).graph.initializer}
    assert any(not np.array_equal(rounded[k], inits[0][k]) for k in rounded if k.endswith("_quantized"))


def test_hessians_survive_the_resume_state(tmp_path):
    from compiler.backends.onnx.resume import ResumeState
    from compiler.quant.gptq import HessianObserver

    observer = HessianObserver(8)
    observer.update(np.random.default_rng(0).normal(size=(3, 5, 8)).astype(np.float32))
    state = ResumeState.for_run(tmp_path, "recipe", "model", "0")
    state.save(2, {"hessian:x": observer})
    done, restored = state.load()
    assert done == 2 and restored["hessian:x"].rows == 15
    np.testing.assert_array_equal(restored["hessian:x"].sum, observer.sum)
