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
from compiler.backends.onnx.files import ModelFiles, open_model
from compiler.backends.onnx.hessians import PREFIX, GptqRounder, hessian_observers, uses_gptq
from compiler.backends.onnx.host_cpu import saturation_warning
from compiler.backends.onnx.run_state import OnnxRunState, Progress, jobs_of, observed_for, round_weight, segments_of
from compiler.backends.onnx.run_values import Exported, Observed, OnnxLoaded, OnnxMemory, Rounded, Staged
from compiler.backends.onnx.sensitivity import OnnxScorer
from compiler.backends.onnx.verification import verify_offload, verify_whole
from compiler.backends.products import Product
from compiler.backends.program import execute_plan
from compiler.backends.ranks import Owned, each_machine_first, gather_to_first, merged, merged_one, staged_everywhere
from compiler.backends.release import release_memory
from compiler.backends.result import CompileResult, held_out_batches, judge, refuse_nonfinite
from compiler.backends.sensitivity import Scored, score_units
from compiler.backends.shared_ops import assign_precision
from compiler.backends.values import OpValues, Values
from compiler.diagnostics import error, warning
from compiler.ir.types import Calibration
from compiler.models import builtin, gguf_file, resolve_path
from compiler.models.onnx_index import graph_summary
from compiler.plan import ops
from compiler.plan.ops import Buffer, Plan
from compiler.quant.smoothing import transform_summary
from compiler.quant.weights import QuantizedWeight, sqnr_db
from compiler.resolve.assignment import Assignment
from compiler.resolve.rotation_widths import rotation_words


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
                            lambda guarded_progress, start: _OnnxRun(plan, output, guarded_progress, start))
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
    """The plan's ops, one handler each, on the services they share (run_state.py), each reading the values
    its op declares (run_values.py)."""

    __slots__ = ()

    def handlers(self) -> dict[type, Callable]:
        return {ops.ExportOnnx: self.export, ops.LoadModel: self.load, ops.SelectMemoryMode: self.select_mode,
                ops.ScoreSensitivity: self.score, ops.AssignPrecision: assign_precision, ops.Smooth: self.smooth,
                ops.CalibrateChunk: self.calibrate, ops.CacheBlockInputs: self.cache_block_inputs,
                ops.RunBlock: self.run_blocks, ops.SearchPercentile: self.search_ranges,
                ops.PropagateRanges: self.propagate_ranges, ops.QuantizeWeights: self.quantize, ops.Emit: self.emit,
                ops.Verify: self.verify}

    def drain(self) -> Product:
        """What the machinery reported while the last op ran (range and resume warnings, the transform)."""
        return self.pending.take()

    def commit(self, values: Values) -> list[Path]:
        """The staged model into place (program.py calls this once every op ran); the first rank's alone."""
        rounded = self._rounded(values)
        if not self.ranks.first:
            return []
        assert rounded is not None and rounded.emitter is not None, "the first rank staged the model"
        return rounded.emitter.commit()

    @staticmethod
    def _rounded(values: Values) -> Rounded | None:
        """What holds the staged model's emitter: the rounding's, or the emit's own where nothing was rounded."""
        staged = values.held(Buffer.EMITTED_MODEL, Staged)
        return values.held(Buffer.QPARAMS, Rounded) or (staged.unrounded if staged is not None else None)

    def close(self, values: Values) -> None:
        """Remove what the run staged and did not commit, and the model's scratch copy."""
        rounded, loaded = self._rounded(values), values.held(Buffer.MODEL, OnnxLoaded)
        if rounded is not None and rounded.emitter is not None:
            rounded.emitter.abort()
        if loaded is not None:
            loaded.files.close()

    # ---- model ------------------------------------------------------------------------------------
    def export(self, op: ops.ExportOnnx, v: OpValues) -> Product:
        """The folder's ONNX export (made now, or taken from the cache); the recipe is resolved again against
        its graph, whose layer names are the folder's."""
        from compiler.backends.onnx.export import export_folder
        from compiler.models.exports import cached_export
        assignment = v.get(Buffer.RECIPE, Assignment)
        advance = self.progress("export", 1)
        folder = source_folder(op.folder)
        cached = cached_export(folder) is not None
        # under torchrun the export cache has one writer per machine; its other ranks then take the cached entry
        source = each_machine_first(self.ranks, lambda: export_folder(folder, self.plan.spans.model))
        advance()
        resolved = resolve_export(op.resolve, source, assignment)  # checked when planning
        refuse_other_layers(self.plan.spans.model, assignment, resolved)
        v.put(Buffer.ONNX_MODEL, Exported(source, resolved))
        return Product(assignment=resolved, from_cache=cached)

    def load(self, op: ops.LoadModel, v: OpValues) -> Product | None:
        """The graph only: weights stay in the data file until a session or the quantizer reads them."""
        if v.declares(Buffer.ONNX_MODEL):  # a folder's export
            exported = v.get(Buffer.ONNX_MODEL, Exported)
            source, assignment = exported.source, exported.assignment
        else:
            source, assignment = model_path(op.model), v.get(Buffer.RECIPE, Assignment)
        files = open_model(source, self._scratch())
        if op.rotation is not None:  # a rotated copy is compiled instead (onnx/rotation.py), its graph summarized
            files = self._rotated(op, files, assignment)  # again (R4's nodes: calibration's sessions keep them)
            index = assignment.model
            assignment = dataclasses.replace(assignment, model=dataclasses.replace(
                index, graph=graph_summary(files.light, index.config)))
        v.put(Buffer.MODEL, OnnxLoaded(files, source, assignment))
        return Product(transform=rotation_words(op.rotation)) if op.rotation is not None else None

    def _rotated(self, op: ops.LoadModel, files: ModelFiles, assignment: Assignment) -> ModelFiles:
        """The model's rotated copy (onnx/rotation.py rotated_copy), its progress shown."""
        from compiler.backends.onnx.rotation import rotated_copy

        assert op.rotation is not None
        advance = self.progress("rotate", 1)
        rotated = rotated_copy(files, assignment.model, op.rotation, self.plan.spans.transform or self.plan.spans.model,
                               self._scratch())
        advance()
        return rotated

    def _scratch(self) -> Path | None:
        """Where copies of the model are written before the memory mode is selected: the recipe's `memory { disk }`
        (the folder it gives for what the run writes on the side), else None (the temporary folder)."""
        select = self.plan.first(ops.SelectMemoryMode)
        return select.disk if isinstance(select, ops.SelectMemoryMode) else None

    def select_mode(self, op: ops.SelectMemoryMode, v: OpValues) -> None:
        """The mode as planned; with `disk`, whose resume states this run's are (a killed run's with another
        recipe go)."""
        if op.disk is None:
            v.put(Buffer.MEMORY_MODE, OnnxMemory(op.mode))
            return
        from compiler.backends.onnx.resume import remove_superseded
        from compiler.backends.owners import owner

        # whose resume states this run's are: its recipe and model as given (not a transform's copy)
        owned = owner(self.output, self.plan.recipe_text, str(v.get(Buffer.MODEL, OnnxLoaded).source),
                      world=self.ranks.world)
        if self.ranks.first:  # what a killed run with another recipe left here goes
            remove_superseded(op.disk, owned)
        v.put(Buffer.MEMORY_MODE, OnnxMemory(op.mode, op.disk, owned))

    # ---- mixed precision ----------------------------------------------------------------------------
    def score(self, op: ops.ScoreSensitivity, v: OpValues) -> None:
        """Each searched unit's loss under each choice (cached by content under `disk` or $QRC_CACHE)."""
        loaded, memory = v.get(Buffer.MODEL, OnnxLoaded), v.get(Buffer.MEMORY_MODE, OnnxMemory)
        scorer = OnnxScorer(op, loaded.assignment.model, loaded.files, loaded.source, self.ranks)
        scores = score_units(op, memory.disk, loaded.assignment, scorer, "onnx", self.progress, self.ranks)
        v.put(Buffer.SENSITIVITY, Scored(loaded.assignment, scores))

    # ---- calibration --------------------------------------------------------------------------------
    def smooth(self, op: ops.Smooth, v: OpValues) -> Product:
        """`transform`: before anything is observed or rounded, the model is replaced by its smoothed copy."""
        from compiler.backends.onnx.rotation import online_down
        from compiler.backends.onnx.smoothing import smooth

        t = op.settings
        loaded, memory = v.get(Buffer.MODEL, OnnxLoaded), v.get(Buffer.MEMORY_MODE, OnnxMemory)
        assignment = _final(v, loaded)
        batches = self._batches(op.calibration, assignment)
        advance = self.progress(t.kind.name, len(batches) * (len(segments_of(loaded.files)) if memory.offload else 1))
        turning = online_down(t, assignment.model)
        smoothed, searched = smooth(t, assignment, loaded.files, memory.mode, batches, memory.disk, advance, self.ranks,
                                    turning)
        loaded.files.close()
        loaded = dataclasses.replace(loaded, files=smoothed)
        if turning is not None:  # its graph summarized again: calibration's sessions keep R4's nodes
            index = loaded.assignment.model
            loaded = dataclasses.replace(loaded, assignment=dataclasses.replace(loaded.assignment, model=dataclasses.replace(
                index, graph=graph_summary(smoothed.light, index.config))))
        v.put(Buffer.MODEL, loaded)
        return Product(transform=transform_summary(t, len(assignment.smoothing), *searched))

    def calibrate(self, op: ops.CalibrateChunk, v: OpValues) -> None:
        """Every chunk, `op.passes` times: low_memory splits the observed tensors into groups."""
        loaded, memory = v.get(Buffer.MODEL, OnnxLoaded), v.get(Buffer.MEMORY_MODE, OnnxMemory)
        cal, files, assignment = op.calibration, loaded.files, _final(v, loaded)
        w = observed_for(assignment, cal)
        histogram = cal.method.histogram
        batches = self._batches(cal, assignment)
        hessians = dict(w.hessian_inputs)
        groups = np.array_split(np.array(w.fetched, dtype=object), op.passes)
        advance = self.progress("calibrate", len(batches) * op.passes)
        states, observers = [], {}
        ranged = set(w.observed)
        for number, group in enumerate(groups):
            observed = tuple(t for t in group if t in ranged)
            gathered = {t: hessians[t] for t in group if t in hessians}
            state = self._resume_state(memory, files, number, tuple(group))
            states.append(state)
            observers.update(calibrate(files.light, files.base_dir, loaded.graph, observed,
                                       batches, histogram, cal.bins, advance, cal.workers, state, gathered))
        observers = merged(self.ranks, observers)  # every rank's chunks, merged exactly in rank order
        seen = Observed(assignment, w, observers, GptqRounder(jobs_of(assignment), observers))
        for state in filter(None, states):  # calibration is complete: nothing to resume
            state.remove()
        self._ranges_if_ready(op, seen, cal)
        for buffer in op.outputs:
            v.put(buffer, seen)

    def cache_block_inputs(self, op: ops.CacheBlockInputs, v: OpValues) -> None:
        """offload: observers (resumed where an interrupted run left them) and the graph inputs' own ranges;
        the block boundaries are cached per chunk as run_block produces them."""
        from compiler.quant.observers import make_observer

        loaded, memory = v.get(Buffer.MODEL, OnnxLoaded), v.get(Buffer.MEMORY_MODE, OnnxMemory)
        cal, assignment = op.calibration, _final(v, loaded)
        w = observed_for(assignment, cal)
        histogram = cal.method.histogram
        seen = Observed(assignment, w, {t: make_observer(histogram, cal.bins) for t in w.observed})
        seen.observers.update(hessian_observers(dict(w.hessian_inputs)))
        # GPTQ layers are rounded as their segment finishes, and those weights are not part of the resume
        # state: an offload GPTQ run starts over when interrupted
        state = None if w.gptq_layers else self._resume_state(memory, loaded.files, -1, tuple(w.observed))
        resume = None
        if state is not None:
            found = state.load()
            done = 0
            if found is not None and set(found[1]) == set(seen.observers):
                done, seen.observers = found
            from compiler.backends.onnx.segments import Resume

            resume = Resume(state.path.stem, lambda: done, lambda segments: state.save(segments, seen.observers))
        seen.offload_resume = (state, resume)
        if not (resume and resume.done()):
            for name in (t for t in w.fetched if t in loaded.graph.inputs):
                for feed in self._batches(cal, assignment):
                    observe(seen.observers, name, feed[name])
        v.put(Buffer.BLOCK_INPUTS, seen)

    def run_blocks(self, op: ops.RunBlock, v: OpValues) -> None:
        """offload: one segment's weights in a session at a time, boundaries cached per chunk."""
        from compiler.backends.onnx.segments import run_segments

        loaded, memory = v.get(Buffer.MODEL, OnnxLoaded), v.get(Buffer.MEMORY_MODE, OnnxMemory)
        seen = v.get(Buffer.BLOCK_INPUTS, Observed)
        cal, files, w = op.calibration, loaded.files, seen.observation
        state, resume = seen.offload_resume
        batches = self._batches(cal, seen.assignment)
        advance = self.progress("calibrate", len(segments_of(files)) * len(batches))
        seen.rounder = GptqRounder(jobs_of(seen.assignment), seen.observers)
        rounded = Rounded(seen.assignment)
        run_segments(files.light, files.base_dir, loaded.graph, batches, set(w.fetched),
                     lambda name, value: observe(seen.observers, name, value), memory.disk, advance, resume,
                     lambda reported: self._round_segment(loaded, seen, rounded, reported))
        # every rank's chunks, merged exactly in rank order, into the dict the rounder holds (GPTQ's Hessians were
        # merged, used and freed as their segments finished: none is left here)
        seen.observers.update(merged(self.ranks, seen.observers))
        if state is not None:
            state.remove()
        self._ranges_if_ready(op, seen, cal)
        for buffer in op.outputs:
            v.put(buffer, rounded if buffer is Buffer.QPARAMS else seen)

    def _round_segment(self, loaded: OnnxLoaded, seen: Observed, rounded: Rounded, reported: list[str]) -> None:
        """offload: the GPTQ layers whose input a finished segment produced are rounded now, so only one
        segment's Hessians are ever held; the emitter writes them to the output's data file at once. Under
        torchrun those Hessians are first summed over the ranks (every rank reaches each segment's end: the
        segments are the graph's), then the layers are rounded N at a time as in `quantize`."""
        done = set(reported)
        assert seen.rounder is not None  # made before the segments run
        jobs = seen.rounder.jobs
        finished = {name for name, job in jobs.items() if uses_gptq(job) and job.layer.input in done}
        if not finished:
            return
        rounded.early |= finished
        inits = {t.name: t for t in loaded.files.light.graph.initializer if t.name in finished}
        pairs = rewrite.weight_nodes(loaded.files.light, finished)
        if self.ranks.world > 1:
            held = {PREFIX + jobs[weight].layer.input for weight in finished}
            seen.observers.update(merged(self.ranks, {key: seen.observers[key] for key in held}))
            self._quantize_shared(loaded, seen.rounder, rounded, pairs, inits, jobs, lambda: None)
        else:
            for node, weight in pairs:
                self._put(loaded, seen.rounder, rounded, node, inits[weight], jobs[weight])
        release_memory()

    # ---- ranges -------------------------------------------------------------------------------------
    def _ranges_if_ready(self, op: ops.PlanOp, seen: Observed, calibration: Calibration) -> None:
        """minmax: the observers' ranges are final, so the op that observes produces them (the plan says so)."""
        if ops.Buffer.RANGES in op.outputs:
            self._ranges(seen, calibration, inherited=False)

    def search_ranges(self, op: ops.SearchPercentile, v: OpValues) -> None:
        """Each observed input's range from its histogram, by the calibration method."""
        seen = v.get(Buffer.HISTOGRAMS, Observed)
        self._ranges(seen, op.calibration, inherited=False)
        v.put(Buffer.RANGES, seen)

    def propagate_ranges(self, op: ops.PropagateRanges, v: OpValues) -> None:
        """The outputs of passthrough ops take their producer's range."""
        seen = v.get(Buffer.RANGES, Observed)
        self._ranges(seen, op.calibration, inherited=True)
        v.put(Buffer.RANGES, seen)

    def _ranges(self, seen: Observed, calibration: Calibration, inherited: bool) -> None:
        """The quantized range of each static input: observed ones from their own observer, inherited ones
        (outputs of passthrough ops) from their producer's."""
        sources = seen.observation.source_of
        for a in seen.assignment.layers:
            act, tensor = a.scheme.activations, a.layer.input
            if a.scheme.is_none or act is None or tensor in seen.bounds or (sources[tensor] != tensor) != inherited:
                continue
            bounds = calibration.method.range(seen.observers[sources[tensor]], act.qtype, act.symmetric)
            if bounds is None:
                self.pending.warnings.append(warning(
                    "Q405", f"`{tensor}` was never finite during calibration; left unquantized",
                    a.rule.span if a.rule else None, "no range",
                    help="check the calibration data; masks built from -inf look like this"))
                continue
            seen.bounds[tensor] = (float(bounds[0]), float(bounds[1]))

    # ---- weights and output -------------------------------------------------------------------------
    def quantize(self, op: ops.QuantizeWeights, v: OpValues) -> Product:
        """Each weight read from the data file, rounded, handed to the emitter and dropped; then the static
        inputs' scales and zero points."""
        calibrated = time.perf_counter() - self.start
        release_memory()
        loaded = v.get(Buffer.MODEL, OnnxLoaded)
        seen = next((v.get(b, Observed) for b in (Buffer.RANGES, Buffer.HISTOGRAMS) if v.declares(b)), None)
        assignment = seen.assignment if seen is not None else _final(v, loaded)
        rounded = v.get(Buffer.QPARAMS, Rounded) if v.declares(Buffer.QPARAMS) else Rounded(assignment)
        v.put(Buffer.QPARAMS, rounded)
        rounder = seen.rounder if seen is not None else None
        jobs = jobs_of(assignment)
        inits = {t.name: t for t in loaded.files.light.graph.initializer}
        # the emitter's order, known on every rank; offload rounded its GPTQ layers as their segments finished
        pairs = [(node, weight) for node, weight in rewrite.weight_nodes(loaded.files.light, jobs)
                 if weight not in rounded.early]
        advance = self.progress("quantize", len(pairs))
        if self.ranks.world > 1:
            self._quantize_shared(loaded, rounder, rounded, pairs, inits, jobs, advance)
            if not self.ranks.first:
                return Product()
        else:
            for node, weight in pairs:
                self._put(loaded, rounder, rounded, node, inits[weight], jobs[weight])
                advance()
        emitter = self._emitter(loaded, rounded)
        warnings = (dampened_warning(self.plan.spans.recipe, rounder.dampened),) \
            if rounder is not None and rounder.dampened else ()
        bounds = seen.bounds if seen is not None else {}
        for tensor, qparams_ in activation_specs(assignment, loaded.files.light, bounds).items():
            emitter.put(tensor, qparams_)
        sqnr = tuple((a.layer.name, rounded.sqnr[a.layer.weight]) for a in assignment.layers
                     if a.layer.weight in rounded.sqnr)
        ranges = tuple((a.layer.name, bounds[a.layer.input]) for a in assignment.layers
                       if a.scheme.activations is not None and a.layer.input in bounds)
        return Product(warnings=warnings, calibration_seconds=calibrated, weight_sqnr=sqnr, input_ranges=ranges)

    def _quantize_shared(self, loaded: OnnxLoaded, rounder: GptqRounder | None, rounded: Rounded, pairs,
                         inits: dict, jobs: dict[str, rewrite.WeightJob], advance) -> None:
        """torchrun's ranks round the weights N at a time, weight start + r on rank r; each round the rounded
        weights and their figures go to the first rank, which hands them to the emitter (its layout is the
        graph's, so the bytes are one process's). At most N rounded weights are in flight."""
        for start in range(0, len(pairs), self.ranks.world):
            mine: dict[str, tuple[QuantizedWeight, float]] = {}
            for k, (node, weight) in enumerate(pairs[start:start + self.ranks.world]):
                if k == self.ranks.rank:
                    w = loaded.files.array(inits[weight])
                    refuse_nonfinite(self.plan.spans.model, jobs[weight].layer, w)
                    qw = round_weight(rounder, node, weight, w, jobs[weight])
                    mine[weight] = (qw, sqnr_db(w, qw))
                elif rounder is not None and uses_gptq(jobs[weight]):
                    rounder.skip(weight)  # another rank rounds it: its Hessian goes when no one here needs it
            dampened = rounder.dampened if rounder is not None else {}
            for handed, their_dampened in gather_to_first(self.ranks, (mine, dampened)):
                for weight, (qw, figure) in handed.items():
                    rounded.sqnr[weight] = figure
                    self._emitter(loaded, rounded).put(weight, qw)
                if rounder is not None:
                    rounder.dampened.update(their_dampened)
            for _ in pairs[start:start + self.ranks.world]:
                advance()

    def emit(self, op: ops.Emit, v: OpValues) -> Product:
        """Float initializers kept as they are, provenance stamped, the file written atomically (by the first
        rank: the others write nothing)."""
        loaded = v.get(Buffer.MODEL, OnnxLoaded)
        # a recipe that quantizes no layer rounds nothing: the model is written as it is (rotated, where it asks)
        rounded = v.get(Buffer.QPARAMS, Rounded) if v.declares(Buffer.QPARAMS) else Rounded(_final(v, loaded))
        memory = v.get(Buffer.MEMORY_MODE, OnnxMemory)
        if not self.ranks.first:
            v.put(Buffer.EMITTED_MODEL, Staged(None, rounded.assignment))
            return Product()
        emitter = self._emitter(loaded, rounded)
        for tensor in loaded.files.light.graph.initializer:
            if tensor.name not in emitter.jobs:
                emitter.copy_raw(tensor.name)
        for key, value in self.plan.provenance:
            emitter.metadata(key, value)
        # verification opens the model in onnxruntime; without it, this check does
        check = None if self.plan.first(ops.Verify) else (
            lambda staged: check_emitted(staged, self.plan.spans.emit, memory.offload))
        staged = tuple(emitter.finish(check))  # beside the destination until verified
        release_memory()  # the quantized model's proto and pages go before verification
        unrounded = None if v.declares(Buffer.QPARAMS) else rounded
        v.put(Buffer.EMITTED_MODEL, Staged(emitter.staged_model, rounded.assignment, unrounded))
        return Product(files=staged)

    def _layer_errors(self, op: ops.Verify, loaded: OnnxLoaded, memory: OnnxMemory, staged: Staged) -> dict[str, float]:
        """Each quantized layer's added error on a few held-out samples (offload: segment by segment, the
        layer tensors cached on disk)."""
        from compiler.backends.onnx.attribution import staged_layer_errors

        assert staged.model is not None  # the first rank's
        samples = held_out_batches(op, staged.assignment.model, self.pending.warnings, chunk=1)
        samples = dataclasses.replace(samples, samples=min(samples.samples, 4))
        return staged_layer_errors(staged.assignment, loaded.files, staged.model, samples,
                                   (memory.disk or Path(tempfile.gettempdir())) if memory.offload else None)

    def verify(self, op: ops.Verify, v: OpValues) -> Product:
        """Measured on the staged model; then it goes into place (a failed verification leaves it there,
        beside its figures), so an interrupt before this point leaves nothing at the destination. Under torchrun
        the first rank stages the model: ranks on its machine open that file and each runs its share of the
        held-out chunks, the sums merged in rank order; ranks on other machines run a copy the first rank sends
        them (ranks.staged_everywhere), removed after."""
        loaded, memory = v.get(Buffer.MODEL, OnnxLoaded), v.get(Buffer.MEMORY_MODE, OnnxMemory)
        staged = v.get(Buffer.EMITTED_MODEL, Staged)
        assignment = staged.assignment
        with tempfile.TemporaryDirectory(prefix="qrc-staged-") as scratch:
            here = staged_everywhere(self.ranks, staged.model.parent if staged.model is not None else None,
                                     Path(scratch)) / self.output.name
            if memory.offload:  # a sample at a time
                batches = held_out_batches(op, assignment.model, self.pending.warnings, chunk=1)
                agreement = verify_offload(assignment, loaded.files, here, Owned(batches, self.ranks), memory.disk,
                                           self.progress)
            else:
                batches = held_out_batches(op, assignment.model, self.pending.warnings)
                agreement = verify_whole(loaded.files.path, here, Owned(batches, self.ranks), self.progress)
        agreement = merged_one(self.ranks, agreement)
        failed = not passes(agreement.value(op.metric), op.bound, op.threshold)
        # Q501's help: the first rank's, on the model it staged
        errors = self._layer_errors(op, loaded, memory, staged) if failed and self.ranks.first else {}
        measured_on = "the emitted model, run by onnxruntime" + (
            f", its held-out samples shared by {self.ranks.world} torchrun ranks" if self.ranks.world > 1 else "")
        verdict = judge(op, self.plan.spans.verify, self.output, agreement, measured_on, errors,
                        self.ranks.first)  # the model goes into place after the last op
        saturation = saturation_warning(assignment, self.plan.emit.format, self.plan.spans.verify)
        if saturation is not None and self.ranks.first:
            self.pending.warnings.append(saturation)
        v.put(Buffer.VERIFY_REPORT, verdict)
        return Product(verification=verdict)


def _final(v: OpValues, loaded: OnnxLoaded) -> Assignment:
    """The assignment the op works with: the search's where the op waits for it, else the model's."""
    return v.get(Buffer.PRECISION, Assignment) if v.declares(Buffer.PRECISION) else loaded.assignment
