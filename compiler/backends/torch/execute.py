"""Execute a plan on PyTorch, block by block (docs/torch.md, On PyTorch):

1. run the calibration (and verification) samples up to the first block and cache its inputs;
2. per block: load its weights (offload: from the checkpoint), collect statistics with hooks, quantize,
   write its tensors, run the quantized block to produce the next block's inputs, free it;
3. what comes after the blocks runs on the cached last hidden states (its layers quantized the same way);
4. every tensor left unquantized is copied from the checkpoint; the folder appears atomically.

`full` keeps the model resident and runs it whole with hooks. Verification runs float and quantized
streams side by side through the same blocks, so it never needs a second copy of the model."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from compiler.backends.gptq_warning import dampened_warning
from compiler.backends.products import Product
from compiler.backends.program import execute_plan
from compiler.backends.release import keep_large_blocks_mapped, release_memory, trim_heap
from compiler.backends.result import CompileResult
from compiler.backends.sensitivity import Scored, score_units
from compiler.backends.shared_ops import assign_precision
from compiler.backends.torch import streams
from compiler.backends.torch.check_process import adopt
from compiler.backends.torch.devices import place
from compiler.backends.torch.fallbacks import unseen_warning
from compiler.backends.torch.kv_cache import KvMode
from compiler.backends.torch.layers import Statistics
from compiler.backends.torch.model import open_files, open_model
from compiler.backends.torch.prepare import open_streams, prepare_output
from compiler.backends.torch.rounding import Rounder
from compiler.backends.torch.run_values import Emitted, Loaded, MemoryChoice, Reference, Staging, Streams
from compiler.backends.torch.sensitivity import TorchScorer
from compiler.backends.torch.spinquant import Learned, learn_from_calibration
from compiler.backends.torch.verifying import Verifying
from compiler.backends.values import OpValues, Values
from compiler.diagnostics import warning
from compiler.exhaustive import assert_never
from compiler.ir.types import MemoryMode
from compiler.plan import ops
from compiler.plan.ops import Buffer, Plan
from compiler.resolve.assignment import Assignment
from compiler.resolve.rotation_widths import rotation_words

# ops that run the model forward (file to file, nothing does): their runs fix glibc's mmap threshold (release.py)
RUN_THE_MODEL = (ops.CalibrateChunk, ops.CacheBlockInputs, ops.CaptureReference, ops.Smooth, ops.ScoreSensitivity,
                 ops.LearnRotation)


def execute(plan: Plan, assignment: Assignment, output: Path, progress) -> CompileResult:
    """Run `plan` op by op on PyTorch (compiler.backends.program.execute_plan)."""
    if any(isinstance(op, RUN_THE_MODEL) for op in plan.ops):  # each activation's memory goes back to the OS
        keep_large_blocks_mapped()  # when freed, so the RSS is what the plan counts: up to a fifth more time
    return execute_plan(plan, assignment, output, progress,
                        lambda guarded_progress, start: _Run(plan, output, guarded_progress, start))


class _Run(Verifying):
    """The plan's ops on the services they share (run_state.py), each reading the values its op declares
    (run_values.py): the model, the search, the run's preparation, calibrating the resident model, rounding,
    the emitted folder; the block-wise ops and verification come from blockwise.py and verifying.py."""

    __slots__ = ()

    def handlers(self) -> dict[type, Callable]:
        return {ops.LearnRotation: self.learn_rotation, ops.LoadModel: self.load,
                ops.SelectMemoryMode: self.select_mode, ops.ScoreSensitivity: self.score,
                ops.AssignPrecision: assign_precision, ops.PrepareRun: self.prepare,
                ops.CaptureReference: self.capture_reference, ops.Smooth: self.smooth_whole,
                ops.CalibrateChunk: self.calibrate_whole, ops.CacheBlockInputs: self.cache_block_inputs,
                ops.RunBlock: self.run_blocks, ops.QuantizeWeights: self.quantize, ops.Emit: self.emit,
                ops.Verify: self.verify}

    def drain(self) -> Product:
        """What the rounder and the streams reported while the last op ran (figures, warnings)."""
        return self.pending.take()

    def commit(self, values: Values) -> list[Path]:
        """The staged folder into place (program.py calls this once every op ran); a resume state goes."""
        staging = values.held(Buffer.OUTPUT, Staging)
        assert staging is not None, "every torch plan prepares its run before it emits"
        files = staging.writer.commit()
        if staging.resume is not None:
            staging.resume.remove()
        return files

    def close(self, values: Values) -> None:
        """Remove the caches and hooks, and the staged output unless it was committed."""
        loaded, staging = values.held(Buffer.MODEL, Loaded), values.held(Buffer.OUTPUT, Staging)
        held_streams = values.held(Buffer.STREAMS, Streams)
        if staging is not None and staging.early is not None:
            staging.early.join()  # before the staged folder goes: the thread writes its config.json there
        if loaded is not None and loaded.check_process is not None:  # also where no check started (a rank that
            loaded.check_process.stop()  # writes nothing)
        if staging is not None:
            staging.writer.abort()  # after a commit there is nothing left to remove
        resume = staging.resume if staging is not None else None
        for cache in held_streams.caches if held_streams is not None else []:
            if resume is None or not resume.keeps(cache.folder):  # a resume state's stays
                cache.close()
        if staging is not None:
            for hook in staging.rounder.hooks:
                hook.remove()
            staging.kv.close()
        if loaded is not None and loaded.file_to_file:  # no model, and the load check's cycles were collected on
            trim_heap()  # its thread: a collection now would only rescan the thawed imports (0.3 s)
        else:
            release_memory()

    def learn_rotation(self, op: ops.LearnRotation, v: OpValues) -> None:
        """SpinQuant's rotations learned on the float model (torch/spinquant.py), which is then dropped."""
        learned = learn_from_calibration(op, v.get(Buffer.RECIPE, Assignment), self.plan.spans,
                                         self.progress("learn rotation", op.iters))
        v.put(Buffer.ROTATION, learned)
        release_memory()

    def load(self, op: ops.LoadModel, v: OpValues) -> Product | None:
        """The skeleton on the meta device (every weight read now when the mode keeps the model resident),
        or, when nothing runs the model, the checkpoint's files alone (as the op's `access` says); read through
        a learned rotation where one was learned."""
        assignment = v.get(Buffer.RECIPE, Assignment)
        learned = v.get(Buffer.ROTATION, Learned) if v.declares(Buffer.ROTATION) else None
        source = learned.rotation if learned is not None else op.rotation
        rotated = None
        if op.rotation is not None and op.rotation[0]:  # R4 alone is said with SmoothQuant's summary
            words = rotation_words(op.rotation, "spinquant" if learned is not None else "quarot")
            rotated = Product(transform=words + (f"; {learned.words()}" if learned is not None else ""))
        if op.access is ops.ModelAccess.FILES:
            files, check = open_files(op.model, source, assignment.model.experts_split), None
            if self.format.opened_by_transformers and self.ranks.first:  # the config and load check run in a
                check = adopt(op.model, files.config)  # process of their own meanwhile
                check.follow()
            v.put(Buffer.MODEL, Loaded(files, assignment, op.access, check))
            return rotated
        model = open_model(op.model, assignment.model.blocks, self.plan.spans.model, op.attention, source,
                           assignment.model.experts_split)
        if op.access is ops.ModelAccess.RESIDENT:
            model.materialize(list(model.keys))
        v.put(Buffer.MODEL, Loaded(model, assignment, op.access))
        return rotated

    def select_mode(self, op: ops.SelectMemoryMode, v: OpValues) -> Product | None:
        """multi_gpu places blocks on the GPUs present, or falls back to low_memory (warned)."""
        if op.mode is not MemoryMode.MULTI_GPU:
            v.put(Buffer.MEMORY_MODE, MemoryChoice(op.mode, op.disk))
            return None
        model = v.get(Buffer.MODEL, Loaded).model
        devices, note = place(model, op.vram)
        if devices:
            v.put(Buffer.MEMORY_MODE, MemoryChoice(op.mode, op.disk, devices))
            return Product(notes=(note,))
        v.put(Buffer.MEMORY_MODE, MemoryChoice(MemoryMode.LOW_MEMORY, op.disk))
        model.materialize(list(model.keys))
        return Product(notes=(note,), warnings=(warning(
            "Q407", f"multi_gpu fell back to low_memory: {note}", self.plan.spans.mode, "ran on the CPU",
            help="give `vram` for the GPUs present, or use `mode low_memory`"),))

    def score(self, op: ops.ScoreSensitivity, v: OpValues) -> None:
        """Each searched unit's loss under each choice (cached by content under `disk` or $QRC_CACHE)."""
        loaded, memory = v.get(Buffer.MODEL, Loaded), v.get(Buffer.MEMORY_MODE, MemoryChoice)
        scorer = TorchScorer(op, loaded.index, loaded.model, streams.torch_feed, self.ranks)
        scores = score_units(op, memory.disk, loaded.assignment, scorer, "torch", self.progress, self.ranks)
        v.put(Buffer.SENSITIVITY, Scored(loaded.assignment, scores))
        release_memory()

    def prepare(self, op: ops.PrepareRun, v: OpValues) -> None:
        """Once the assignment is final: each layer's job, the output opened with every tensor's place (before
        any work: a layout it cannot hold fails now), what rounds into it, and the sample streams."""
        loaded, memory = v.get(Buffer.MODEL, Loaded), v.get(Buffer.MEMORY_MODE, MemoryChoice)
        searched = v.get(Buffer.PRECISION, Assignment) if v.declares(Buffer.PRECISION) else None
        staging = prepare_output(op, self, loaded, memory, searched or loaded.assignment)
        v.put(Buffer.OUTPUT, staging)
        folder = staging.resume.folder if staging.resume is not None else memory.disk if memory.offload else None
        samples = Streams(loaded.model.dtype, folder, self.ranks)
        v.put(Buffer.STREAMS, samples)  # before the streams are made: close() finds every cache made
        open_streams(op, samples, staging, self.format.opened_by_transformers, self.pending.warnings)

    def capture_reference(self, op: ops.CaptureReference, v: OpValues) -> None:
        """The float model's outputs on the held-out samples, kept before the model is rounded in place."""
        loaded, samples = v.get(Buffer.MODEL, Loaded), v.get(Buffer.STREAMS, Streams)
        loaded.materialize_all()
        v.put(Buffer.REFERENCE, Reference([loaded.call(f).float() for f in samples.verification()[0].feeds]))

    def smooth_whole(self, op: ops.Smooth, v: OpValues) -> None:
        """The transform over the resident model (full): its statistics over the calibration stream, the scales
        folded, the float output checked; block by block, run_block does this per block instead."""
        loaded, staging = v.get(Buffer.MODEL, Loaded), v.get(Buffer.OUTPUT, Staging)
        cal, smoother = v.get(Buffer.STREAMS, Streams).cal, staging.smoother
        assert cal is not None and smoother is not None  # made with the jobs when the assignment has mappings
        loaded.materialize_all()
        feeds = cal.feeds

        def statistics_pass() -> None:  # the hooks read the mappings' inputs; no output is kept (a list of every
            for feed in feeds:  # chunk's logits held SmolLM2-135M's 32 samples' 3 GiB of them)
                loaded.call(feed, last_logits_only=True)
        smoother.run(smoother.mappings, statistics_pass, lambda: loaded.call(streams.first_row(feeds[0])))
        v.put(Buffer.MODEL, loaded)

    def calibrate_whole(self, op: ops.CalibrateChunk, v: OpValues) -> None:
        """Every chunk through the whole model, hooks gathering each layer's statistics."""
        loaded, staging = v.get(Buffer.MODEL, Loaded), v.get(Buffer.OUTPUT, Staging)
        cal = v.get(Buffer.STREAMS, Streams).cal
        assert cal is not None  # this op exists because some layer needs data
        loaded.materialize_all()
        model = loaded.model
        head_observed = any(j.module == model.head and j.needs_data for j in staging.jobs)
        with Statistics(model.module, staging.jobs, op.calibration) as stats, staging.kv.running(KvMode.OBSERVE):
            advance = self.progress("calibrate", len(cal))
            for feed in cal.feeds:
                stats.new_forward()
                loaded.call(feed, last_logits_only=not head_observed)
                advance()
        # the forwards' activations were freed into the heap, which glibc keeps: returned now, so that the rounding
        # after them starts from the model's own pages (the real SmolLM2-135M, 8 × 128 tokens, NVFP4A16 imatrix
        # in place: 1,130 -> 963 MiB before its first rounding, 5 ms)
        trim_heap()
        staging.write_kv_scales("")
        v.put(Buffer.STATISTICS, stats)

    # ---- the ops after calibration ------------------------------------------------------------------
    def quantize(self, op: ops.QuantizeWeights, v: OpValues) -> None:
        """The op's layers, as its strategy says: from the files, after the blocks through the model's tail,
        with the whole-model statistics in the resident model, or streamed one at a time."""
        loaded, staging = v.get(Buffer.MODEL, Loaded), v.get(Buffer.OUTPUT, Staging)
        rounder, jobs = staging.rounder, staging.jobs_named(op.layers)
        match op.strategy:
            case ops.QuantizeStrategy.FILE_TO_FILE if self.ranks.world > 1:
                rounder.from_files_shared(jobs, self.ranks)
            case ops.QuantizeStrategy.FILE_TO_FILE:
                rounder.from_files(jobs, self.format.copies_beside_rounding(staging))
            case ops.QuantizeStrategy.TAIL:
                samples = v.get(Buffer.BLOCK_INPUTS, Streams)
                self._tail(loaded, staging, samples, samples.cal, samples.verify, jobs, op.calibration)
            case ops.QuantizeStrategy.IN_PLACE:
                loaded.materialize_all()
                stats = v.get(Buffer.STATISTICS, Statistics) if v.declares(Buffer.STATISTICS) else None
                rounder.in_place(jobs, stats, self.progress("quantize", len(jobs)))  # GPTQ: minutes
            case ops.QuantizeStrategy.STREAMED:
                rounder.streamed(jobs, None, staging.memory.offload)
            case _:
                assert_never(op.strategy)
        v.put(Buffer.QPARAMS, rounder)

    def emit(self, op: ops.Emit, v: OpValues) -> Product:
        """Every tensor not rounded is copied as bytes; config and recipe written; the folder appears."""
        staging = v.get(Buffer.OUTPUT, Staging)
        rounder = v.get(Buffer.QPARAMS, Rounder) if v.declares(Buffer.QPARAMS) else None  # None: nothing rounded
        calibrated = time.perf_counter() - self.start
        warnings = []
        if rounder is not None and rounder.unseen:
            warnings.append(unseen_warning(self.plan.spans.experts, rounder.unseen))
        if rounder is not None and rounder.dampened:
            warnings.append(dampened_warning(self.plan.spans.recipe, rounder.dampened))
        staging.write_kv_scales("")  # any module calibration did not reach (none in the models qrc runs)
        checked = staging.early.collect() if staging.early is not None else None  # file to file (early_check.py)
        warnings += self.format.finish(staging, checked)  # the first rank writes the output; the others hand on
        staged = tuple(staging.writer.finish())
        skipped = self.format.check_staged(staging, checked)  # what its loader makes of it, before it goes in place
        if skipped is not None:
            warnings.append(skipped)  # verification still decodes the folder, and says how
        v.put(Buffer.EMITTED_MODEL, Emitted(staged, skipped.message if skipped is not None else ""))
        return Product(warnings=tuple(warnings), calibration_seconds=calibrated, files=staged,
                       transform=staging.smoother.summary() if staging.smoother is not None else None)
