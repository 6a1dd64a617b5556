"""Execute a plan on onnxruntime: one handler per plan op (export → load → score/assign → calibrate →
ranges → quantize and rewrite → emit → verify), run in the plan's order by compiler.backends.program."""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from compiler.backends import BackendError
from compiler.backends.agreement import passes
from compiler.backends.gptq_warning import dampened_warning
from compiler.backends.onnx import rewrite
from compiler.backends.onnx.calibrate import calibrate, observe
from compiler.backends.onnx.emitted_check import check_emitted
from compiler.backends.onnx.emitters import activation_specs
from compiler.backends.onnx.exported_model import refuse_other_layers, resolve_export
from compiler.backends.onnx.files import open_model
from compiler.backends.onnx.hessians import PREFIX, GptqRounder, hessian_observers, uses_gptq
from compiler.backends.onnx.host_cpu import saturation_warning
from compiler.backends.onnx.run_state import OnnxRunState, Progress
from compiler.backends.onnx.sensitivity import OnnxScorer
from compiler.backends.onnx.verification import verify_offload, verify_whole
from compiler.backends.products import Product
from compiler.backends.program import execute_plan
from compiler.backends.ranks import Owned, each_machine_first, gather_to_first, merged, merged_one, staged_everywhere
from compiler.backends.release import release_memory
from compiler.backends.result import CompileResult, held_out_batches, judge, refuse_nonfinite
from compiler.backends.sensitivity import assign, score_units
from compiler.diagnostics import error, warning
from compiler.ir.types import Calibration, MemoryMode
from compiler.models import builtin, gguf_file, resolve_path
from compiler.plan import ops
from compiler.plan.ops import Plan
from compiler.quant.smoothing import transform_summary
from compiler.quant.weights import QuantizedWeight, sqnr_db
from compiler.resolve.assignment import Assignment


def model_path(ref: str) -> Path:
    """The .onnx file of a built-in (its cached file) or of a path; folders come from the export op."""
    if ref.startswith(builtin.PREFIX):
        return builtin.onnx_path(ref)
    return resolve_path(ref)


def source_folder(ref: str) -> Path:
    """The HF-style folder the export reads: the folder, or a GGUF file's float32 folder (models/gguf_source.py:
    written once, one tensor at a time)."""
    gguf = gguf_file(ref)
    if gguf is None:
        return resolve_path(ref)
    from compiler.models.gguf_source import float_folder

    folder = float_folder(gguf, ref)
    assert folder is not None  # made here when missing
    return folder


def execute(plan: Plan, assignment: Assignment, output: Path, progress: Progress) -> CompileResult:
    """Run `plan` op by op on onnxruntime (compiler.backends.program.execute_plan). An error onnxruntime raises
    while running the model on the data (a shape one of its kernels refuses) is Q419 with its message:
    the run left nothing at the destination."""
    try:
        return execute_plan(plan, assignment, output, progress,
                            lambda guarded_progress, start: _OnnxRun(assignment, plan, output, guarded_progress,
                                                                      start))
    except Exception as exc:
        if not type(exc).__module__.startswith("onnxruntime"):
            raise
        reason = str(exc).split("Status Message:")[-1].strip().splitlines()[0][:300]
        raise BackendError(error(
            "Q419", f"onnxruntime could not run the model on the calibration or verification data: {reason}",
            plan.spans.data, "refused by onnxruntime",
            help="give data of the shapes the model runs (`qrc explain Q419`); `chunk 1` runs one sample at a "
            "time")) from None


class _OnnxRun(OnnxRunState):
    """The plan's ops, one handler each, on the state they share (run_state.py)."""

    def handlers(self) -> dict[type, Callable]:
        """Each op's handler. The ONNX run still keeps the ops' values on its state (run_state.py): its handlers
        take the op alone, not the runner's view of the values (compiler/backends/values.py) the torch ones read."""
        own: dict[type, Callable] = {
                ops.ExportOnnx: self.export, ops.LoadModel: self.load, ops.SelectMemoryMode: self.select_mode,
                ops.ScoreSensitivity: self.score, ops.AssignPrecision: self.assign, ops.Smooth: self.smooth,
                ops.CalibrateChunk: self.calibrate, ops.CacheBlockInputs: self.cache_block_inputs,
                ops.RunBlock: self.run_blocks, ops.SearchPercentile: self.search_ranges,
                ops.PropagateRanges: self.propagate_ranges, ops.QuantizeWeights: self.quantize, ops.Emit: self.emit,
                ops.Verify: self.verify}
        return {kind: _op_alone(handler) for kind, handler in own.items()}

    def drain(self) -> Product:
        """What the machinery reported while the last op ran (range and resume warnings, the transform)."""
        return self.pending.take()

    def commit(self, values) -> list[Path]:
        """The staged model into place (program.py calls this once every op ran); the first rank's alone."""
        return self.emitter.commit() if self.ranks.first else []

    def close(self, values) -> None:
        """Remove what the run staged and did not commit, and the model's scratch copy."""
        if self._emitter is not None:
            self._emitter.abort()
        if self._files is not None:
            self._files.close()

    # ---- model ------------------------------------------------------------------------------------
    def export(self, op: ops.ExportOnnx) -> Product:
        """The folder's ONNX export (made now, or taken from the cache); the recipe is resolved again against
        its graph, whose layer names are the folder's."""
        from compiler.backends.onnx.export import export_folder
        from compiler.models.exports import cached_export
        advance = self.progress("export", 1)
        folder = source_folder(op.folder)
        cached = cached_export(folder) is not None
        # under torchrun the export cache has one writer per machine; its other ranks then take the cached entry
        self.source = each_machine_first(self.ranks, lambda: export_folder(folder, self.plan.spans.model))
        advance()
        resolved = resolve_export(op.resolve, self.source, self.assignment)  # checked when planning
        refuse_other_layers(self.plan.spans.model, self.assignment, resolved)
        self.assignment = resolved
        return Product(assignment=resolved, from_cache=cached)

    def load(self, op: ops.LoadModel) -> None:
        if self._source is None:  # the export op sets it for a folder
            self.source = model_path(op.model)
        self.files = open_model(self.source)

    def select_mode(self, op: ops.SelectMemoryMode) -> None:
        self.mode, self.disk = op.mode, op.disk
        if self.disk is None:
            return
        from compiler.backends.onnx.resume import remove_superseded
        from compiler.backends.owners import owner

        # whose resume states this run's are: its recipe and model as given (a transform's copy is made later)
        self.owner = owner(self.output, self.plan.recipe_text, str(self.files.path), world=self.ranks.world)
        if self.ranks.first:  # what a killed run with another recipe left here goes
            remove_superseded(self.disk, self.owner)

    # ---- mixed precision ----------------------------------------------------------------------------
    def score(self, op: ops.ScoreSensitivity) -> None:
        scorer = OnnxScorer(op, self.assignment.model, self.files, self.source, self.ranks)
        self.scores = score_units(op, self.disk, self.assignment, scorer, "onnx", self.progress, self.ranks)

    def assign(self, op: ops.AssignPrecision) -> Product:
        self.assignment, search = assign(op, self.assignment, self.scores)
        return Product(assignment=self.assignment, search=search)

    # ---- calibration --------------------------------------------------------------------------------
    def smooth(self, op: ops.Smooth) -> Product:
        """`transform`: before anything is observed or rounded, the model is replaced by its smoothed copy."""
        t = op.settings
        from compiler.backends.onnx.smoothing import smooth

        batches = self._batches(op.calibration)
        advance = self.progress(t.kind.name, len(batches) * (1 if self.mode is not MemoryMode.OFFLOAD
                                                              else len(self._segments())))
        smoothed, gains = smooth(t, self.assignment, self.files, self.mode, batches, self.disk, advance, self.ranks)
        self.files.close()
        self.files = smoothed
        return Product(transform=transform_summary(t, len(self.assignment.smoothing), gains))

    def calibrate(self, op: ops.CalibrateChunk) -> None:
        """Every chunk, `op.passes` times: low_memory splits the observed tensors into groups."""
        cal, files = op.calibration, self.files
        w = self.observation(cal)
        histogram = cal.method.histogram
        batches = self._batches(cal)
        hessians = dict(w.hessian_inputs)
        groups = np.array_split(np.array(w.fetched, dtype=object), op.passes)
        advance = self.progress("calibrate", len(batches) * op.passes)
        states = []
        ranged = set(w.observed)
        for number, group in enumerate(groups):
            observed = tuple(t for t in group if t in ranged)
            gathered = {t: hessians[t] for t in group if t in hessians}
            state = self._resume_state(number, tuple(group))
            states.append(state)
            self.observers.update(calibrate(files.light, files.base_dir, self.graph, observed,
                                            batches, histogram, cal.bins, advance, cal.workers, state, gathered))
        self.observers = merged(self.ranks, self.observers)  # every rank's chunks, merged exactly in rank order
        self.rounder = GptqRounder(self.jobs(), self.observers)
        for state in filter(None, states):  # calibration is complete: nothing to resume
            state.remove()
        self._ranges_if_ready(op, cal)

    def cache_block_inputs(self, op: ops.CacheBlockInputs) -> None:
        """offload: observers (resumed where an interrupted run left them) and the graph inputs' own ranges;
        the block boundaries are cached per chunk as run_block produces them."""
        from compiler.quant.observers import make_observer

        cal = op.calibration
        w = self.observation(cal)
        histogram = cal.method.histogram
        self.observers = {t: make_observer(histogram, cal.bins) for t in w.observed}
        self.observers.update(hessian_observers(dict(w.hessian_inputs)))
        # GPTQ layers are rounded as their segment finishes, and those weights are not part of the resume
        # state: an offload GPTQ run starts over when interrupted
        state = None if w.gptq_layers else self._resume_state(-1, tuple(w.observed))
        resume = None
        if state is not None:
            found = state.load()
            done = 0
            if found is not None and set(found[1]) == set(self.observers):
                done, self.observers = found
            from compiler.backends.onnx.segments import Resume

            resume = Resume(state.path.stem, lambda: done, lambda segments: state.save(segments, self.observers))
        self.offload_resume = (state, resume)
        if not (resume and resume.done()):
            for name in (t for t in w.fetched if t in self.graph.inputs):
                for feed in self._batches(cal):
                    observe(self.observers, name, feed[name])

    def run_blocks(self, op: ops.RunBlock) -> None:
        """offload: one segment's weights in a session at a time, boundaries cached per chunk."""
        from compiler.backends.onnx.segments import cut, run_segments

        cal, files = op.calibration, self.files
        w = self.observation(cal)
        state, resume = self.offload_resume
        batches = self._batches(cal)
        advance = self.progress("calibrate", len(cut(files.light)) * len(batches))
        self.rounder = GptqRounder(self.jobs(), self.observers)
        run_segments(files.light, files.base_dir, self.graph, batches, set(w.fetched),
                     lambda name, value: observe(self.observers, name, value), self.disk, advance, resume,
                     self._round_segment)
        # every rank's chunks, merged exactly in rank order, into the dict the rounder holds (GPTQ's Hessians were
        # merged, used and freed as their segments finished: none is left here)
        self.observers.update(merged(self.ranks, self.observers))
        if state is not None:
            state.remove()
        self._ranges_if_ready(op, cal)

    def _round_segment(self, reported: list[str]) -> None:
        """offload: the GPTQ layers whose input a finished segment produced are rounded now, so only one
        segment's Hessians are ever held; the emitter writes them to the output's data file at once. Under
        torchrun those Hessians are first summed over the ranks (every rank reaches each segment's end: the
        segments are the graph's), then the layers are rounded N at a time as in `quantize`."""
        done = set(reported)
        jobs = self.rounder.jobs
        finished = {name for name, job in jobs.items() if uses_gptq(job) and job.layer.input in done}
        if not finished:
            return
        self.rounded_early |= finished
        inits = {t.name: t for t in self.files.light.graph.initializer if t.name in finished}
        pairs = rewrite.weight_nodes(self.files.light, finished)
        if self.ranks.world > 1:
            held = {PREFIX + jobs[weight].layer.input for weight in finished}
            self.observers.update(merged(self.ranks, {key: self.observers[key] for key in held}))
            self._quantize_shared(pairs, inits, jobs, lambda: None)
        else:
            for node, weight in pairs:
                self._put(node, inits[weight], jobs[weight])
        release_memory()

    # ---- ranges -------------------------------------------------------------------------------------
    def _ranges_if_ready(self, op: ops.PlanOp, calibration: Calibration) -> None:
        """minmax: the observers' ranges are final, so the op that observes produces them (the plan says so)."""
        if ops.Buffer.RANGES in op.outputs:
            self._ranges(calibration, inherited=False)

    def search_ranges(self, op: ops.SearchPercentile) -> None:
        self._ranges(op.calibration, inherited=False)

    def propagate_ranges(self, op: ops.PropagateRanges) -> None:
        self._ranges(op.calibration, inherited=True)

    def _ranges(self, calibration: Calibration, inherited: bool) -> None:
        """The quantized range of each static input: observed ones from their own observer, inherited ones
        (outputs of passthrough ops) from their producer's."""
        sources = self.observation(calibration).source_of
        for a in self.assignment.layers:
            act, tensor = a.scheme.activations, a.layer.input
            if a.scheme.is_none or act is None or tensor in self.bounds or (sources[tensor] != tensor) != inherited:
                continue
            bounds = calibration.method.range(self.observers[sources[tensor]], act.qtype, act.symmetric)
            if bounds is None:
                self.pending.warnings.append(warning(
                    "Q405", f"`{tensor}` was never finite during calibration; left unquantized",
                    a.rule.span if a.rule else None, "no range",
                    help="check the calibration data; masks built from -inf look like this"))
                continue
            self.bounds[tensor] = (float(bounds[0]), float(bounds[1]))

    # ---- weights and output -------------------------------------------------------------------------
    def quantize(self, op: ops.QuantizeWeights) -> Product:
        """Each weight read from the data file, rounded, handed to the emitter and dropped; then the static
        inputs' scales and zero points."""
        calibrated = time.perf_counter() - self.start
        release_memory()
        jobs = self.jobs()
        inits = {t.name: t for t in self.files.light.graph.initializer}
        # the emitter's order, known on every rank; offload rounded its GPTQ layers as their segments finished
        pairs = [(node, weight) for node, weight in rewrite.weight_nodes(self.files.light, jobs)
                 if weight not in self.rounded_early]
        advance = self.progress("quantize", len(pairs))
        if self.ranks.world > 1:
            self._quantize_shared(pairs, inits, jobs, advance)
            if not self.ranks.first:
                return Product()
        else:
            for node, weight in pairs:
                self._put(node, inits[weight], jobs[weight])
                advance()
        emitter = self._open_emitter()
        warnings = (dampened_warning(self.plan.spans.recipe, self.rounder.dampened),) \
            if self._rounder is not None and self._rounder.dampened else ()
        for tensor, qparams_ in activation_specs(self.assignment, self.files.light, self.bounds).items():
            emitter.put(tensor, qparams_)
        sqnr = tuple((a.layer.name, self.sqnr[a.layer.weight]) for a in self.assignment.layers
                     if a.layer.weight in self.sqnr)
        ranges = tuple((a.layer.name, self.bounds[a.layer.input]) for a in self.assignment.layers
                       if a.scheme.activations is not None and a.layer.input in self.bounds)
        return Product(warnings=warnings, calibration_seconds=calibrated, weight_sqnr=sqnr, input_ranges=ranges)

    def _quantize_shared(self, pairs, inits: dict, jobs: dict[str, rewrite.WeightJob], advance) -> None:
        """torchrun's ranks round the weights N at a time, weight start + r on rank r; each round the rounded
        weights and their figures go to the first rank, which hands them to the emitter (its layout is the
        graph's, so the bytes are one process's). At most N rounded weights are in flight."""
        for start in range(0, len(pairs), self.ranks.world):
            mine: dict[str, tuple[QuantizedWeight, float]] = {}
            for k, (node, weight) in enumerate(pairs[start:start + self.ranks.world]):
                if k == self.ranks.rank:
                    w = self.files.array(inits[weight])
                    refuse_nonfinite(self.plan.spans.model, jobs[weight].layer, w)
                    qw = self._round(node, weight, w, jobs[weight])
                    mine[weight] = (qw, sqnr_db(w, qw))
                elif self._rounder is not None and uses_gptq(jobs[weight]):
                    self._rounder.skip(weight)  # another rank rounds it: its Hessian goes when no one here needs it
            dampened = self._rounder.dampened if self._rounder is not None else {}
            for handed, their_dampened in gather_to_first(self.ranks, (mine, dampened)):
                for weight, (qw, figure) in handed.items():
                    self.sqnr[weight] = figure
                    self._open_emitter().put(weight, qw)
                if self._rounder is not None:
                    self._rounder.dampened.update(their_dampened)
            for _ in pairs[start:start + self.ranks.world]:
                advance()

    def emit(self, op: ops.Emit) -> Product:
        """Float initializers kept as they are, provenance stamped, the file written atomically (by the first
        rank: the others write nothing)."""
        if not self.ranks.first:
            return Product()
        emitter = self.emitter
        for tensor in self.files.light.graph.initializer:
            if tensor.name not in emitter.jobs:
                emitter.copy_raw(tensor.name)
        for key, value in self.plan.provenance:
            emitter.metadata(key, value)
        offload = self.mode is MemoryMode.OFFLOAD
        # verification opens the model in onnxruntime; without it, this check does
        check = None if self.plan.first(ops.Verify) else (
            lambda staged: check_emitted(staged, self.plan.spans.emit, offload))
        staged = tuple(emitter.finish(check))  # beside the destination until verified
        release_memory()  # the quantized model's proto and pages go before verification
        return Product(files=staged)

    def _layer_errors(self, op: ops.Verify, staged: Path) -> dict[str, float]:
        """Each quantized layer's added error on a few held-out samples (offload: segment by segment, the
        layer tensors cached on disk)."""
        from compiler.backends.onnx.attribution import staged_layer_errors

        samples = held_out_batches(op, self.assignment.model, self.pending.warnings, chunk=1)
        samples = dataclasses.replace(samples, samples=min(samples.samples, 4))
        offload = self.mode is MemoryMode.OFFLOAD
        return staged_layer_errors(self.assignment, self.files, staged, samples,
                                   (self.disk or Path(tempfile.gettempdir())) if offload else None)

    def verify(self, op: ops.Verify) -> Product:
        """Measured on the staged model; then it goes into place (a failed verification leaves it there,
        beside its figures), so an interrupt before this point leaves nothing at the destination. Under torchrun
        the first rank stages the model: ranks on its machine open that file and each runs its share of the
        held-out chunks, the sums merged in rank order; ranks on other machines run a copy the first rank sends
        them (ranks.staged_everywhere), removed after."""
        with tempfile.TemporaryDirectory(prefix="qrc-staged-") as scratch:
            here = staged_everywhere(self.ranks, self.emitter.staged_model.parent if self.ranks.first else None,
                                     Path(scratch)) / self.output.name
            if self.mode is MemoryMode.OFFLOAD:  # a sample at a time
                batches = held_out_batches(op, self.assignment.model, self.pending.warnings, chunk=1)
                agreement = verify_offload(self.assignment, self.files, here, Owned(batches, self.ranks), self.disk,
                                           self.progress)
            else:
                batches = held_out_batches(op, self.assignment.model, self.pending.warnings)
                agreement = verify_whole(self.files.path, here, Owned(batches, self.ranks), self.progress)
        agreement = merged_one(self.ranks, agreement)
        failed = not passes(agreement.value(op.metric), op.bound, op.threshold)
        # Q501's help: the first rank's, on the model it staged
        errors = self._layer_errors(op, self.emitter.staged_model) if failed and self.ranks.first else {}
        measured_on = "the emitted model, run by onnxruntime" + (
            f", its held-out samples shared by {self.ranks.world} torchrun ranks" if self.ranks.world > 1 else "")
        verdict = judge(op, self.plan.spans.verify, self.output, agreement, measured_on, errors,
                        self.ranks.first)  # the model goes into place after the last op
        saturation = saturation_warning(self.assignment, self.plan.emit.format, self.plan.spans.verify)
        if saturation is not None and self.ranks.first:
            self.pending.warnings.append(saturation)
        return Product(verification=verdict)


def _op_alone(handler: Callable) -> Callable[[ops.PlanOp, object], Product | None]:
    """A handler that reads its op and the run's state, called as the runner calls every handler."""
    return lambda op, values: handler(op)
