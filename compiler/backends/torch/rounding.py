"""Rounding on the torch backend: each job's weight rounded (GPTQ with its Hessian, falling back as it
must), its compressed tensors written, and its module made to compute like the emitted model; what the
compile summary reports about it (dampened GPTQ layers, experts no token reached) is kept here."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from compiler.backends.products import Pending
from compiler.backends.ranks import Ranks, all_gathered, gather_to_first
from compiler.backends.release import release_memory, trim_heap
from compiler.backends.result import refuse_nonfinite
from compiler.backends.torch.compressed import layer_tensors
from compiler.backends.torch.fallbacks import sibling_range
from compiler.backends.torch.figures import input_range, weight_sqnr
from compiler.backends.torch.formats import BlockEncoder
from compiler.backends.torch.global_scales import SharedGlobalScales
from compiler.backends.torch.layers import Job, Rounded, Statistics, apply_quantized, input_qparams, quantize_job
from compiler.backends.torch.model import TorchModel
from compiler.backends.torch.sharing import owners, share_hessians, share_statistics
from compiler.backends.torch.writer import OutputWriter, RankCollector
from compiler.diagnostics import warning
from compiler.ir.types import Calibration
from compiler.plan.memory import expert_batches
from compiler.quant.gptq import SingularHessian
from compiler.quant.gptq_batch import batches_scales, gptq_batched
from compiler.quant.kquants import GgufBlocks
from compiler.quant.parallel import one_ahead, one_behind
from compiler.quant.weights import Convention, sqnr_from_sums
from compiler.source import Span


@contextlib.contextmanager
def _torch_on_one_thread() -> Iterator[None]:
    """torch's own ops run on the calling thread while the body runs, and its thread count is put back after.
    File to file, numba's kernels round on our threads and torch only casts small tensors (a weight's scales to
    bfloat16), but each cast of over 32k values woke an OpenMP team whose idle worker then spun on the cores the
    rounding needed: 1.9 of a 6 GiB W4A16 mse run's 36 CPU seconds (perf record, two cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@dataclass
class Rounder:
    """Rounds the run's jobs into the output folder; static input ranges as `calibration` says; Q409 points at
    `model_span`."""
    calibration: Calibration | None
    model_span: Span | None
    model: TorchModel
    writer: OutputWriter | RankCollector  # the output format's (formats.py); a collector on torchrun's ranks but the first
    global_scales: SharedGlobalScales
    report: Pending  # its figures and warnings, drained after each op
    progress: Callable
    dampened: dict[str, float] = field(default_factory=dict)  # GPTQ layers whose Hessian needed more dampening
    # (inf: rounded with rtn)
    unseen: list[Job] = field(default_factory=list)  # layers no calibration token reached (MoE experts)
    hooks: list = field(default_factory=list)  # the modules' input quantizers, removed when the run closes
    ranks: Ranks = field(default_factory=Ranks)  # torchrun's ranks share the rounding of each call (one outside)
    scale_dtype: torch.dtype | None = None  # what the scales are rounded to (None: the model's dtype)
    encoder: BlockEncoder | None = None  # a format with blocks of its own (GGUF's) encodes each rounded layer (every rank)
    learned: dict[str, Rounded] = field(default_factory=dict)  # layers whose rounding their block learned, until
    # they are written (torch/learned.py)

    def streamed(self, jobs: list[Job], stats: Statistics | None, offload: bool) -> None:
        """Round layers whose weights may not be resident (offload): each read, rounded, written, dropped."""
        for number, job in enumerate(jobs):
            params = [p for p in self.model.parameters_of(job.module) if not self.model.is_resident(p)]
            self.model.materialize(params)
            self.in_place([job], stats)
            if offload:
                self.model.release(self.model.parameters_of(job.module))
                _trim_after_block(jobs, number)

    def from_files(self, jobs: list[Job], copies: Callable[[], None] | None = None) -> None:
        """Data-free rounding file to file: each weight read, rounded, written and dropped; nothing runs. The
        next weight is mapped (as stored) and its pages faulted in on a thread while this one is rounded, so the
        reading overlaps the rounding instead of leaving the cores idle (one more weight in flight:
        torch/cost.py). `copies`: what else the output takes from the files unchanged, written on a thread of
        its own beside the rounding (the writer places each tensor by offset, so the order does not matter)."""
        advance = self.progress("quantize", len(jobs))
        # each weight as stored: the roundings make float32 slices of it as they go
        weights = one_ahead(self.model.shards.mapped, [job.layer.weight for job in jobs])
        # its tensors packed and written on a thread of their own while the next weight is rounded: in this
        # thread the cores waited for each write (one more rounded weight in flight: torch/cost.py)
        with _torch_on_one_thread(), one_behind("qrc-copy") as copy, one_behind("qrc-write") as write:
            if copies is not None:
                copy(copies)
            for number, (job, weight) in enumerate(zip(jobs, weights, strict=True)):
                q = self.quantize(job, weight, None, measure=True)
                write(functools.partial(self.write, job, q, None))
                self.record_rounded(job, weight, q)
                del weight, q
                _trim_after_block(jobs, number, collect=False)  # no cycles here: a collection would scan every
                advance()  # object transformers' classes made (29 ms a block, 0.8 s of a 5.9 GiB checkpoint's 10 s)
        # the copies' and the last weights' freed slices go back before the load check's process peaks beside this
        # one (SmolLM2-135M from its GGUF: the heap kept 61 MiB of dequantized slices)
        trim_heap()

    def from_files_shared(self, jobs: list[Job], ranks: Ranks) -> None:
        """Data-free rounding file to file, shared by torchrun's ranks: job i is rounded by rank i mod N, a round
        of N jobs at a time; each round the other ranks' tensors and figures go to the first rank, which writes
        them (the layout is by name and offset, so the bytes are those of one process). At most N rounded
        weights are in flight."""
        advance = self.progress("quantize", len(jobs))
        for start in range(0, len(jobs), ranks.world):
            number = start + ranks.rank
            if number < len(jobs):
                job = jobs[number]
                weight = self.model.shards.read(job.layer.weight).float()
                self.record_rounded(job, weight, self.round(job, weight, None, None, measure=True))
                del weight
            self._hand_to_first(jobs[start:start + ranks.world])
            for _ in range(min(ranks.world, len(jobs) - start)):
                advance()
        release_memory()

    def in_place(self, jobs: list[Job], stats: Statistics | None, advance=None) -> list:
        """Round each job's weight, write its tensors, and make its module compute like the emitted model.
        Under torchrun the ranks share the rounding (_shared): every rank ends with the same modules."""
        hooks = []
        if any(job.gptq for job in jobs):  # the forward that summed the Hessians is done: its working set goes
            release_memory()  # back to the OS first, so that GPTQ's scratch takes its place (the plan counts the larger)
        if stats is not None:
            share_statistics(stats, self.ranks)  # every rank's observers (once per Statistics)
        prepared = [self._prepare(job, stats) for job in jobs]
        rounded, owner = self._shared(prepared, stats) if self.ranks.world > 1 else (self._batched(prepared, stats), {})
        block = prepared[0][0].layer.block if prepared else None
        for job, act in prepared:
            if job.layer.block != block:  # a block's temporaries freed: back to the OS, as block-wise runs do
                trim_heap()
                block = job.layer.block
            module = self._linear(job)
            mine = owner.get(job.layer.name, self.ranks.rank) == self.ranks.rank
            q = rounded.pop(job.layer.name, None)  # every job under torchrun; batched experts in one process
            if q is not None:
                if mine:  # its owner packs its tensors and measures it; the first rank writes them
                    self.write(job, q, act)
            else:
                q = self.round(job, module.weight, stats, act)
            if stats is not None:
                stats.release(job)
            original = module.weight
            hook = apply_quantized(module, q, job, act)
            if mine:
                self.record(job, original, module.weight, act)
            if hook is not None:
                hooks.append(hook)
            if advance is not None:
                advance()
        trim_heap()  # the last block's temporaries too: the forwards after this one run in the memory they held
        if owner:
            self._hand_to_first([job for job, _ in prepared])
        self.hooks.extend(hooks)
        return hooks

    def _hand_to_first(self, jobs: list[Job]) -> None:
        """Under torchrun: the tensors and figures of the jobs each rank owned, to the first rank (which writes
        them: the layout is by name and offset, so the order they come in does not matter)."""
        names = [job.layer.name for job in jobs]
        figures = ({n: self.report.weight_sqnr.pop(n) for n in names if n in self.report.weight_sqnr},
                   {n: self.report.input_ranges.pop(n) for n in names if n in self.report.input_ranges})
        handed = self.writer.take() if isinstance(self.writer, RankCollector) else ({}, {})
        for (tensors, encoded), (sqnr, ranges) in gather_to_first(self.ranks, (handed, figures)):
            for name, tensor in RankCollector.unpack(tensors).items():
                self.writer.put(name, tensor)
            for name, data in encoded.items():  # only a format with blocks of its own hands encoded bytes on
                self.writer.put_encoded(name, data)
            self.report.weight_sqnr.update(sqnr)
            self.report.input_ranges.update(ranges)

    def _prepare(self, job: Job, stats: Statistics | None) -> tuple[Job, tuple[float, int] | None]:
        """The job as it will be rounded (an MoE expert no token reached: rtn, its siblings' input range,
        fallbacks.py) and its static input's range."""
        self._linear(job)  # Linear layers only (Q411)
        unseen = job.gathers_statistics and stats is not None and not stats.saw(job)
        if unseen:
            self.unseen.append(job)
            job = job.with_rtn() if job.gptq else job
        act = sibling_range(job, stats, self.calibration, self.model.dtype) if unseen and stats is not None else \
            input_qparams(job, stats, self.calibration, self.model.dtype)
        if job.static_input and act is None:
            self.report.warnings.append(warning(
                "Q405", f"the input of `{job.layer.name}` was never finite during calibration; its activations "
                "stay in float", job.scheme.span, "no range", help="check the calibration data"))
        return job, act

    def _shared(self, prepared: list[tuple[Job, tuple[float, int] | None]], stats: Statistics | None
                ) -> tuple[dict[str, Rounded], dict[str, int]]:
        """Each job rounded by the rank it is assigned to (sharing.owners), then every rank's rounded weights
        and dampening handed to all; with the owners."""
        owner = owners([job for job, _ in prepared], self.ranks.world)
        if stats is not None:
            share_hessians(stats, self.ranks, [job for job, _ in prepared], owner)
        mine = {}
        for job, _ in prepared:
            if owner[job.layer.name] == self.ranks.rank:
                mine[job.layer.name] = self.quantize(job, self._linear(job).weight, stats)
        dampened = {name: self.dampened[name] for name in mine if name in self.dampened}
        rounded: dict[str, Rounded] = {}
        for theirs, their_dampened in all_gathered(self.ranks, (mine, dampened)):
            rounded.update(theirs)
            self.dampened.update(their_dampened)
        return rounded, owner

    def _batched(self, prepared: list[tuple[Job, tuple[float, int] | None]], stats: Statistics | None
                 ) -> dict[str, Rounded]:
        """The block's GPTQ experts rounded as batches of one shape and scheme (plan/memory.py expert_batches,
        which the plan counts), by name; every other job is rounded on its own as the loop reaches it."""
        if stats is None or self.encoder is not None:
            return {}
        jobs = {job.layer.name: job for job, _ in prepared if _batchable(job) and job.layer.name not in self.learned}
        rounded: dict[str, Rounded] = {}
        for batch in expert_batches([job.layer for job in jobs.values()]):
            by_scheme: dict[tuple, list[Job]] = {}
            for layer in batch:
                job = jobs[layer.name]
                if str(self._linear(job).weight.device) == "cpu":
                    by_scheme.setdefault(_gptq_settings(job), []).append(job)
            for same in by_scheme.values():
                if len(same) > 1:
                    rounded.update(self._gptq_batch(same, stats))
        return rounded

    def _gptq_batch(self, jobs: list[Job], stats: Statistics) -> dict[str, Rounded]:
        """GPTQ of `jobs` (one shape and scheme, on the CPU) as one batch; a Hessian no dampening makes definite
        rounds with rtn, as quantize() does."""
        weights = [self._linear(job).weight.detach().float() for job in jobs]
        for job, weight in zip(jobs, weights, strict=True):
            self._refuse_nonfinite(job, weight)
        scheme = jobs[0].scheme
        scale_dtype = self.scale_dtype or self.model.dtype
        results = gptq_batched([w.numpy() for w in weights], stats.hessians_of(jobs),
                               scheme.quantized_weights, scheme.act_order, Convention.TORCH,
                               str(scale_dtype).removeprefix("torch."),
                               lambda i, used: self.dampened.setdefault(jobs[i].layer.name, used),
                               scheme.static_groups, scheme.mse_scales)
        rounded: dict[str, Rounded] = {}
        for job, weight, result in zip(jobs, weights, results, strict=True):
            if isinstance(result, SingularHessian):
                self.dampened[job.layer.name] = math.inf
                rounded[job.layer.name] = quantize_job(job.with_rtn(), weight, None, scale_dtype)
            else:
                rounded[job.layer.name] = result
        return rounded

    def _linear(self, job: Job) -> torch.nn.Linear:
        """The module that computes `job` (an nn.Linear: refuse_non_linear said so before any work)."""
        module = self.model.module.get_submodule(job.module)
        assert isinstance(module, torch.nn.Linear)
        return module

    def round(self, job: Job, weight: torch.Tensor, stats: Statistics | None, act, measure: bool = False) -> Rounded:
        """Round one weight (quantize) and write its compressed tensors."""
        q = self.quantize(job, weight, stats, measure)
        self.write(job, q, act)
        return q

    def quantize(self, job: Job, weight: torch.Tensor, stats: Statistics | None, measure: bool = False) -> Rounded:
        """One weight rounded, refusing non-finite ones (Q409). GPTQ raises its dampening where H is not
        definite, and rounds with rtn where no dampening helps (Q418, once). `measure`: an integer rounding
        also takes the sums of its SQNR (QuantizedWeight.sums), and a finite sum of squares shows every value
        finite without a pass of its own (a non-finite one is checked value by value)."""
        learned = self.learned.pop(job.layer.name, None)
        if learned is not None:  # its block learned it (blockwise.py): the float weight it came from checked here
            self._refuse_nonfinite(job, weight)
            return learned
        summed = measure and not job.gptq and not job.scheme.quantized_weights.qtype.is_kquant and self.encoder is None
        if not summed:
            weight = weight.float()
            self._refuse_nonfinite(job, weight)
        reference = self.encoder.reference_blocks(job, weight) if self.encoder is not None else None
        if reference is not None:
            return reference
        kept = self.global_scales.kept(job.layer.name, weight)  # an NVFP4 source's own tensors (nvfp4_source.py)
        if kept is not None:
            return kept if measure else dataclasses.replace(kept, dequantized=weight.float())
        try:
            q = quantize_job(job, weight, stats, self.scale_dtype or self.model.dtype,
                             lambda used: self.dampened.setdefault(job.layer.name, used),
                             self.global_scales.shared(job.layer.name), measure)
        except SingularHessian:
            self.dampened[job.layer.name] = math.inf
            return quantize_job(job.with_rtn(), weight, None, self.scale_dtype or self.model.dtype)
        except Exception:
            if summed:  # not checked first: a non-finite value is the likely cause (Q409)
                self._refuse_nonfinite(job, weight)
            raise
        sums = getattr(q, "sums", None)
        if summed and not (sums is not None and math.isfinite(sums[0])):
            self._refuse_nonfinite(job, weight)
        return q

    def _refuse_nonfinite(self, job: Job, weight: torch.Tensor) -> None:
        """Q409 when any value of the weight is NaN or infinite (a pass over it as float32)."""
        refuse_nonfinite(self.model_span, job.layer, weight.detach().float().cpu().numpy())

    def write(self, job: Job, q: Rounded, act) -> None:
        """A rounded weight's compressed tensors (and its input scale) into the output; GGUF's blocks."""
        if self.encoder is not None:  # encoded here, on the rank that rounded it
            for name, data in self.encoder.rounded_tensors(job, q).items():
                self.writer.put_encoded(name, data)
            return
        assert not isinstance(q, GgufBlocks)  # check_supported: K-quants are written in GGUF only
        for name, tensor in layer_tensors(job.layer, job.scheme, q, act, self.model.dtype).items():
            self.writer.put(name, tensor)

    def record_rounded(self, job: Job, original: torch.Tensor, q: Rounded) -> None:
        """The weight SQNR of a layer rounded from the files: from the sums its rounding took, else from its
        dequantized values."""
        sums = getattr(q, "sums", None)
        if sums is not None:
            self.report.weight_sqnr[job.layer.name] = sqnr_from_sums(sums)
        else:
            self.record(job, original.float(), torch.from_numpy(q.dequantize()), None)

    def record(self, job: Job, original: torch.Tensor, dequantized: torch.Tensor, act) -> None:
        """The report's figures: weight SQNR, and the range a static input is quantized to."""
        self.report.weight_sqnr[job.layer.name] = weight_sqnr(original, dequantized)
        if act is not None:
            self.report.input_ranges[job.layer.name] = input_range(job.scheme.quantized_inputs, act)


def _batchable(job: Job) -> bool:
    """Whether GPTQ may round `job` in a batch: integer GPTQ (not GGUF's K-quants) whose scales are all fixed
    before its loop (gptq.batches_scales)."""
    spec = job.scheme.quantized_weights
    return job.gptq and not job.imatrix and not spec.qtype.is_float and not spec.qtype.is_kquant and \
        batches_scales(spec, job.scheme.act_order, job.scheme.static_groups)


def _gptq_settings(job: Job) -> tuple:
    """What must be equal for layers to round in one GPTQ batch, beside their shape."""
    scheme = job.scheme
    return scheme.quantized_weights, scheme.act_order, scheme.static_groups, scheme.mse_scales


def _trim_after_block(jobs: list[Job], number: int, collect: bool = True) -> None:
    """After the last job of a block, give freed memory back (glibc keeps freed pages otherwise; trimming
    after every layer costs more than it saves), collecting garbage first if `collect`."""
    if number + 1 < len(jobs) and jobs[number + 1].layer.block == jobs[number].layer.block:
        return
    if collect:
        release_memory()
    else:
        trim_heap()
