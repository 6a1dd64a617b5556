"""Rounding on the torch backend: each job's weight rounded (GPTQ with its Hessian, falling back as it
must), its compressed tensors written, and its module made to compute like the emitted model; what the
compile summary reports about it (dampened GPTQ layers, experts no token reached) is kept here."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from compiler.backends.products import Pending
from compiler.backends.ranks import Ranks, gather_to_first
from compiler.backends.release import release_memory
from compiler.backends.result import refuse_nonfinite
from compiler.backends.torch.compressed import layer_tensors
from compiler.backends.torch.fallbacks import sibling_range
from compiler.backends.torch.figures import input_range, weight_sqnr
from compiler.backends.torch.float_formats import FloatQuantized
from compiler.backends.torch.global_scales import SharedGlobalScales
from compiler.backends.torch.layers import Job, Statistics, apply_quantized, input_qparams, quantize_job
from compiler.backends.torch.model import TorchModel
from compiler.backends.torch.writer import FolderWriter, RankCollector
from compiler.diagnostics import warning
from compiler.ir.types import Calibration
from compiler.quant.gptq import SingularHessian
from compiler.quant.weights import QuantizedWeight
from compiler.source import Span


@dataclass
class Rounder:
    """Rounds the run's jobs into the output folder; static input ranges as `calibration` says; Q409 points at
    `model_span`."""
    calibration: Calibration | None
    model_span: Span | None
    model: TorchModel
    writer: FolderWriter | RankCollector  # a collector on torchrun's ranks but the first
    global_scales: SharedGlobalScales
    report: Pending  # its figures and warnings, drained after each op
    progress: Callable
    dampened: dict[str, float] = field(default_factory=dict)  # GPTQ layers whose Hessian needed more dampening
    # (inf: rounded with rtn)
    unseen: list[Job] = field(default_factory=list)  # layers no calibration token reached (MoE experts)
    hooks: list = field(default_factory=list)  # the modules' input quantizers, removed when the run closes

    def streamed(self, jobs: list[Job], stats: Statistics | None, offload: bool) -> None:
        """Round layers whose weights may not be resident (offload): each read, rounded, written, dropped."""
        for number, job in enumerate(jobs):
            params = [p for p in self.model.parameters_of(job.module) if not self.model.is_resident(p)]
            self.model.materialize(params)
            self.in_place([job], stats)
            if offload:
                self.model.release(self.model.parameters_of(job.module))
                _trim_after_block(jobs, number)

    def from_files(self, jobs: list[Job]) -> None:
        """Data-free rounding file to file: each weight read, rounded, written and dropped; nothing runs."""
        advance = self.progress("quantize", len(jobs))
        for number, job in enumerate(jobs):
            weight = self.model.shards.read(job.layer.weight).float()
            q = self.round(job, weight, None, None)
            self.record(job, weight, torch.from_numpy(q.dequantize()), None)
            del weight, q
            _trim_after_block(jobs, number)
            advance()

    def from_files_shared(self, jobs: list[Job], ranks: Ranks) -> None:
        """Data-free rounding file to file, shared by torchrun's ranks: job i is rounded by rank i mod N, a round
        of N jobs at a time; each round the other ranks' tensors and figures go to the first rank, which writes
        them (the layout is by name and offset, so the bytes are those of one process). At most N rounded
        weights are in flight."""
        advance = self.progress("quantize", len(jobs))
        for start in range(0, len(jobs), ranks.world):
            number = start + ranks.rank
            sqnr: dict[str, float] = {}
            if number < len(jobs):
                job = jobs[number]
                weight = self.model.shards.read(job.layer.weight).float()
                q = self.round(job, weight, None, None)
                self.record(job, weight, torch.from_numpy(q.dequantize()), None)
                sqnr[job.layer.name] = self.report.weight_sqnr[job.layer.name]
                del weight, q
            tensors = self.writer.take() if isinstance(self.writer, RankCollector) else {}
            for handed, figures in gather_to_first(ranks, (tensors, sqnr)):
                for name, tensor in handed.items():
                    self.writer.put(name, tensor)
                self.report.weight_sqnr.update(figures)
            for _ in range(min(ranks.world, len(jobs) - start)):
                advance()
        release_memory()

    def in_place(self, jobs: list[Job], stats: Statistics | None, advance=None) -> list:
        """Round each job's weight, write its tensors, and make its module compute like the emitted model."""
        hooks = []
        for job in jobs:
            module = self.model.module.get_submodule(job.module)
            assert isinstance(module, torch.nn.Linear)  # Linear layers only (Q411)
            unseen = job.needs_data and stats is not None and not stats.saw(job)
            if unseen:  # an MoE expert no token reached: rtn, its siblings' input range (fallbacks.py)
                self.unseen.append(job)
                job = job.with_rtn() if job.gptq else job
            act = sibling_range(job, stats, self.calibration, self.model.dtype) if unseen and stats is not None else \
                input_qparams(job, stats, self.calibration, self.model.dtype)
            if job.static_input and act is None:
                self.report.warnings.append(warning(
                    "Q405", f"the input of `{job.layer.name}` was never finite during calibration; its activations "
                    "stay in float", job.scheme.span, "no range", help="check the calibration data"))
            q = self.round(job, module.weight, stats, act)
            if stats is not None:
                stats.release(job)
            original = module.weight
            hook = apply_quantized(module, q, job, act)
            self.record(job, original, module.weight, act)
            if hook is not None:
                hooks.append(hook)
            if advance is not None:
                advance()
        self.hooks.extend(hooks)
        return hooks

    def round(self, job: Job, weight: torch.Tensor, stats: Statistics | None, act) -> QuantizedWeight | FloatQuantized:
        """Round one weight (refusing non-finite ones, Q409) and write its compressed tensors. GPTQ raises its
        dampening where H is not definite, and rounds with rtn where no dampening helps (Q418, once)."""
        refuse_nonfinite(self.model_span, job.layer, weight.detach().float().cpu().numpy())
        try:
            q = quantize_job(job, weight, stats, self.model.dtype,
                             lambda used: self.dampened.setdefault(job.layer.name, used),
                             self.global_scales.absmax(job.layer.name))
        except SingularHessian:
            self.dampened[job.layer.name] = math.inf
            q = quantize_job(job.with_rtn(), weight, None, self.model.dtype)
        for name, tensor in layer_tensors(job.layer, job.scheme, q, act, self.model.dtype).items():
            self.writer.put(name, tensor)
        return q

    def record(self, job: Job, original: torch.Tensor, dequantized: torch.Tensor, act) -> None:
        """The report's figures: weight SQNR, and the range a static input is quantized to."""
        self.report.weight_sqnr[job.layer.name] = weight_sqnr(original, dequantized)
        if act is not None:
            self.report.input_ranges[job.layer.name] = input_range(job.scheme.quantized_inputs, act)


def _trim_after_block(jobs: list[Job], number: int) -> None:
    """After the last job of a block, give freed memory back (glibc keeps freed pages otherwise; trimming
    after every layer costs more than it saves)."""
    if number + 1 == len(jobs) or jobs[number + 1].layer.block != jobs[number].layer.block:
        release_memory()
