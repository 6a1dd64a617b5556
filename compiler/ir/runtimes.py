"""Where an output runs: the runtimes people load qrc's outputs in, the devices they run them on, and one cell of
the runtime table (does this output run there, how, and what shows it). The backends fill the table for their
outputs (each spec's `runtimes`); `qrc check` and `qrc plan` print it, docs/runtimes.md is generated from it, and
`emit … { runtime NAME  device cpu|gpu }` makes an output its target cannot run a coded error before any work
(docs/runtimes.md)."""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from pathlib import Path


class Runtime(enum.Enum):
    """A runtime that loads an output (what `emit … { runtime NAME }` writes)."""
    TRANSFORMERS = "transformers"
    VLLM = "vllm"
    LLAMA_CPP = "llama-cpp"
    ONNXRUNTIME = "onnxruntime"
    GENAI = "genai"  # onnxruntime-genai

    @property
    def label(self) -> str:
        """How the runtime is written in tables."""
        return {"llama-cpp": "llama.cpp", "genai": "onnxruntime-genai"}.get(self.value, self.value)


class Device(enum.Enum):
    """Where the runtime runs the output."""
    CPU = "cpu"
    GPU = "gpu"


class Evidence(enum.Enum):
    """What a cell's claim rests on: a test that runs the output there (kept true on every CI run), a bench
    run recorded in bench/results/runtimes.md with the versions it ran, or the runtime's loader rules as qrc
    restates them (read in its source; no GPU here to run them)."""
    TESTED = "tested"
    BENCH = "bench"
    RULES = "rules"


@dataclass(frozen=True, slots=True)
class RuntimeCell:
    """Whether the output runs in `runtime` on `device`: `how` says in what form (the dtype transformers loads it
    in, the kernel vLLM picks) or, where it does not run, why."""
    runtime: Runtime
    device: Device
    runs: bool
    how: str
    evidence: Evidence

    @property
    def verdict(self) -> str:
        """`runs` or `no`, with the evidence's kind where it is not a test."""
        word = "runs" if self.runs else "no"
        return word if self.evidence is Evidence.TESTED else f"{word} ({self.evidence.value})"


@dataclass(frozen=True, slots=True)
class RuntimeTarget:
    """`emit … { runtime NAME  device cpu|gpu }`: where the output must run. `device` None: this machine's (a GPU
    where one is found, else the CPU), decided when the recipe is checked."""
    runtime: Runtime
    device: Device | None = None


def cell(table: tuple[RuntimeCell, ...], runtime: Runtime, device: Device) -> RuntimeCell | None:
    """The table's cell for `runtime` on `device`; None where the runtime does not open this kind of output."""
    return next((c for c in table if c.runtime is runtime and c.device is device), None)


def this_machine_device() -> Device:
    """GPU when this machine shows an NVIDIA GPU to its processes (`/dev/nvidia0`, not hidden by an empty
    CUDA_VISIBLE_DEVICES), else CPU. Read without torch, as `qrc check` must stay."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return Device.CPU
    return Device.GPU if Path("/dev/nvidia0").exists() else Device.CPU


def table_lines(table: tuple[RuntimeCell, ...]) -> list[str]:
    """One line per runtime: each device's verdict and how (the plan's and `qrc check`'s text)."""
    lines = []
    width = max((len(c.runtime.label) for c in table), default=0)
    for runtime in Runtime:
        cells = [c for c in table if c.runtime is runtime]
        if cells:
            lines.append(f"{runtime.label:<{width}}  {_cells_text(cells)}")
    return lines


def _cells_text(cells: list[RuntimeCell]) -> str:
    """Each device's verdict and how; devices that say the same thing share one entry (`cpu, gpu no: …`)."""
    said: dict[tuple[str, str], list[str]] = {}
    for c in cells:
        said.setdefault((c.verdict, c.how), []).append(c.device.value)
    return " · ".join(f"{', '.join(devices)} {verdict}: {how}" for (verdict, how), devices in said.items())


def check_target(emit, table: tuple[RuntimeCell, ...], diags) -> None:
    """Q275 where `emit … { runtime NAME }` names a runtime that cannot run the output on its device (this
    machine's where `device` is not given): said before any work, with where the output does run."""
    if emit is None or emit.target is None:
        return
    target: RuntimeTarget = emit.target
    device = target.device or this_machine_device()
    found = cell(table, target.runtime, device)
    if found is not None and found.runs:
        return
    where = "; ".join(f"{c.runtime.label} on {c.device.value}" for c in table if c.runs) or "nowhere qrc knows of"
    why = found.how if found is not None else f"{target.runtime.label} does not open this kind of output"
    chosen = "" if target.device else f" ({device.value}: this machine's; say `device gpu` or `device cpu`)"
    diags.error("Q275", f"the output does not run in {target.runtime.label} on {device.value}{chosen}: {why}",
                emit.span_of("runtime") or emit.span_of("path"), f"not run by {target.runtime.label}",
                help=f"it runs in: {where}; pick a scheme and format that {target.runtime.label} runs "
                "(`qrc plan` prints the table)")
