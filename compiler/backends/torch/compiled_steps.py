"""Whether learned rounding's steps run through torch.compile (torch/learned.py): the plan decides (torch/timing.py
`learning_compiled`), counts it in its time and hands it to the run (run_block's `compiled_steps`). No torch
import: `qrc plan` asks this.

A step is a block's forward with every learned weight rounded as it runs, then its backward: a few dozen
element-wise operations around each matrix product, which run one by one in eager torch. Compiled (inductor), they
are fused into the products' loops: on SmolLM2-135M's blocks (8 samples of 512 tokens, two AMX cores) a step took
0.115 s against 0.22 s eager, for about 2 s of compiling (20 s with torch's compile cache cold), once per run: the
blocks share the compiled code. AutoRound compiles its steps too. Small runs (every test's model) are not worth
the compile, so only work above COMPILE_AT_FLOPS compiles."""

from __future__ import annotations

import os
import shutil
import sys

# The learned layers' forward FLOPs over every step of the run (2 x weights x tokens a step x steps) above which
# the steps compile: 4e12 is about 30 s of eager steps on two AVX-512 cores (forward and backward), where
# compiling costs 2-20 s. SmolLM2-135M's example recipe: 4.3e13; the tests' tiny models: under 1e11.
COMPILE_AT_FLOPS = 4e12


def compile_turned_off() -> bool:
    """torch's own switch: TORCHDYNAMO_DISABLE=1 makes torch.compile a no-op, so the steps are planned eager."""
    return os.environ.get("TORCHDYNAMO_DISABLE", "") in ("1", "true", "True")


def compiler_found() -> bool:
    """Whether torch's inductor can build CPU kernels here: the C++ compiler it calls ($CXX, else g++; clang++ on
    macOS: torch._inductor.config.cpp.cxx) is on the PATH."""
    default = "clang++" if sys.platform == "darwin" else "g++"
    name = os.environ.get("CXX", default)
    return bool(name) and shutil.which(name) is not None  # an empty CXX names no compiler


def learned_flops(iters: int, samples_a_step: int, seqlen: int, learned_weights: int) -> float:
    """The learned layers' forward FLOPs over every step of the run."""
    return 2.0 * learned_weights * samples_a_step * seqlen * iters


def steps_compiled(iters: int, samples_a_step: int, seqlen: int, learned_weights: int) -> bool:
    """Whether the steps compile: enough work to pay for it, and a compiler to build with."""
    return learned_flops(iters, samples_a_step, seqlen, learned_weights) >= COMPILE_AT_FLOPS and \
        not compile_turned_off() and compiler_found()
