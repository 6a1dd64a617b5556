"""Under torchrun (torch.distributed's launcher, gloo on this CPU), a data-free compile is shared by the ranks:
each rounds its share of the weights and the first writes the folder, byte for byte what one process writes. A
plan the ranks cannot share yet is refused on every rank (Q431) with nothing written."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from compiling import ROOT

pytestmark = pytest.mark.slow  # each case starts torchrun and its ranks

DATA_FREE = 'recipe datafree {\n    model "builtin:tiny-llama"\n    backend torch\n    quantize { type Linear -> W4A16 }\n}\n'


def _qrc(*args: str, ranks: int = 1) -> subprocess.CompletedProcess:
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"] \
        if ranks > 1 else [sys.executable]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "QRC_RANK_TIMEOUT": "120"}
    return subprocess.run([*launcher, "-m", "compiler", *args], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=600)


def test_two_ranks_write_the_bytes_one_process_writes(tmp_path):
    recipe = tmp_path / "r.recipe"
    recipe.write_text(DATA_FREE)
    one = _qrc("compile", str(recipe), "-o", str(tmp_path / "one"))
    two = _qrc("compile", str(recipe), "-o", str(tmp_path / "two"), ranks=2)
    assert one.returncode == 0, one.stderr[-2000:]
    assert two.returncode == 0, two.stderr[-2000:]
    files = sorted(p.name for p in (tmp_path / "one").iterdir())
    assert files == sorted(p.name for p in (tmp_path / "two").iterdir()) and "model.safetensors" in files
    for name in files:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one", "r.recipe", "two"]  # no rank left anything
    assert two.stdout.count("compiled datafree") == 1  # the first rank speaks for all


def test_a_plan_the_ranks_cannot_share_is_refused_on_every_rank(tmp_path):
    out = tmp_path / "out"
    run = _qrc("compile", "recipes/tiny-llama-torch-gptq.recipe", "-o", str(out), ranks=2)
    assert run.returncode != 0
    assert run.stderr.count("error[Q431]") == 1 and "cache_block_inputs" in run.stderr, run.stderr[-2000:]
    assert not out.exists() and list(tmp_path.iterdir()) == []
