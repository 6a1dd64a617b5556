"""Plan IR: frozen ops in execution order, each with its parameters, buffers and estimated peak bytes."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from compiler.ir.types import MemoryMode


class OpKind(enum.Enum):
    LOAD_MODEL = "load_model"
    SELECT_MEMORY_MODE = "select_memory_mode"
    CALIBRATE_CHUNK = "calibrate_chunk"
    CACHE_BLOCK_INPUTS = "cache_block_inputs"
    RUN_BLOCK = "run_block"
    SEARCH_PERCENTILE = "search_percentile"
    PROPAGATE_RANGES = "propagate_ranges"
    SCORE_SENSITIVITY = "score_sensitivity"
    ASSIGN_PRECISION = "assign_precision"
    QUANTIZE_WEIGHTS = "quantize_weights"
    EMIT = "emit"
    VERIFY = "verify"


@dataclass(frozen=True, slots=True)
class PlanOp:
    """One step. `repeat` > 1 is the compact form of identical steps (`calibrate_chunk × 8`).

    `inputs`/`outputs` name buffers (model, calibration_data, observers, ranges, qparams, …) so a verifier
    can check that everything is produced before it is used. `peak_bytes` is the estimated resident
    memory of the whole process while the op runs.
    """

    kind: OpKind
    summary: str
    params: tuple[tuple[str, str], ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    peak_bytes: int
    repeat: int = 1
    layers: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ModeEstimate:
    """The estimated peak of one memory mode, and the parts it is made of."""

    mode: MemoryMode
    peak_ram: int
    parts: tuple[tuple[str, int], ...]
    peak_vram: int = 0
    feasible: bool = True  # False: the mode does not apply (multi_gpu without GPUs, …)
    note: str = ""


@dataclass(frozen=True, slots=True)
class ModeDecision:
    mode: MemoryMode | None  # None: nothing fits (Q301)
    requested: MemoryMode
    ram_budget: int
    ram_source: str  # "recipe" | "detected"
    vram_budget: tuple[int, ...]
    tried: tuple[tuple[ModeEstimate, bool], ...]  # each candidate and whether it fit
    reason: str


@dataclass(frozen=True, slots=True)
class Plan:
    recipe: str
    source: str
    model: str
    backend: str
    layers: int
    quantized_layers: int
    decision: ModeDecision
    ops: tuple[PlanOp, ...]
    notes: tuple[str, ...] = ()

    @property
    def peak_bytes(self) -> int:
        return max((op.peak_bytes for op in self.ops), default=0)
