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
