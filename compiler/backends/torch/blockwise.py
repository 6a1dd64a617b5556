"""The block-wise ops of the torch backend (low_memory, offload, multi_gpu; docs/torch.md, On PyTorch: block-wise
execution): every stream run up to the blocks and their inputs cached; per block its weights, statistics,
rounding and the streams on; what comes after the blocks on the last hidden states; and the bookkeeping that
lets a killed offload run with `disk` resume after its last finished block (resume.py)."""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from compiler.backends.products import Product
from compiler.backends.release import heap_reused, release_memory, trim_heap
from compiler.backends.torch import streams
from compiler.backends.torch.kv_cache import KvMode
from compiler.backends.torch.layers import Job, Statistics
from compiler.backends.torch.learned import LearningSteps, learn_block, step_precision
from compiler.backends.torch.resume import finished, restore
from compiler.backends.torch.run_state import RunState
from compiler.backends.torch.run_values import Loaded, MemoryChoice, Staging, Streams
from compiler.backends.torch.writer import output_writer
from compiler.backends.values import OpValues
from compiler.ir.types import Calibration
from compiler.plan import ops
from compiler.plan.ops import Buffer


class BlockWise(RunState):
    """The ops that run the model one block at a time, and the tail after the blocks."""

    __slots__ = ()

    def cache_block_inputs(self, op: ops.CacheBlockInputs, v: OpValues) -> None:
        """Run every stream up to the blocks and cache their inputs; round the layers before the blocks (the
        op's layers) first, so the quantized verification stream starts from them. Block-wise with weights
        off the CPU (offload, GPUs), what runs before the blocks is read as it runs and dropped after."""
        loaded, staging = v.get(Buffer.MODEL, Loaded), v.get(Buffer.OUTPUT, Staging)
        samples, memory = v.get(Buffer.STREAMS, Streams), v.get(Buffer.MEMORY_MODE, MemoryChoice)
        model, verify = loaded.model, samples.verify
        before = staging.jobs_named(op.layers)
        container = model.block_modules()
        on_use = memory.offload or bool(memory.devices)
        with model.read_on_use(model.outside() if on_use else [], release=memory.offload):
            with Statistics(model.module, before, op.calibration) as stats:
                for s in filter(None, (samples.cal, verify and verify[0])):
                    streams.capture(container, s, loaded.call, stats.new_forward)
            staging.rounder.in_place(before, stats)
            if samples.cal is not None and any(j.learned for j in staging.jobs):  # learned rounding's targets
                samples.cal_float = _float_twin(samples, samples.cal)
            if verify is not None and verify[1] is not None:
                streams.capture(container, verify[1], loaded.call)
        if memory.offload:
            release_memory()
        v.put(Buffer.BLOCK_INPUTS, samples)
        if op.layers:
            v.put(Buffer.QPARAMS, staging.rounder)

    def run_blocks(self, op: ops.RunBlock, v: OpValues) -> Product | None:
        """Per block: its weights, statistics from the calibration stream, rounding, then every stream on. A
        resumable run records each finished block before the hidden states that entered it go."""
        loaded, staging = v.get(Buffer.MODEL, Loaded), v.get(Buffer.OUTPUT, Staging)
        samples = v.get(Buffer.BLOCK_INPUTS, Streams)
        blocks = loaded.model.blocks
        advance = self.progress("blocks", len(blocks))
        learning = [j for j in staging.jobs if j.learned]
        if learning:  # the plan chose whether the steps compile (its time counts them so)
            staging.learning = LearningSteps(op.compiled_steps, learning[0].scheme.span)
        start = _resumed(staging, samples)
        # a learning block's passes and steps allocate the same tensors again and again: their pages stay in the heap
        # for the next (its trims wait), instead of each being mapped and faulted in afresh
        reused = heap_reused if learning else contextlib.nullcontext
        for number, name in enumerate(blocks):
            if number >= start:
                with reused():
                    entered = self._block(loaded, staging, samples, number, name, op.calibration)
                _save_progress(staging, samples, number + 1)
                for cache in entered:
                    cache.close()
            advance()
        v.put(Buffer.BLOCK_INPUTS, samples)
        v.put(Buffer.QPARAMS, staging.rounder)
        learned = staging.learning.outcome() if staging.learning is not None else None
        if staging.learning is not None and (failed := staging.learning.warning()) is not None:
            staging.rounder.report.warnings.append(failed)  # once: the compiler failed, the steps ran eager after
        if not start:
            return Product(learned=learned) if learned else None
        assert staging.resume is not None  # it started after block 0
        return Product(notes=(f"resumed after block {start} of {len(blocks)}: the earlier run's state in "
                              f"{staging.resume.folder}",), learned=learned)

    def _block(self, loaded: Loaded, staging: Staging, samples: Streams, number: int, name: str,
               calibration: Calibration | None) -> list[streams.HiddenCache]:
        """One block run and rounded; the caches of the hidden states that entered it (closed by the caller)."""
        model, cal, verify = loaded.model, samples.cal, samples.verify
        offload, device = staging.memory.offload, staging.memory.devices.get(name, "cpu")
        params = model.parameters_of(name)
        if offload or device != "cpu":
            model.materialize(params, device)
        block = model.block_modules()[number]
        jobs = [j for j in staging.jobs if j.module.startswith(name + ".")]
        smoother, kv = staging.smoother, staging.kv
        if smoother is not None and cal is not None:
            with torch.no_grad():
                smoother.run(smoother.of_block(name), lambda: streams.run_block(block, number, cal, device, None),
                             lambda: streams.run_chunk(block, number, cal, device, 0))
        # the statistics pass; not where the block's layers only learn their rounding (the float stream below)
        observes = any(j.gathers_statistics for j in jobs) or kv.kv is not None
        with Statistics(model.module, jobs, calibration) as stats, kv.running(KvMode.OBSERVE):
            if cal is not None and observes:
                streams.run_block(block, number, cal, device, None, stats.new_forward)
        outputs = {}
        learning = dict.fromkeys(s for j in jobs if (s := j.scheme.learned) is not None) if cal is not None else {}
        targets: list[torch.Tensor] = []  # the float block's outputs on the float stream: what its rounding learns
        if learning:
            assert samples.cal_float is not None  # made with the calibration stream (cache_block_inputs)
            outputs["cal_float"] = samples.cache(samples.cal_float.hidden.dtype)
            with torch.no_grad(), kv.running(KvMode.PASS), step_precision(device):
                streams.run_block(block, number, samples.cal_float, device, outputs["cal_float"], keep=targets)
        if verify is not None:
            with kv.running(KvMode.PASS):
                outputs["float"] = _next(samples, block, number, verify[0], device)
        for settings in learning:
            learned = [j for j in jobs if j.scheme.learned == settings]  # schemes with the same settings learn together
            assert cal is not None and staging.learning is not None  # learning is planned on calibration data only
            staging.rounder.learned.update(learn_block(model.module, block, number, cal, device, learned, targets,
                                                       staging.rounder.scale_dtype or model.dtype, settings,
                                                       staging.learning, _importance_of(stats)))
        targets.clear()
        hooks = staging.rounder.in_place(jobs, stats)
        staging.rounder.learned.clear()  # under torchrun each rank learned the block; its owners wrote what they own
        trim_heap()  # the rounding's freed temporaries (GPTQ's per-column scratch, below the mmap threshold) stay in
        # the heap otherwise, under the forwards that follow: 40-90 MiB on SmolLM2-135M's blocks
        staging.write_kv_scales(name + ".")
        if cal is not None:  # where the block learned, the streams it learns on run in the steps' precision
            with step_precision(device) if learning else contextlib.nullcontext():
                outputs["cal"] = _next(samples, block, number, cal, device)
        if verify is not None and verify[1] is not None:
            with staging.costs.watching(model.module, jobs):
                outputs["quant"] = _next(samples, block, number, verify[1], device)
        for hook in hooks:
            hook.remove()
        entered = []
        for key, stream in (("cal", cal), ("cal_float", samples.cal_float), ("float", verify and verify[0]),
                            ("quant", verify and verify[1])):
            if key in outputs:
                assert stream is not None  # it produced outputs
                entered.append(stream.hidden)
                stream.hidden = outputs[key]
        if offload or device != "cpu":
            model.release(params)
        release_memory()
        return entered

    def _tail(self, loaded: Loaded, staging: Staging, samples: Streams, cal, verify, jobs: list[Job],
              calibration: Calibration | None) -> None:
        """What comes after the blocks runs on the streams' last hidden states: statistics for its layers,
        rounding, and the verification comparison at the model's output. Without verification, and with no
        layer there that needs data, nothing runs: its layers are rounded one at a time."""
        model, call, offload, rounder = loaded.model, loaded.call, staging.memory.offload, staging.rounder
        smoother = staging.smoother
        smoothed = smoother.of_block(None) if smoother is not None and cal is not None else []
        if verify is not None and verify[1] is None:  # the emitted folder is compared at the Verify op
            verify = None
        if verify is None and not (cal is not None and any(j.needs_data for j in jobs)) and not smoothed:
            rounder.streamed(jobs, None, offload)
            return
        samples.compared = True
        missing = [p for p in model.outside() if not model.is_resident(p)]
        model.materialize(missing)
        container = model.block_modules()
        if smoothed and smoother is not None:
            with torch.no_grad():
                smoother.run(smoothed, lambda: list(streams.replay_tail(container, cal, call, lazy=True)),
                             lambda: streams.first_tail_output(container, cal, call))
        with Statistics(model.module, jobs, calibration) as stats:
            if cal is not None and any(j.needs_data for j in jobs):
                for _ in streams.replay_tail(container, cal, call, stats.new_forward, lazy=True):
                    pass  # the hooks gathered what they need; the logits are dropped chunk by chunk
        if verify is not None and not jobs:  # nothing to round here: float and quantized logits chunk by chunk
            for ref, cand, feed in zip(streams.replay_tail(container, verify[0], call, lazy=True),
                                       streams.replay_tail(container, verify[1], call, lazy=True),
                                       verify[1].feeds, strict=True):
                verify[2].update(ref.float().numpy(), cand.float().numpy(), *streams.tokens_of(feed))
        # the float logits are kept while the tail's layers are rounded; the quantized ones come one at a time
        reference = streams.replay_tail(container, verify[0], call) if verify is not None and jobs else None
        hooks = rounder.in_place(jobs, stats)
        if reference is not None:
            with staging.costs.watching(model.module, jobs):
                candidate = streams.replay_tail(container, verify[1], call, lazy=True)
                for ref, cand, feed in zip(reference, candidate, verify[1].feeds, strict=True):
                    verify[2].update(ref.float().numpy(), cand.float().numpy(), *streams.tokens_of(feed))
            del reference
        for hook in hooks:
            hook.remove()
        if offload:
            model.release(missing)


def _float_twin(samples: Streams, cal: streams.Stream) -> streams.Stream:
    """A stream of the same samples and block inputs as `cal`, its hidden states a copy of cal's: it runs through
    the float blocks while `cal` runs through the rounded ones."""
    hidden = samples.cache(cal.hidden.dtype)
    for chunk in range(len(cal)):
        hidden.put(chunk, cal.hidden.get(chunk))
    return streams.Stream("calibration (float)", cal.feeds, hidden, cal.rest, cal.arity)


def _importance_of(stats: Statistics):
    """A job's inputs' column mean squares as the block's statistics pass gathered them, or None (none gathered
    for it, or no calibration token reached it: an MoE expert the router never chose)."""
    def importance(job: Job) -> np.ndarray | None:
        return stats.importance(job) if job.importance_weighted and stats.saw(job) else None
    return importance


def _next(samples: Streams, block, number: int, stream: streams.Stream, device) -> streams.HiddenCache:
    out = samples.cache(stream.hidden.dtype)
    with torch.no_grad():
        streams.run_block(block, number, stream, device, out)
    return out


# ---- resuming (offload with `disk`: resume.py) --------------------------------------------------------
def _resumed(staging: Staging, samples: Streams) -> int:
    """The blocks an earlier run finished (0 without one): each stream takes the hidden states it left, and
    what those blocks reported is reported again."""
    resume = staging.resume
    if resume is None or resume.saved is None:
        return 0
    samples.caches.extend(resume.adopt(samples.running()))
    restore(resume.saved.finished, staging.rounder, staging.jobs, staging.costs, staging.kv, staging.smoother)
    return resume.start


def _save_progress(staging: Staging, samples: Streams, done: int) -> None:
    """Record `done` finished blocks (resumable runs only)."""
    if staging.resume is None:
        return
    staging.resume.save(done, {s.name: s.hidden.folder for s in samples.running() if s.hidden.folder},
                        finished(staging.rounder, staging.costs, staging.kv, staging.smoother))
    if (out := output_writer(staging.writer)) is not None:
        out.keep = True
