"""Q502: verifying int8 weights' U8S8 kernel on a CPU where onnxruntime's kernel saturates (x86 without VNNI)
says that the figures are this CPU's; uint8 weights (U8U8), VNNI and ARM CPUs get no warning. The CPU is
described by a stand-in /proc/cpuinfo, so each case runs on any machine."""

from __future__ import annotations

import platform

import pytest
from compiling import ROOT, runner

from compiler.backends.onnx import host_cpu
from compiler.cli import app

W8A8, U8U8 = "recipes/tiny-llama-w8a8.recipe", "recipes/tiny-llama-w8a8-u8u8.recipe"
AVX2 = "fpu sse4_1 avx2 fma"
AVX512 = "fpu sse4_1 avx2 avx512f avx512bw"


@pytest.mark.parametrize(("recipe", "machine", "flags", "warned"), [
    (W8A8, "x86_64", AVX2, True),
    (W8A8, "x86_64", AVX512, True),
    (W8A8, "x86_64", AVX512 + " avx512_vnni", False),
    (W8A8, "x86_64", AVX2 + " avx_vnni", False),
    (W8A8, "aarch64", "fp asimd asimddp", False),
    (U8U8, "x86_64", AVX2, False),
])
def test_a_saturating_cpu_is_named_when_it_verifies_int8_weights(recipe, machine, flags, warned, tmp_path,
                                                                  monkeypatch):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: {flags}\n")
    monkeypatch.setattr(host_cpu, "CPUINFO", cpuinfo)
    monkeypatch.setattr(platform, "machine", lambda: machine)
    monkeypatch.chdir(ROOT)
    result = runner.invoke(app, ["compile", recipe, "-o", str(tmp_path / "m.onnx")])
    assert result.exit_code == 0, result.output
    assert ("warning[Q502]" in result.output) is warned, result.output
    if warned:
        assert "14 layers with int8 weights" in result.output and "weights uint8 per_channel asymmetric" in result.output


def test_an_unreadable_cpuinfo_is_no_warning(tmp_path, monkeypatch):
    monkeypatch.setattr(host_cpu, "CPUINFO", tmp_path / "absent")
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    assert host_cpu.u8s8_saturates() is False


def _logits(model, exact: bool):
    import numpy as np
    import onnxruntime as ort

    options = ort.SessionOptions()
    if exact:  # onnxruntime's own switch to its non-saturating U8U8 path on x86 without VNNI
        options.add_session_config_entry("session.x64quantprecision", "1")
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    ids = np.random.default_rng(0).integers(0, 512, (4, 64)).astype(np.int64)
    return session.run(["logits"], {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0]


def test_q502_names_what_onnxruntime_does_on_this_cpu(tmp_path, monkeypatch):
    """Outside qrc: a default onnxruntime session against one with its exact-precision option. Int8 weights
    differ between the two exactly where host_cpu says the kernel saturates (this CPU, whichever it is);
    uint8 weights never do."""
    import numpy as np

    monkeypatch.chdir(ROOT)
    for recipe, name in ((W8A8, "int8.onnx"), (U8U8, "uint8.onnx")):
        result = runner.invoke(app, ["compile", recipe, "-o", str(tmp_path / name)])
        assert result.exit_code == 0, result.output
        assert ("warning[Q502]" in result.output) is (name == "int8.onnx" and host_cpu.u8s8_saturates())
    int8 = np.abs(_logits(tmp_path / "int8.onnx", False) - _logits(tmp_path / "int8.onnx", True)).max()
    uint8 = np.abs(_logits(tmp_path / "uint8.onnx", False) - _logits(tmp_path / "uint8.onnx", True)).max()
    assert uint8 < 1e-5
    assert bool(int8 > 1e-2) is host_cpu.u8s8_saturates(), int8
