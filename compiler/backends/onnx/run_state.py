"""What the ONNX backend's ops share while one plan runs, and the helpers several ops use on it: the model's
graph and what calibration observes, the calibration chunks this rank runs, the resume states, and one weight
read, rounded (GPTQ or the scheme's rounding) and handed to the emitter. The run (execute.py) is this state with
the op handlers on it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx

from compiler import data
from compiler.backends.onnx import rewrite
from compiler.backends.onnx.emitters import QdqEmitter, emitter_for
from compiler.backends.onnx.files import ModelFiles
from compiler.backends.onnx.genai import others_beside, side_files
from compiler.backends.onnx.hessians import GptqRounder, uses_gptq
from compiler.backends.products import Pending
from compiler.backends.program import Produced
from compiler.backends.ranks import Owned, from_environment
from compiler.backends.result import refuse_nonfinite
from compiler.backends.sensitivity import Scores
from compiler.diagnostics import warning
from compiler.ir.types import Calibration, Rounding
from compiler.models.graph import GraphSummary
from compiler.plan.ops import Plan, Verify
from compiler.plan.workload import Observation, observation
from compiler.quant.weights import QuantizedWeight, sqnr_db
from compiler.resolve.assignment import Assignment

Progress = Callable[[str, int], Callable[[], None]]  # (stage, total) → advance-by-one


class OnnxRunState:
    """The state the ops share: the model files, the assignment (the search may change it), observers and
    the activation ranges. Each handler reads its op (and the plan's spans for its diagnostics)."""

    source = Produced[Path]()  # the .onnx file: the export's, or the model's (export_onnx, load_model)
    files = Produced[ModelFiles]()  # load_model
    emitter = Produced[QdqEmitter]()  # made when the first weight is rounded
    rounder = Produced[GptqRounder]()  # GPTQ: Hessians held until their layers are rounded (calibration)

    def __init__(self, assignment: Assignment, plan: Plan, output: Path, progress: Progress,
                 start: float):
        self.assignment, self.plan, self.output = assignment, plan, output
        self.progress, self.start = progress, start
        self.pending = Pending()  # what the run's machinery reports between ops (program.py drains it)
        self._source: Path | None = None
        self._files: ModelFiles | None = None
        self.mode = plan.mode
        self.disk: Path | None = None  # `memory { disk }`, from select_memory_mode
        self._observed: tuple[Assignment, Observation] | None = None  # observation()'s, for its assignment
        self.scores: Scores | None = None
        self.observers: dict = {}
        self.bounds: dict[str, tuple[float, float]] = {}  # layer input → its quantized range
        self.offload_resume: tuple = (None, None)  # (resume state, Resume) of offload, from cache_block_inputs
        self._emitter: QdqEmitter | None = None
        self._rounder: GptqRounder | None = None
        self.sqnr: dict[str, float] = {}  # weight → its SQNR in dB, as each is rounded
        self.rounded_early: set[str] = set()  # offload: the GPTQ weights rounded as their segments finished
        self.owner: dict = {}  # with `disk`: whose its resume states are (onnx/resume.py)
        self.ranks = from_environment()  # torchrun's ranks (backends/ranks.py); one outside torchrun

    @property
    def graph(self) -> GraphSummary:
        """The graph of the model being compiled (an ONNX model's index always has it)."""
        graph = self.assignment.model.graph
        assert graph is not None
        return graph

    def observation(self, calibration: Calibration) -> Observation:
        """What calibration observes for the current assignment (a search may have changed it): worked out once
        per assignment, since passthrough propagation walks the whole graph."""
        if self._observed is None or self._observed[0] is not self.assignment:
            self._observed = (self.assignment, observation(self.assignment, calibration.passthrough))
        return self._observed[1]

    def jobs(self) -> dict[str, rewrite.WeightJob]:
        """Every weight to quantize (by initializer name), with its layer and scheme."""
        return {a.layer.weight: rewrite.WeightJob(a.layer, a.scheme) for a in self.assignment.layers
                if not a.scheme.is_none}

    def _batches(self, calibration: Calibration):
        """The calibration chunks this rank runs: chunk i on rank i mod N (all of them outside torchrun)."""
        held_out = next((op.samples for op in self.plan.ops if isinstance(op, Verify)), 0)  # never calibrated on
        batches = data.calibration_batches(calibration.data, self.assignment.model, calibration.chunk, held_out)
        return batches if self.ranks.world == 1 else Owned(batches, self.ranks)

    def _segments(self):
        from compiler.backends.onnx.segments import cut

        return cut(self.files.light)

    def _open_emitter(self) -> QdqEmitter:
        """The emitter, made when the first weight is rounded. offload keeps the weights out of the .onnx
        too, so verification can open it without loading them; a large output streams its weights to the
        data file as they are rounded."""
        if self._emitter is None:
            emit = self.plan.emit
            self.emitter = emitter_for(emit.format, self.files, self.jobs(), self.output, emit.streams_weights,
                                       emit.accuracy_level)
            self.emitter.side = self._side_files()
        return self.emitter

    def _side_files(self) -> dict[str, bytes]:
        """onnxruntime-genai's files for beside the output, or none (Q449) where another model's are there."""
        side = side_files(self.source, self.output.name, self.assignment.model)
        kept = others_beside(self.output, side)
        if not kept:
            return side
        self.pending.warnings.append(warning(
            "Q449", f"onnxruntime-genai's files for {self.output.name} were not written: {', '.join(kept)} beside "
            "it belong to another model, and genai loads one decoder a folder", self.plan.spans.emit,
            "files kept", help=f"emit each decoder into a folder of its own, e.g. -o {self.output.stem}/"
            f"{self.output.name}"))
        return {}

    def _put(self, node: onnx.NodeProto, init: onnx.TensorProto, job: rewrite.WeightJob) -> None:
        """Read one weight from the data file (refusing non-finite ones, Q409), round it, record its SQNR and
        hand it to the emitter; nothing of it stays here."""
        w = self.files.array(init)
        refuse_nonfinite(self.plan.spans.model, job.layer, w)
        qw = self._round(node, init.name, w, job)
        self.sqnr[init.name] = sqnr_db(w, qw)
        del w  # the float weight goes before the emitter copies the rounded one into its proto
        self._open_emitter().put(init.name, qw)

    def _round(self, node: onnx.NodeProto, weight: str, w: np.ndarray, job: rewrite.WeightJob) -> QuantizedWeight:
        """One weight rounded: GPTQ with its Hessian where the scheme says so (rtn where no dampening makes
        that definite), else the scheme's rounding."""
        if uses_gptq(job) and self._rounder is not None and self._rounder.ready(job.layer.input):
            rtn = rewrite.WeightJob(job.layer, dataclasses.replace(job.scheme, rounding=Rounding.RTN))
            return self.rounder.round(weight, w, node, lambda: rewrite.quantize_for(w, node, rtn))
        return rewrite.quantize_for(w, node, job)

    def _resume_state(self, number: int, group: tuple[str, ...]):
        if self.disk is None:
            return None
        from compiler.backends.onnx.resume import ResumeState

        # under torchrun a rank's state is its own share of the chunks: one file per rank of this world, so a
        # relaunch on as many ranks resumes each where it stopped
        share = (f"rank {self.ranks.rank} of {self.ranks.world}",) if self.ranks.world > 1 else ()
        state = ResumeState.for_run(self.disk, self.plan.recipe_text, str(self.files.path), str(number), *group,
                                    *share)
        if state.exists() and state.load() is None:  # foreign, damaged or older: never trusted, never executed
            self.pending.warnings.append(warning(
                "Q408", f"resume state `{state.path}` is not valid calibration state; starting over",
                self.plan.spans.disk, "ignored", help="nothing in it was used; it is replaced as the run goes"))
            state.remove()
        state.claim(self.owner)
        return state
