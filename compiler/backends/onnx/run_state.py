"""What the ONNX backend's ops share while one plan runs (services only), and the helpers several ops use: the
calibration chunks this rank runs, the resume states, the emitter opened once, and one weight read, rounded (GPTQ
or the scheme's rounding) and handed to it. The run (execute.py) is this state with the op handlers on it."""

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
from compiler.backends.onnx.run_values import OnnxLoaded, OnnxMemory, Rounded
from compiler.backends.products import Pending
from compiler.backends.ranks import Owned, from_environment
from compiler.backends.result import refuse_nonfinite
from compiler.diagnostics import warning
from compiler.ir.types import Calibration, Rounding
from compiler.plan.ops import Plan, Verify
from compiler.plan.workload import Observation, observation
from compiler.quant.weights import QuantizedWeight, sqnr_db
from compiler.resolve.assignment import Assignment

Progress = Callable[[str, int], Callable[[], None]]  # (stage, total) → advance-by-one


SERVICES = ("plan", "output", "progress", "start", "pending", "ranks")  # the run state, whole


class OnnxRunState:
    """The services every op may use: the plan (its spans, for diagnostics), the destination, progress, the
    start time, what the machinery reports between ops (`pending`: program.py drains it) and torchrun's ranks.
    The values the ops hand each other are the runner's (compiler/backends/values.py; their types in
    run_values.py), and each handler reads only those its op declares."""

    __slots__ = SERVICES

    def __init__(self, plan: Plan, output: Path, progress: Progress, start: float):
        self.plan, self.output, self.progress, self.start = plan, output, progress, start
        self.pending = Pending()
        self.ranks = from_environment()  # torchrun's ranks (backends/ranks.py); one outside torchrun

    def _batches(self, calibration: Calibration, assignment: Assignment):
        """The calibration chunks this rank runs: chunk i on rank i mod N (all of them outside torchrun)."""
        held_out = next((op.samples for op in self.plan.ops if isinstance(op, Verify)), 0)  # never calibrated on
        batches = data.calibration_batches(calibration.data, assignment.model, calibration.chunk, held_out)
        return batches if self.ranks.world == 1 else Owned(batches, self.ranks)

    def _emitter(self, loaded: OnnxLoaded, rounded: Rounded) -> QdqEmitter:
        """The emitter, made when the first weight is rounded. offload keeps the weights out of the .onnx
        too, so verification can open it without loading them; a large output streams its weights to the
        data file as they are rounded."""
        if rounded.emitter is None:
            emit = self.plan.emit
            rounded.emitter = emitter_for(emit.format, loaded.files, jobs_of(rounded.assignment), self.output,
                                          emit.streams_weights, emit.accuracy_level)
            rounded.emitter.side = self._side_files(loaded.source, rounded.assignment)
        return rounded.emitter

    def _side_files(self, source: Path, assignment: Assignment) -> dict[str, bytes]:
        """onnxruntime-genai's files for beside the output, or none (Q449) where another model's are there."""
        side = side_files(source, self.output.name, assignment.model)
        kept = others_beside(self.output, side)
        if not kept:
            return side
        self.pending.warnings.append(warning(
            "Q449", f"onnxruntime-genai's files for {self.output.name} were not written: {', '.join(kept)} beside "
            "it belong to another model, and genai loads one decoder a folder", self.plan.spans.emit,
            "files kept", help=f"emit each decoder into a folder of its own, e.g. -o {self.output.stem}/"
            f"{self.output.name}"))
        return {}

    def _put(self, loaded: OnnxLoaded, rounder: GptqRounder | None, rounded: Rounded, node: onnx.NodeProto,
             init: onnx.TensorProto, job: rewrite.WeightJob) -> None:
        """Read one weight from the data file (refusing non-finite ones, Q409), round it, record its SQNR and
        hand it to the emitter; nothing of it stays here."""
        w = loaded.files.array(init)
        refuse_nonfinite(self.plan.spans.model, job.layer, w)
        qw = round_weight(rounder, node, init.name, w, job)
        rounded.sqnr[init.name] = sqnr_db(w, qw)
        del w  # the float weight goes before the emitter copies the rounded one into its proto
        self._emitter(loaded, rounded).put(init.name, qw)

    def _resume_state(self, memory: OnnxMemory, files: ModelFiles, number: int, group: tuple[str, ...]):
        if memory.disk is None:
            return None
        from compiler.backends.onnx.resume import ResumeState

        # under torchrun a rank's state is its own share of the chunks: one file per rank of this world, so a
        # relaunch on as many ranks resumes each where it stopped
        share = (f"rank {self.ranks.rank} of {self.ranks.world}",) if self.ranks.world > 1 else ()
        state = ResumeState.for_run(memory.disk, self.plan.recipe_text, str(files.path), str(number), *group,
                                    *share)
        if state.exists() and state.load() is None:  # foreign, damaged or older: never trusted, never executed
            self.pending.warnings.append(warning(
                "Q408", f"resume state `{state.path}` is not valid calibration state; starting over",
                self.plan.spans.disk, "ignored", help="nothing in it was used; it is replaced as the run goes"))
            state.remove()
        state.claim(memory.owner)
        return state


def jobs_of(assignment: Assignment) -> dict[str, rewrite.WeightJob]:
    """Every weight to quantize (by initializer name), with its layer and scheme."""
    return {a.layer.weight: rewrite.WeightJob(a.layer, a.scheme) for a in assignment.layers if not a.scheme.is_none}


def observed_for(assignment: Assignment, calibration: Calibration) -> Observation:
    """What calibration observes for `assignment` (passthrough propagation walks the whole graph: once per
    calibration, kept in the `Observed` value)."""
    return observation(assignment, calibration.passthrough)


def segments_of(files: ModelFiles):
    """offload: the graph's segments, run one at a time."""
    from compiler.backends.onnx.segments import cut

    return cut(files.light)


def round_weight(rounder: GptqRounder | None, node: onnx.NodeProto, weight: str, w: np.ndarray,
           job: rewrite.WeightJob) -> QuantizedWeight:
    """One weight rounded: GPTQ with its Hessian where the scheme says so (rtn where no dampening makes
    that definite), else the scheme's rounding."""
    if uses_gptq(job) and rounder is not None and rounder.ready(job.layer.input):
        rtn = rewrite.WeightJob(job.layer, dataclasses.replace(job.scheme, rounding=Rounding.RTN))
        return rounder.round(weight, w, node, lambda: rewrite.quantize_for(w, node, rtn))
    return rewrite.quantize_for(w, node, job)
