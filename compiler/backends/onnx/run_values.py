"""The values the ONNX backend's ops hand each other, one type per buffer (compiler/plan/ops.py, Buffer): the
runner holds them (compiler/backends/values.py) and each handler reads only those its op declares.

    onnx_model     Exported     export_onnx: the exported .onnx and the recipe resolved against its graph
    model          OnnxLoaded   load_model (smooth: its smoothed copy): the model's files and its assignment
    memory_mode    OnnxMemory   select_memory_mode: the mode, `disk`, whose resume states this run's are
    sensitivity    Scored       score_sensitivity (compiler/backends/sensitivity.py)
    precision      Assignment   assign_precision: the assignment the search chose
    histograms, ranges, block_inputs
                   Observed     the calibrating ops: observers and Hessians, then each static input's range
    qparams        Rounded      quantize_weights (offload GPTQ: run_block first): the output, rounded into
    emitted_model  Staged       emit: the staged model, beside its destination until verified"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from compiler.backends.onnx.emitters import QdqEmitter
from compiler.backends.onnx.files import ModelFiles
from compiler.backends.onnx.hessians import GptqRounder
from compiler.backends.values import ChosenMemory
from compiler.models.graph import GraphSummary
from compiler.plan.workload import Observation
from compiler.resolve.assignment import Assignment


@dataclass(frozen=True)
class Exported:
    """`onnx_model`: the .onnx file the export made (or the cache held), and the recipe resolved against it."""

    source: Path
    assignment: Assignment


@dataclass(frozen=True)
class OnnxLoaded:
    """`model`: the model's files (graph, weights read on demand), the .onnx they came from, and the recipe
    resolved against its graph."""

    files: ModelFiles
    source: Path
    assignment: Assignment

    @property
    def graph(self) -> GraphSummary:
        """The graph of the model being compiled (an ONNX model's index always has it)."""
        graph = self.assignment.model.graph
        assert graph is not None
        return graph


@dataclass(frozen=True)
class OnnxMemory(ChosenMemory):
    """`memory_mode`: the mode, `memory { disk }`, and whose resume states this run's are (backends/owners.py)."""

    owner: dict = field(default_factory=dict)


@dataclass(eq=False)
class Observed:
    """`histograms`/`ranges`/`block_inputs`: what calibration observed for an assignment (its observers, GPTQ's
    Hessians in the rounder), then each static layer input's quantized range; offload's resume state."""

    assignment: Assignment
    observation: Observation
    observers: dict
    rounder: GptqRounder | None = None
    bounds: dict[str, tuple[float, float]] = field(default_factory=dict)  # layer input → its quantized range
    offload_resume: tuple = (None, None)  # (resume state, Resume) of offload, from cache_block_inputs


@dataclass(eq=False)
class Rounded:
    """`qparams`: the output every rounded weight went into, each weight's SQNR, and the GPTQ weights offload
    rounded as their segments finished."""

    assignment: Assignment
    emitter: QdqEmitter | None = None  # opened when the first weight is rounded (the first rank's alone)
    sqnr: dict[str, float] = field(default_factory=dict)  # weight → its SQNR in dB, as each is rounded
    early: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class Staged:
    """`emitted_model`: the model staged beside its destination, and the assignment it was rounded with."""

    model: Path | None  # None on torchrun's other ranks: the first stages the model
    assignment: Assignment
    unrounded: Rounded | None = None  # what staged it where no op rounded a layer (every layer `-> none`)
