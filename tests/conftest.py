from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pytest  # noqa: E402

import golden  # noqa: E402
from compiler.plan.timing import BFloat16Products  # noqa: E402


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite golden/ files from the current output (refused when CI is set)")


def pytest_configure(config):
    golden.enable_update(config.getoption("--update-golden"))




@pytest.fixture(scope="session", autouse=True)
def _torchrun_logs_in_the_tests_temp(tmp_path_factory):
    """torchrun's log folder (`--log-dir`, read from PET_LOG_DIR) under pytest's temporary folders, which pytest
    prunes, instead of a new /tmp/torchelastic_* folder each launch that nothing removes."""
    if "PET_LOG_DIR" in os.environ:
        yield
        return
    os.environ["PET_LOG_DIR"] = str(tmp_path_factory.mktemp("torchelastic"))
    yield
    os.environ.pop("PET_LOG_DIR", None)


@pytest.fixture(autouse=True)
def _reference_machine_speed(monkeypatch):
    """Plans made in the tests' own process estimate time at the reference machine's rates (plan/timing.py),
    so the plan goldens do not change with the machine that runs them."""
    monkeypatch.setattr("compiler.frontend.machine_speed", lambda cache: 1.0)
    # and its CPU multiplies no bfloat16 in hardware (learned rounding's steps in float32, their time and memory: plan/timing.py, plan/memory.py)
    monkeypatch.setattr("compiler.backends.torch.timing.bfloat16_products", lambda: BFloat16Products.CONVERTED)
    # and a C++ compiler for torch.compile is found (long learned rounding compiles its steps: compiled_steps.py)
    monkeypatch.setattr("compiler.backends.torch.compiled_steps.compiler_found", lambda: True)
    # and numba's compiled loops are cached (a first run's note, quant/loop_cache.py, would depend on the machine)
    monkeypatch.setattr("compiler.backends.torch.cost.uncached", lambda modules: [])
