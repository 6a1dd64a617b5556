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

import torch

from compiler import data
from compiler.backends.agreement import Agreement
from compiler.backends.gptq_warning import dampened_warning
from compiler.backends.products import Product
from compiler.backends.program import execute_plan
from compiler.backends.release import keep_large_blocks_mapped, release_memory, trim_heap
from compiler.backends.result import CompileResult, held_out_batches
from compiler.backends.sensitivity import assign, score_units
from compiler.backends.torch import streams
from compiler.backends.torch.artifact import can_verify_artifact
from compiler.backends.torch.attribution import LayerCosts
from compiler.backends.torch.check_process import adopt
from compiler.backends.torch.devices import place
from compiler.backends.torch.fallbacks import unseen_warning
from compiler.backends.torch.global_scales import SharedGlobalScales
from compiler.backends.torch.kv_cache import KvCacheQuantizer, KvMode
from compiler.backends.torch.layers import Statistics, jobs_of, refuse_non_linear
from compiler.backends.torch.model import open_files, open_model
from compiler.backends.torch.rounding import Rounder
from compiler.backends.torch.sensitivity import TorchScorer
from compiler.backends.torch.smoother import Smoother
from compiler.backends.torch.verifying import Verifying
from compiler.backends.torch.writer import output_writer
from compiler.diagnostics import warning
from compiler.exhaustive import assert_never
from compiler.ir.types import MemoryMode, Transform
from compiler.models.names import attention_modules
from compiler.plan import ops
from compiler.plan.ops import Plan
from compiler.resolve.assignment import Assignment
from compiler.safe_files import own_folder

# ops that run the model forward (file to file, nothing does): their runs fix glibc's mmap threshold (release.py)
RUN_THE_MODEL = (ops.CalibrateChunk, ops.CacheBlockInputs, ops.CaptureReference, ops.Smooth, ops.ScoreSensitivity)


def execute(plan: Plan, assignment: Assignment, output: Path, progress) -> CompileResult:
    """Run `plan` op by op on PyTorch (compiler.backends.program.execute_plan)."""
    if any(isinstance(op, RUN_THE_MODEL) for op in plan.ops):  # each activation's memory goes back to the OS
        keep_large_blocks_mapped()  # when freed, so the RSS is what the plan counts: up to a fifth more time
    return execute_plan(plan, assignment, output, progress,
                        lambda guarded_progress, start: _Run(assignment, plan, output, guarded_progress, start))


class _Run(Verifying):
    """The plan's ops on the state they share (run_state.py): the model, the search, calibrating the resident
    model, rounding, the emitted folder; the block-wise ops and verification come from blockwise.py and
    verifying.py."""

    def handlers(self) -> dict[type, Callable]:
        return {ops.LoadModel: self.load, ops.SelectMemoryMode: self.select_mode, ops.ScoreSensitivity: self.score,
                ops.AssignPrecision: self.assign, ops.CaptureReference: self.capture_reference,
                ops.Smooth: self.smooth_whole,
                ops.CalibrateChunk: self.calibrate_whole, ops.CacheBlockInputs: self.cache_block_inputs,
                ops.RunBlock: self.run_blocks, ops.QuantizeWeights: self.quantize, ops.Emit: self.emit,
                ops.Verify: self.verify}

    def drain(self) -> Product:
        """What the rounder and the streams reported while the last op ran (figures, warnings)."""
        return self.pending.take()

    def commit(self) -> list[Path]:
        """The staged folder into place (program.py calls this once every op ran); a resume state goes."""
        self._ready()
        files = self.writer.commit()
        if self.resume is not None:
            self.resume.remove()
        return files

    def close(self) -> None:
        """Remove the caches and hooks, and the staged output unless it was committed."""
        if self.early is not None:
            self.early.join()  # before the staged folder goes: the thread writes its config.json there
        if self.check_process is not None:  # also where no check started (a rank that writes nothing)
            self.check_process.stop()
        if self._writer is not None:
            self._writer.abort()  # after a commit there is nothing left to remove
        for cache in self.caches:
            if self.resume is None or not self.resume.keeps(cache.folder):  # a resume state's stays
                cache.close()
        for hook in self._rounder.hooks if self._rounder is not None else []:
            hook.remove()
        if self._kv is not None:
            self._kv.close()
        if self.file_to_file:  # no model, and the load check's cycles were collected on its thread: a collection
            trim_heap()  # now would only rescan the thawed imports (0.3 s)
        else:
            release_memory()

    def load(self, op: ops.LoadModel) -> None:
        """The skeleton on the meta device (every weight read now when the mode keeps the model resident),
        or, when nothing runs the model, the checkpoint's files alone (as the op's `access` says)."""
        self.access = op.access
        self.index = self.assignment.model
        if self.file_to_file:
            self.model = open_files(op.model)
            if self.format.opened_by_transformers and self.ranks.first:  # the config and load check run in a
                self.check_process = adopt(op.model, self.model.config)  # process of their own meanwhile
                self.check_process.follow()
            return
        self.model = open_model(op.model, self.assignment.model.blocks, self.plan.spans.model, op.attention)
        if op.access is ops.ModelAccess.RESIDENT:
            self.model.materialize(list(self.model.keys))

    def select_mode(self, op: ops.SelectMemoryMode) -> Product | None:
        """multi_gpu places blocks on the GPUs present, or falls back to low_memory (warned)."""
        self.mode, self.disk = op.mode, op.disk
        if op.mode is not MemoryMode.MULTI_GPU:
            return None
        self.devices, note = place(self.model, op.vram)
        if self.devices:
            return Product(notes=(note,))
        self.mode = MemoryMode.LOW_MEMORY
        self.model.materialize(list(self.model.keys))
        return Product(notes=(note,), warnings=(warning(
            "Q407", f"multi_gpu fell back to low_memory: {note}", self.plan.spans.mode, "ran on the CPU",
            help="give `vram` for the GPUs present, or use `mode low_memory`"),))

    def score(self, op: ops.ScoreSensitivity) -> None:
        scorer = TorchScorer(op, self.index, self.model, streams.torch_feed, self.ranks)
        self.scores = score_units(op, self.disk, self.assignment, scorer, "torch", self.progress, self.ranks)
        release_memory()

    def assign(self, op: ops.AssignPrecision) -> Product:
        self.assignment, search = assign(op, self.assignment, self.scores)
        return Product(assignment=self.assignment, search=search)

    def _ready(self) -> None:
        """Jobs, writer and streams, once: after the search (if any) fixed the assignment. The output's layout
        is the emit op's, the calibration stream the first statistics op's, the held-out samples those of
        the op that runs them first."""
        if self._writer is not None:
            return
        emit = self.plan.emit
        # the first op that reads the calibration samples (a transform's own pass, where no layer needs more)
        gathers = next((op for op in self.plan.ops
                        if isinstance(op, ops.CalibrateChunk | ops.CacheBlockInputs | ops.Smooth)), None)
        transform = _transform_of(gathers)
        held = next((op for op in self.plan.ops if isinstance(op, ops.CaptureReference | ops.Verify)), None)
        self.jobs = jobs_of(self.model, self.assignment)
        module_of = {j.layer.weight: j.module for j in self.jobs}
        # each layer's float weight as a transform left it (what its rounding approximates), read from the checkpoint
        self.costs = LayerCosts(lambda key: self.model.shards.read(key) if self.smoother is None
                                else self.smoother.as_folded(module_of[key], self.model.shards.read(key)))
        # each sibling's weight as its rounding sees it (AWQ and SmoothQuant fold their scales in before)
        where = {j.layer.name: (j.module, j.layer.weight) for j in self.jobs}
        self.global_scales = SharedGlobalScales({j.layer.name: j.scheme.quantized_weights.qtype for j in self.jobs},
                                                lambda name: self.model.weight_now(*where[name]), self.file_to_file)
        if not self.file_to_file:
            refuse_non_linear(self.model, self.jobs, self.plan.spans.recipe, self.assignment)
        kv = emit.kv_cache
        attention = attention_modules([layer.name for layer in self.index.layers]) if kv is not None else []
        self.kv = KvCacheQuantizer(self.model.module, attention, kv, self.model.dtype)
        self.resume = self._open_resume()
        staged = self.resume.staged if self.resume is not None else None
        resumed = self.resume is not None and self.resume.start > 0
        opened = self.format.open(self, staged, resumed, attention)  # every tensor's place, before any work
        self.writer, self.early = opened.writer, opened.early
        if opened.config is not None:
            self.config = opened.config
        if resumed and (out := output_writer(self.writer)) is not None:
            out.keep = True
        calibration = gathers.calibration if gathers is not None else None
        # a format that stores its scales in a dtype of its own (GGUF's float16) is rounded with them: qrc's model
        # computes what its runtime decodes
        self.rounder = Rounder(calibration, self.plan.spans.model, self.model, opened.writer, self.global_scales,
                               self.pending, self.progress, ranks=self.ranks,
                               scale_dtype=_scale_dtype(self.plan.emit.format.scale_dtype, self.model.dtype),
                               encoder=opened.encoder)
        if opened.warning is not None:
            self.pending.warnings.append(opened.warning)
        if self.disk is not None:
            own_folder(self.disk)
        if self.assignment.smoothing and gathers is not None and transform is not None:
            writer = output_writer(self.writer)  # the first rank writes
            self.smoother = Smoother(transform, gathers.calibration, self.model, self.index,
                                     self.assignment.smoothing, self.jobs, writer, self.ranks)
        # the KV scales and the transform's statistics come from calibration too
        if gathers is not None and (any(j.needs_data for j in self.jobs) or kv is not None or self.smoother is not None):
            cal = gathers.calibration
            self.cal = self._stream("calibration", data.calibration_batches(cal.data, self.index, cal.chunk,
                                                                            held.samples if held else 0))
        self.verify_streams = self._verify_streams(held)

    def capture_reference(self, op: ops.CaptureReference) -> None:
        self._ready()
        self._materialize_all()
        self.reference = [self._call(f).float() for f in self._verification()[0].feeds]

    def smooth_whole(self, op: ops.Smooth) -> None:
        """The transform over the resident model (full): its statistics over the calibration stream, the scales
        folded, the float output checked; block by block, run_block does this per block instead."""
        self._ready()
        self._materialize_all()
        cal, smoother = self.cal, self.smoother
        assert cal is not None and smoother is not None  # made with the jobs when the assignment has mappings
        feeds = cal.feeds

        def statistics_pass() -> None:  # the hooks read the mappings' inputs; no output is kept (a list of every
            for feed in feeds:  # chunk's logits held SmolLM2-135M's 32 samples' 3 GiB of them)
                self._call(feed, last_logits_only=True)
        smoother.run(smoother.mappings, statistics_pass, lambda: self._call(streams.first_row(feeds[0])))

    def calibrate_whole(self, op: ops.CalibrateChunk) -> None:
        """Every chunk through the whole model, hooks gathering each layer's statistics."""
        self._ready()
        self._materialize_all()
        cal = self.cal
        assert cal is not None  # this op exists because some layer needs data
        head_observed = any(j.module == self.model.head and j.needs_data for j in self.jobs)
        with Statistics(self.model.module, self.jobs, op.calibration) as stats, self.kv.running(KvMode.OBSERVE):
            advance = self.progress("calibrate", len(cal))
            for feed in cal.feeds:
                stats.new_forward()
                self._call(feed, last_logits_only=not head_observed)
                advance()
        self.stats = stats
        self._write_kv_scales("")

    def _verify_streams(self, held: ops.CaptureReference | ops.Verify | None):
        if held is None:
            return None
        batches = list(held_out_batches(held, self.index, self.pending.warnings))
        # the first rank stages the emitted folder: every rank opens it (ranks on other machines a copy the first
        # sends them), each running its own held-out chunks
        self.emitted = can_verify_artifact(self.model) and self.format.opened_by_transformers
        quantized = None if self.emitted else self._stream("verify (quantized)", batches)
        return self._stream("verify (float)", batches), quantized, Agreement()

    # ---- the ops after calibration ------------------------------------------------------------------
    def quantize(self, op: ops.QuantizeWeights) -> None:
        """The op's layers, as its strategy says: from the files, after the blocks through the model's tail,
        with the whole-model statistics in the resident model, or streamed one at a time."""
        self._ready()
        jobs = self._jobs_named(op.layers)
        match op.strategy:
            case ops.QuantizeStrategy.FILE_TO_FILE if self.ranks.world > 1:
                self.rounder.from_files_shared(jobs, self.ranks)
            case ops.QuantizeStrategy.FILE_TO_FILE:
                self.rounder.from_files(jobs, self.format.copies_beside_rounding(self))
            case ops.QuantizeStrategy.TAIL:
                self._tail(self.cal, self.verify_streams, jobs, self.offload, op.calibration)
            case ops.QuantizeStrategy.IN_PLACE:
                self._materialize_all()
                self.rounder.in_place(jobs, self.stats, self.progress("quantize", len(jobs)))  # GPTQ: minutes
            case ops.QuantizeStrategy.STREAMED:
                self.rounder.streamed(jobs, None, self.offload)
            case _:
                assert_never(op.strategy)

    def emit(self, op: ops.Emit) -> Product:
        """Every tensor not rounded is copied as bytes; config and recipe written; the folder appears."""
        self._ready()
        calibrated = time.perf_counter() - self.start
        warnings = []
        if self.rounder.unseen:
            warnings.append(unseen_warning(self.plan.spans.experts, self.rounder.unseen))
        if self.rounder.dampened:
            warnings.append(dampened_warning(self.plan.spans.recipe, self.rounder.dampened))
        self._write_kv_scales("")  # any module calibration did not reach (none in the models qrc runs)
        checked = self.early.collect() if self.early is not None else None  # file to file (early_check.py)
        warnings += self.format.finish(self, checked)  # the first rank writes the output; the others hand tensors on
        staged = tuple(self.writer.finish())
        skipped = self.format.check_staged(self, checked)  # what its loader makes of it, before it goes into place
        if skipped is not None:
            warnings.append(skipped)
            self.unopened = skipped.message  # verification still decodes the folder, and says how
        return Product(warnings=tuple(warnings), calibration_seconds=calibrated, files=staged,
                       transform=self.smoother.summary() if self.smoother is not None else None)


def _transform_of(op: ops.CalibrateChunk | ops.CacheBlockInputs | ops.Smooth | None) -> Transform | None:
    """The outlier transform an op that reads the calibration samples folds (a Smooth op carries it as its
    settings; its `transform` is the kind)."""
    if op is None:
        return None
    return op.settings if isinstance(op, ops.Smooth) else op.transform


def _scale_dtype(stored: str | None, model: torch.dtype) -> torch.dtype:
    """The dtype weight scales are rounded to: the output format's where it fixes one, else the model's."""
    return model if stored is None else getattr(torch, stored)
