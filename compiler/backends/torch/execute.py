"""Execute a plan on PyTorch, block by block (ALGORITHMS.md, Block-wise execution):

1. run the calibration (and verification) samples up to the first block and cache its inputs;
2. per block: load its weights (offload: from the checkpoint), collect statistics with hooks, quantize,
   write its tensors, run the quantized block to produce the next block's inputs, free it;
3. what comes after the blocks runs on the cached last hidden states (its layers quantized the same way);
4. every tensor left unquantized is copied from the checkpoint; the folder appears atomically.

`full` keeps the model resident and runs it whole with hooks. Verification runs float and quantized
streams side by side through the same blocks, so it never needs a second copy of the model."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from compiler import data
from compiler.backends.agreement import Agreement, passes
from compiler.backends.gptq_warning import dampened_warning
from compiler.backends.products import Pending, Product
from compiler.backends.program import Produced, execute_plan
from compiler.backends.ranks import Owned, current, merged_one, staged_everywhere
from compiler.backends.release import freeze_long_lived, keep_large_blocks_mapped, release_memory, trim_heap
from compiler.backends.result import CompileResult, held_out_batches, judge
from compiler.backends.sensitivity import Scores, assign, score_units
from compiler.backends.torch import streams
from compiler.backends.torch.artifact import can_verify_artifact, open_artifact
from compiler.backends.torch.attribution import LayerCosts, jobs_in
from compiler.backends.torch.check_process import CheckProcess, adopt
from compiler.backends.torch.devices import place
from compiler.backends.torch.early_check import EarlyCheck
from compiler.backends.torch.emitted_verify import hidden_cache, run_emitted
from compiler.backends.torch.fallbacks import unseen_warning
from compiler.backends.torch.gguf_writer import GgufLayout, GgufWriter
from compiler.backends.torch.global_scales import SharedGlobalScales
from compiler.backends.torch.kv_cache import KvCacheQuantizer, KvMode
from compiler.backends.torch.layers import (
    Job,
    Statistics,
    jobs_of,
    refuse_non_linear,
)
from compiler.backends.torch.load_check import check_loads
from compiler.backends.torch.model import TorchModel, open_files, open_model
from compiler.backends.torch.output_layout import copy_unquantized, open_output, write_metadata
from compiler.backends.torch.resume import BlockResume, checkpoint_identity, finished, restore
from compiler.backends.torch.rounding import Rounder
from compiler.backends.torch.sensitivity import TorchScorer
from compiler.backends.torch.sharing import share_costs, share_kv
from compiler.backends.torch.smoother import Smoother
from compiler.backends.torch.writer import FolderWriter, RankCollector
from compiler.diagnostics import warning
from compiler.exhaustive import assert_never
from compiler.ir.types import Calibration, EmitFormat, MemoryMode
from compiler.models.index import ModelIndex
from compiler.models.names import attention_modules
from compiler.plan import ops
from compiler.plan.ops import Plan
from compiler.resolve.assignment import Assignment


def execute(plan: Plan, assignment: Assignment, output: Path, progress) -> CompileResult:
    """Run `plan` op by op on PyTorch (compiler.backends.program.execute_plan)."""
    if plan.decision.mode is MemoryMode.OFFLOAD and plan.decision.ram_source == "recipe":
        keep_large_blocks_mapped()  # a RAM budget: a flat RSS first, at up to 13% more time (release.py)
    return execute_plan(plan, assignment, output, progress,
                        lambda guarded_progress, start: _Run(assignment, plan, output, guarded_progress, start))


class _Run:
    """The state the ops share: the model skeleton, the assignment (the search may change it), the jobs and
    the output writer (made once the assignment is final), and the sample streams. Each handler reads its op;
    what the ops share (the streams, the writer) is made once from the ops that need it."""

    model = Produced[TorchModel]()  # load_model
    index = Produced[ModelIndex]()  # load_model
    writer = Produced[FolderWriter | RankCollector | GgufWriter]()  # the first op that needs the jobs (_ready); a
    # collector on torchrun's ranks but the first (compiler/backends/ranks.py)
    global_scales = Produced[SharedGlobalScales]()
    kv = Produced[KvCacheQuantizer]()  # `kv_cache`: observes, then rounds, the attention caches (without it: no module)
    costs = Produced[LayerCosts]()  # each layer's own error on the held-out samples
    rounder = Produced[Rounder]()  # rounds into the writer

    def __init__(self, assignment: Assignment, plan: Plan, output: Path, progress, start: float):
        self.assignment, self.plan = assignment, plan
        self.output, self.progress, self.start = output, progress, start
        self.pending = Pending()  # what the rounder and the streams report between ops (program.py drains it)
        self.mode = plan.mode
        emit = plan.first(ops.Emit)
        self.gguf = isinstance(emit, ops.Emit) and emit.format is EmitFormat.GGUF  # one file for llama.cpp
        self.access = ops.ModelAccess.RESIDENT  # set by load_model
        self._model: TorchModel | None = None
        self._index: ModelIndex | None = None
        self.scores: Scores | None = None
        self.devices: dict = {}
        self.jobs: list[Job] = []
        self._writer: FolderWriter | RankCollector | GgufWriter | None = None
        self.ranks = current()  # one rank outside torchrun
        self._global_scales: SharedGlobalScales | None = None
        self._kv: KvCacheQuantizer | None = None
        self.config: dict = {}  # the output's config.json, its quantization_config checked before any work
        self.stats: Statistics | None = None
        self.cal: streams.Stream | None = None
        # the float stream, qrc's quantized stream (None when the emitted folder is what verification runs),
        # and the comparison
        self.verify_streams: tuple[streams.Stream, streams.Stream | None, Agreement] | None = None
        self.emitted = False  # verification runs the emitted folder as it loads (artifact.py), not qrc's model
        self.unopened = ""  # why transformers' own loader could not open the staged folder (Q427), if it could not
        # the float outputs kept before rounding (full); a list also where this rank has no held-out chunk, so
        # that every rank takes the same path at verification (its collectives)
        self.reference: list | None = None
        self.tail_done = False
        self.disk: Path | None = None  # `memory { disk }`, from select_memory_mode
        self.caches: list[streams.HiddenCache] = []
        self._costs: LayerCosts | None = None
        self._rounder: Rounder | None = None
        self.smoother: Smoother | None = None  # `transform`: folds its scales before each block's calibration
        self.early: EarlyCheck | None = None  # file to file: the final config and the load check, on a thread
        self.check_process: CheckProcess | None = None  # where that thread has them made (check_process.py)
        self.resume: BlockResume | None = None  # offload with `disk`: how far an earlier run got (resume.py)

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

    # ---- model, memory mode, search ---------------------------------------------------------------
    @property
    def file_to_file(self) -> bool:
        """Nothing runs the model (the plan opened its files only): no model definition is built, so an
        architecture transformers cannot build here still compiles."""
        return self.access is ops.ModelAccess.FILES

    def load(self, op: ops.LoadModel) -> None:
        """The skeleton on the meta device (every weight read now when the mode keeps the model resident),
        or, when nothing runs the model, the checkpoint's files alone (as the op's `access` says)."""
        self.access = op.access
        self.index = self.assignment.model
        if self.file_to_file:
            self.model = open_files(op.model)
            if not self.gguf and self.ranks.first:  # the config and load check (a GGUF file has none) run in a
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
        gathers = next((op for op in self.plan.ops if isinstance(op, ops.CalibrateChunk | ops.CacheBlockInputs)), None)
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
        layout = GgufLayout(self.model, self.jobs) if self.gguf else None
        self.resume = self._open_resume()
        staged = self.resume.staged if self.resume is not None else None
        resumed = self.resume is not None and self.resume.start > 0
        if layout is not None:  # the first rank writes the header now, with every tensor's place
            self.writer = GgufWriter(self.output, self.model, layout, staged, resumed) if self.ranks.first \
                else RankCollector()
            skipped = None
        else:
            self.config, self.writer, skipped = open_output(
                self.output, self.model, self.jobs, self.assignment, kv, attention, self.plan.spans.recipe,
                self.ranks.first, provisional=self.file_to_file, staged=staged, reopen=resumed)
            freeze_long_lived()  # the output's layout imported transformers' model classes: later collections skip them
            if self.file_to_file and isinstance(self.writer, FolderWriter):  # while the weights round
                assert self.check_process is not None  # load() started it: this is the first rank's folder
                self.early = EarlyCheck(self.model, self.jobs, self.assignment, self.config, self.writer,
                                        (self.plan.spans.recipe, self.plan.spans.emit), self.check_process)
        if resumed and isinstance(self.writer, FolderWriter | GgufWriter):
            self.writer.keep = True
        calibration = gathers.calibration if gathers is not None else None
        # GGUF's blocks carry float16 scales: rounded with them, qrc's model computes what llama.cpp decodes
        self.rounder = Rounder(calibration, self.plan.spans.model, self.model, self.writer, self.global_scales,
                               self.pending, self.progress, ranks=self.ranks,
                               scale_dtype=torch.float16 if self.gguf else self.model.dtype, gguf=layout)
        if skipped is not None:
            self.pending.warnings.append(skipped)
        if self.disk is not None:
            self.disk.mkdir(parents=True, exist_ok=True)
        if self.assignment.smoothing and gathers is not None and gathers.transform is not None:
            writer = self.writer if isinstance(self.writer, FolderWriter | GgufWriter) else None  # the first rank writes
            self.smoother = Smoother(gathers.transform, gathers.calibration, self.model, self.index,
                                     self.assignment.smoothing, self.jobs, writer, self.ranks)
        # the KV scales and the transform's statistics come from calibration too
        if gathers is not None and (any(j.needs_data for j in self.jobs) or kv is not None or self.smoother is not None):
            cal = gathers.calibration
            self.cal = self._stream("calibration", data.calibration_batches(cal.data, self.index, cal.chunk))
        self.verify_streams = self._verify_streams(held)

    def _jobs_named(self, names: tuple[str, ...]) -> list[Job]:
        wanted = set(names)
        return [j for j in self.jobs if j.layer.name in wanted]

    # ---- full: the model resident, run whole ------------------------------------------------------
    def _materialize_all(self) -> None:
        missing = [p for p in self.model.keys if not self.model.is_resident(p)]
        if missing:
            self.model.materialize(missing)

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
        smoother.run(smoother.mappings, lambda: [self._call(f) for f in feeds], lambda: self._call(feeds[0]))

    def calibrate_whole(self, op: ops.CalibrateChunk) -> None:
        """Every chunk through the whole model, hooks gathering each layer's statistics."""
        self._ready()
        self._materialize_all()
        cal = self.cal
        assert cal is not None  # this op exists because some layer needs data
        with Statistics(self.model.module, self.jobs, op.calibration) as stats, self.kv.running(KvMode.OBSERVE):
            advance = self.progress("calibrate", len(cal))
            for feed in cal.feeds:
                stats.new_forward()
                self._call(feed)
                advance()
        self.stats = stats
        self._write_kv_scales("")

    def _write_kv_scales(self, prefix: str) -> None:
        """The KV-cache scales of the modules under `prefix`, from every rank's maxima (sharing.py)."""
        share_kv(self.kv, self.ranks)
        self.kv.write_scales(prefix, self.writer)

    # ---- inputs -----------------------------------------------------------------------------------
    def _cache_folder(self) -> Path | None:
        """Where the hidden states between blocks go: the resume state's folder, `disk` in offload, else RAM."""
        return self.resume.folder if self.resume is not None else self.disk if self.offload else None

    def _stream(self, name: str, batches) -> streams.Stream:
        cache = streams.HiddenCache(self.model.dtype, self._cache_folder())
        self.caches.append(cache)
        # under torchrun each rank runs its own chunks (by index: rank i mod N) and the ranks merge what they
        # measured (sharing.py)
        return streams.Stream(name, [streams.torch_feed(f) for f in Owned(batches, self.ranks)], cache)

    def _verify_streams(self, held: ops.CaptureReference | ops.Verify | None):
        if held is None:
            return None
        batches = list(held_out_batches(held, self.index, self.pending.warnings))
        # the first rank stages the emitted folder: every rank opens it (ranks on other machines a copy the first
        # sends them), each running its own held-out chunks
        self.emitted = can_verify_artifact(self.model) and not self.gguf
        quantized = None if self.emitted else self._stream("verify (quantized)", batches)
        return self._stream("verify (float)", batches), quantized, Agreement()

    def _verification(self) -> tuple[streams.Stream, streams.Stream | None, Agreement]:
        """The float stream, qrc's quantized one (None when the emitted folder is verified), the comparison."""
        assert self.verify_streams is not None, "made with the jobs when the plan verifies"
        return self.verify_streams

    def _call(self, feed: dict):
        with torch.no_grad():
            return self.model.forward(feed)

    def _new_forward(self):
        if self.stats is not None:
            self.stats.new_forward()

    # ---- block-wise: low_memory, offload, multi_gpu ------------------------------------------------
    @property
    def offload(self) -> bool:
        return self.mode is MemoryMode.OFFLOAD

    def cache_block_inputs(self, op: ops.CacheBlockInputs) -> None:
        """Run every stream up to the blocks and cache their inputs; round the layers before the blocks (the
        op's layers) first, so the quantized verification stream starts from them. Block-wise with weights
        off the CPU (offload, GPUs), what runs before the blocks is read as it runs and dropped after."""
        self._ready()
        model, verify = self.model, self.verify_streams
        before = self._jobs_named(op.layers)
        container = model.block_modules()
        on_use = self.offload or bool(self.devices)
        with model.read_on_use(model.outside() if on_use else [], release=self.offload):
            with Statistics(model.module, before, op.calibration) as stats:
                self.stats = stats
                for s in filter(None, (self.cal, verify and verify[0])):
                    streams.capture(container, s, self._call, self._new_forward)
                self.stats = None
            self.rounder.in_place(before, stats)
            if verify is not None and verify[1] is not None:
                streams.capture(container, verify[1], self._call)
        if self.offload:
            release_memory()

    def run_blocks(self, op: ops.RunBlock) -> Product | None:
        """Per block: its weights, statistics from the calibration stream, rounding, then every stream on. A
        resumable run records each finished block before the hidden states that entered it go."""
        advance = self.progress("blocks", len(self.model.blocks))
        start = self._resumed()
        for number, name in enumerate(self.model.blocks):
            if number >= start:
                entered = self._block(number, name, op.calibration, self.devices.get(name, "cpu"))
                self._save_progress(number + 1)
                for cache in entered:
                    cache.close()
            advance()
        if not start:
            return None
        assert self.resume is not None  # it started after block 0
        return Product(notes=(f"resumed after block {start} of {len(self.model.blocks)}: the earlier run's state in "
                              f"{self.resume.folder}",))

    # ---- resuming (offload with `disk`: resume.py) --------------------------------------------------
    def _open_resume(self) -> BlockResume | None:
        """The resume state of a block-wise offload run with `disk` (None for other runs)."""
        if not (self.offload and self.disk is not None and any(isinstance(op, ops.RunBlock) for op in self.plan.ops)):
            return None
        identity = (self.plan.recipe_text, checkpoint_identity(self.model.folder), str(self.output.resolve()))
        return BlockResume.open(self.disk, self.output, identity, self.ranks, self.plan.spans.disk,
                                self.pending.warnings)

    def _streams(self) -> list[streams.Stream]:
        """The streams the blocks run: calibration, verification's float and quantized."""
        verify = self.verify_streams
        return [s for s in (self.cal, verify and verify[0], verify and verify[1]) if s is not None]

    def _resumed(self) -> int:
        """The blocks an earlier run finished (0 without one): each stream takes the hidden states it left, and
        what those blocks reported is reported again."""
        if self.resume is None or self.resume.saved is None:
            return 0
        self.caches.extend(self.resume.adopt(self._streams()))
        restore(self.resume.saved.finished, self.rounder, self.jobs, self.costs, self.kv, self.smoother)
        return self.resume.start

    def _save_progress(self, done: int) -> None:
        """Record `done` finished blocks (resumable runs only)."""
        if self.resume is None:
            return
        self.resume.save(done, {s.name: s.hidden.folder for s in self._streams() if s.hidden.folder},
                         finished(self.rounder, self.costs, self.kv, self.smoother))
        if isinstance(self.writer, FolderWriter | GgufWriter):
            self.writer.keep = True

    def _block(self, number: int, name: str, calibration: Calibration | None, device) -> list[streams.HiddenCache]:
        """One block run and rounded; the caches of the hidden states that entered it (closed by the caller)."""
        model, cal, verify, offload = self.model, self.cal, self.verify_streams, self.offload
        params = model.parameters_of(name)
        if offload or device != "cpu":
            model.materialize(params, device)
        block = model.block_modules()[number]
        jobs = [j for j in self.jobs if j.module.startswith(name + ".")]
        if self.smoother is not None and cal is not None:
            with torch.no_grad():
                self.smoother.run(self.smoother.of_block(name),
                                  lambda: streams.run_block(block, number, cal, device, None),
                                  lambda: streams.run_chunk(block, number, cal, device, 0))
        with Statistics(model.module, jobs, calibration) as stats, self.kv.running(KvMode.OBSERVE):
            if cal is not None:
                streams.run_block(block, number, cal, device, None, stats.new_forward)
        outputs = {}
        if verify is not None:
            with self.kv.running(KvMode.PASS):
                outputs["float"] = self._next(block, number, verify[0], device)
        hooks = self.rounder.in_place(jobs, stats)
        self._write_kv_scales(name + ".")
        if cal is not None:
            outputs["cal"] = self._next(block, number, cal, device)
        if verify is not None and verify[1] is not None:
            with self.costs.watching(self.model.module, jobs):
                outputs["quant"] = self._next(block, number, verify[1], device)
        for hook in hooks:
            hook.remove()
        entered = []
        for key, stream in (("cal", cal), ("float", verify and verify[0]), ("quant", verify and verify[1])):
            if key in outputs:
                assert stream is not None  # it produced outputs
                entered.append(stream.hidden)
                stream.hidden = outputs[key]
        if offload or device != "cpu":
            model.release(params)
        release_memory()
        return entered

    def _next(self, block, number: int, stream, device) -> streams.HiddenCache:
        out = streams.HiddenCache(stream.hidden.dtype, self._cache_folder())
        self.caches.append(out)
        with torch.no_grad():
            streams.run_block(block, number, stream, device, out)
        return out

    def _tail(self, cal, verify, jobs: list[Job], offload: bool, calibration: Calibration | None) -> None:
        """What comes after the blocks runs on the streams' last hidden states: statistics for its layers,
        rounding, and the verification comparison at the model's output. Without verification, and with no
        layer there that needs data, nothing runs: its layers are rounded one at a time."""
        model = self.model
        smoothed = self.smoother.of_block(None) if self.smoother is not None and cal is not None else []
        if verify is not None and verify[1] is None:  # the emitted folder is compared at the Verify op
            verify = None
        if verify is None and not (cal is not None and any(j.needs_data for j in jobs)) and not smoothed:
            self.rounder.streamed(jobs, None, offload)
            return
        self.tail_done = True
        missing = [p for p in model.outside() if not model.is_resident(p)]
        model.materialize(missing)
        container = model.block_modules()
        if smoothed and self.smoother is not None:
            with torch.no_grad():
                self.smoother.run(smoothed, lambda: list(streams.replay_tail(container, cal, self._call, lazy=True)),
                                  lambda: streams.first_tail_output(container, cal, self._call))
        with Statistics(model.module, jobs, calibration) as stats:
            self.stats = stats
            if cal is not None and any(j.needs_data for j in jobs):
                for _ in streams.replay_tail(container, cal, self._call, stats.new_forward, lazy=True):
                    pass  # the hooks gathered what they need; the logits are dropped chunk by chunk
            self.stats = None
        if verify is not None and not jobs:  # nothing to round here: float and quantized logits chunk by chunk
            for ref, cand, feed in zip(streams.replay_tail(container, verify[0], self._call, lazy=True),
                                       streams.replay_tail(container, verify[1], self._call, lazy=True),
                                       verify[1].feeds, strict=True):
                verify[2].update(ref.float().numpy(), cand.float().numpy(), *streams.tokens_of(feed))
        # the float logits are kept while the tail's layers are rounded; the quantized ones come one at a time
        reference = streams.replay_tail(container, verify[0], self._call) if verify is not None and jobs else None
        hooks = self.rounder.in_place(jobs, stats)
        if reference is not None:
            with self.costs.watching(self.model.module, jobs):
                candidate = streams.replay_tail(container, verify[1], self._call, lazy=True)
                for ref, cand, feed in zip(reference, candidate, verify[1].feeds, strict=True):
                    verify[2].update(ref.float().numpy(), cand.float().numpy(), *streams.tokens_of(feed))
            del reference
        for hook in hooks:
            hook.remove()
        if offload:
            model.release(missing)

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
                # the bytes copied unchanged, beside the rounding rather than after it (an FP8 source's weights left
                # float are dequantized at emit, as before: here their float32 copy would add to the rounding's peak)
                writer = self.writer
                copies = ((lambda: copy_unquantized(writer, self.model, self.jobs))
                          if isinstance(writer, FolderWriter) and not self.model.shards.scaled else None)
                self.rounder.from_files(jobs, copies)
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
        refused: list[str] = []
        checked = self.early.collect() if self.early is not None else None  # file to file (early_check.py)
        if isinstance(self.writer, GgufWriter):
            self.writer.copy_unquantized(self.model, self.jobs)
        elif isinstance(self.writer, FolderWriter):  # the first rank writes the output; the others hand tensors on
            copy_unquantized(self.writer, self.model, self.jobs)
            if checked is not None:  # the config with the final names
                self.config = checked.config
                if checked.config_warning is not None:
                    warnings.append(checked.config_warning)
            refused = write_metadata(self.writer, self.model, self.config, self.plan.recipe_text)
        if refused:
            warnings.append(warning(
                "Q430", f"{len(refused)} file(s) of the model folder link outside it and were not copied: "
                f"{', '.join(refused[:4])}", self.plan.spans.model, "not copied",
                help="copy the real files into the model folder if the output should carry them"))
        staged = tuple(self.writer.finish())
        if self.model.folder is not None and isinstance(self.writer, FolderWriter):  # what transformers makes of
            # the folder, before it goes into place (the first rank's: the others write nothing)
            skipped = (checked.load_warning if checked is not None
                       else check_loads(self.writer.temp, self.model.folder, self.plan.spans.emit))
            if skipped is not None:
                warnings.append(skipped)
                self.unopened = skipped.message  # verification still decodes the folder, and says how
        return Product(warnings=tuple(warnings), calibration_seconds=calibrated, files=staged,
                       transform=self.smoother.summary() if self.smoother is not None else None)

    def verify(self, op: ops.Verify) -> Product:
        """Compare at the model's output: the quantized model against the kept float outputs (full), or the
        two streams through the tail (block-wise), unless rounding the tail already did."""
        float_stream, quantized, agreement = self._verification()
        if self.emitted:
            self._verify_emitted(float_stream, agreement)
            measured_on = (
                "the emitted folder, loaded as transformers loads it (compressed-tensors)" if not self.unopened else
                "the emitted folder's tensors, decoded layer by layer by compressed-tensors (Q427: transformers "
                "itself did not open it)")
        elif self.reference is not None:
            assert quantized is not None  # qrc's own model is verified: its quantized stream exists
            advance = self.progress("verify", len(quantized))
            with self.costs.watching(self.model.module, self.jobs):
                for feed, ref in zip(quantized.feeds, self.reference, strict=True):
                    agreement.update(ref.numpy(), self._call(feed).float().numpy(), *streams.tokens_of(feed))
                    advance()
        elif not self.tail_done:
            self._tail(None, self.verify_streams, [], self.offload, None)
        if self.ranks.world > 1:  # every rank's held-out chunks
            agreement = merged_one(self.ranks, agreement)
            share_costs(self.costs, self.ranks)
            shared = f"its held-out samples shared by {self.ranks.world} torchrun ranks"
            measured_on = f"{measured_on}, {shared}" if self.emitted else f"qrc's model, {shared}"
        elif self.gguf:
            measured_on = ("qrc's model, rounded to the GGUF's blocks (its float16 scales and integers, the values "
                           "llama.cpp decodes)")
        elif not self.emitted:
            measured_on = "qrc's model (a built-in has no loader outside qrc)" if self.model.folder is None \
                else "qrc's model (compressed-tensors is not installed to load the emitted folder)"
        # Q501's help names the worst layers
        errors = {} if passes(agreement.value(op.metric), op.bound, op.threshold) else self.costs.added()
        verdict = judge(op, self.plan.spans.verify, self.output, agreement, measured_on, errors, self.ranks.first)
        return Product(verification=verdict)  # the model goes into place after the last op

    def _verify_emitted(self, float_stream: streams.Stream, agreement: Agreement) -> None:
        """The held-out samples through the staged folder as transformers and compressed-tensors load it,
        against the float outputs: those kept before rounding (full), or the float stream's last hidden
        states through the float model's tail (its weights read again from the checkpoint: the tail may
        have been rounded in place). Under torchrun each rank runs its own held-out chunks through the folder the
        first rank staged (on another machine, through the copy the first sends: ranks.staged_everywhere)."""
        with tempfile.TemporaryDirectory(prefix="qrc-staged-") as scratch:
            staged = staged_everywhere(self.ranks, self.writer.temp if isinstance(self.writer, FolderWriter) else None,
                                       Path(scratch))
            self._run_emitted(open_artifact(staged, self.model, self.plan.spans.emit), float_stream, agreement)

    def _run_emitted(self, artifact, float_stream: streams.Stream, agreement: Agreement) -> None:
        span = self.plan.spans.emit
        model = self.model
        if self.reference:
            reference = iter(self.reference)
            model.release([p for p in model.keys if model.is_resident(p)])  # qrc's model is done with
        else:
            for hook in self.rounder.hooks:  # the tail's input quantizers: its float outputs are wanted here
                hook.remove()
            self.rounder.hooks.clear()
            model.materialize(model.outside())
            reference = streams.replay_tail(model.block_modules(), float_stream, self._call, lazy=True)
        disk = self.disk if self.offload else None
        run_emitted(span, artifact, float_stream.feeds, reference, agreement, hidden_cache(model.dtype, disk),
                    self.devices, self._costs_in, self.progress)
        self.reference = None
        if self.offload:
            model.release([p for p in model.outside() if model.is_resident(p)])

    def _costs_in(self, scope: str | None, artifact):
        """While the emitted model runs a scope (a block, None: outside the blocks, "": everything): each
        quantized layer's own output error there."""
        return self.costs.watching(artifact.module, jobs_in(self.jobs, scope, self.model.container))
