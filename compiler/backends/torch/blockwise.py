"""The block-wise ops of the torch backend (low_memory, offload, multi_gpu; docs/torch.md, On PyTorch: block-wise
execution): every stream run up to the blocks and their inputs cached; per block its weights, statistics,
rounding and the streams on; what comes after the blocks on the last hidden states; and the bookkeeping that
lets a killed offload run with `disk` resume after its last finished block (resume.py)."""

from __future__ import annotations

import torch

from compiler.backends.products import Product
from compiler.backends.release import release_memory, trim_heap
from compiler.backends.torch import streams
from compiler.backends.torch.kv_cache import KvMode
from compiler.backends.torch.layers import Job, Statistics
from compiler.backends.torch.resume import BlockResume, checkpoint_identity, finished, restore
from compiler.backends.torch.run_state import RunState
from compiler.backends.torch.writer import output_writer
from compiler.ir.types import Calibration
from compiler.plan import ops


class BlockWise(RunState):
    """The ops that run the model one block at a time, and the tail after the blocks."""

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
        blocks = max(op.blocks for op in self.plan.ops if isinstance(op, ops.RunBlock))
        return BlockResume.open(self.disk, self.output, identity, self.ranks, self.plan.spans.disk,
                                self.pending.warnings, blocks)

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
        if (out := output_writer(self.writer)) is not None:
            out.keep = True

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
        trim_heap()  # the rounding's freed temporaries (GPTQ's per-column scratch, below the mmap threshold) stay in
        # the heap otherwise, under the forwards that follow: 40-90 MiB on SmolLM2-135M's blocks
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
