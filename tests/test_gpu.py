"""The GPU paths on a real GPU: `mode multi_gpu` places the blocks on CUDA devices and computes what the CPU
computes, and torchrun's ranks on a machine with fewer GPUs than ranks still share a compile. Skipped where no
CUDA device is visible (CI has none; the placement decisions are tested without one in test_placement.py):
run `python -m pytest tests/test_gpu.py` on a GPU machine."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
from compiling import ROOT, compile_program, rank_env

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible")


@pytest.fixture(autouse=True)
def _at_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def _on_gpu_and_on_cpu(recipe: str, tmp_path):
    """The recipe compiled on the CPU as written and with every block on the first GPU."""
    cpu, _ = compile_program(recipe, tmp_path / "cpu")
    gpu, _ = compile_program(recipe, tmp_path / "gpu", "memory.mode=multi_gpu", "memory.vram=1 x 8 GiB")
    assert not [w for w in gpu.warnings if w.code == "Q407"], [w.message for w in gpu.warnings]  # no fallback
    assert any("GPU 0" in note for note in gpu.notes), gpu.notes
    assert cpu.verify_passed and gpu.verify_passed
    return cpu, gpu


@pytest.mark.parametrize("recipe", ["recipes/tiny-llama-torch-w8a8.recipe", "recipes/tiny-llama-torch-awq.recipe"])
def test_observers_on_the_gpu_see_the_ranges_the_cpu_sees(recipe, tmp_path):
    cpu, gpu = _on_gpu_and_on_cpu(recipe, tmp_path)
    assert cpu.input_ranges.keys() == gpu.input_ranges.keys()
    for layer, (low, high) in cpu.input_ranges.items():  # float32 on both (no TF32): the last bits at most
        assert gpu.input_ranges[layer] == pytest.approx((low, high), rel=1e-4, abs=1e-6), layer
    assert cpu.weight_sqnr.keys() == gpu.weight_sqnr.keys()
    assert all(abs(cpu.weight_sqnr[k] - gpu.weight_sqnr[k]) < 0.05 for k in cpu.weight_sqnr)


def test_gptq_on_the_gpu_rounds_as_well_as_on_the_cpu(tmp_path):
    cpu, gpu = _on_gpu_and_on_cpu("recipes/tiny-llama-torch-gptq.recipe", tmp_path)
    # the Hessians sum in another order on the GPU, so a few weights round the other way: the same quality
    assert all(abs(cpu.weight_sqnr[k] - gpu.weight_sqnr[k]) < 0.5 for k in cpu.weight_sqnr)
    assert cpu.verify is not None and gpu.verify is not None
    assert math.isclose(cpu.verify["cosine"], gpu.verify["cosine"], abs_tol=5e-3), (cpu.verify, gpu.verify)


@pytest.mark.slow
def test_two_ranks_share_a_compile_on_a_machine_with_one_gpu(tmp_path):
    """nccl puts one rank on each GPU; with more ranks than GPUs the group is gloo, and the compile still runs."""
    if torch.cuda.device_count() >= 2:
        pytest.skip("several GPUs: each rank gets its own and nccl is used")
    recipe = ROOT / "recipes/tiny-llama-torch-w8a8.recipe"
    env = rank_env()
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          "-m", "compiler", "compile", str(recipe), "-o", str(tmp_path / "two")],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "two" / "model.safetensors").exists()
