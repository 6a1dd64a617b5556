"""The torch backend's `prepare_run` op, once the assignment is final: each quantized layer's job, the output
opened by its format with every tensor's place, what rounds into it (the rounder, the shared global scales,
the KV-cache quantizer, each layer's error, the transform), a resumable run's state, and the sample streams.
What it needs from the plan its op carries (compiler/plan/ops.py, PrepareRun)."""

from __future__ import annotations

import torch

from compiler import data
from compiler.backends.agreement import Agreement
from compiler.backends.result import held_out_batches
from compiler.backends.torch import nvfp4_source
from compiler.backends.torch.artifact import can_verify_artifact
from compiler.backends.torch.attribution import LayerCosts
from compiler.backends.torch.global_scales import SharedGlobalScales
from compiler.backends.torch.kv_cache import KvCacheQuantizer
from compiler.backends.torch.layers import jobs_of, refuse_non_linear
from compiler.backends.torch.resume import BlockResume, checkpoint_identity
from compiler.backends.torch.rounding import Rounder
from compiler.backends.torch.run_values import Loaded, MemoryChoice, Staging, Streams, Target
from compiler.backends.torch.smoother import Smoother
from compiler.backends.torch.writer import output_writer
from compiler.diagnostics import Diagnostic
from compiler.models.names import attention_modules
from compiler.plan import ops
from compiler.resolve.assignment import Assignment
from compiler.safe_files import own_folder


def prepare_output(op: ops.PrepareRun, run, loaded: Loaded, memory: MemoryChoice, assignment: Assignment) -> Staging:
    """The jobs, the output opened (`run`'s format, destination, plan and ranks), and what rounds into it."""
    model, plan = loaded.model, run.plan
    target = Target(run.output, plan, run.ranks, loaded, assignment, jobs_of(model, assignment))
    jobs = target.jobs
    if not loaded.file_to_file:
        refuse_non_linear(model, jobs, plan.spans.recipe, assignment)
    # each sibling's weight as its rounding sees it (AWQ and SmoothQuant fold their scales in before)
    where = {j.layer.name: (j.module, j.layer.weight) for j in jobs}
    # an NVFP4 source's layers rounded to NVFP4 are written as it stores them, where their values are its
    source = ((lambda name: nvfp4_source.stored_layer(model.shards, where[name][1]))
              if loaded.index.fp4_compressed else None)
    attention = attention_modules([x.name for x in loaded.index.layers]) if op.kv_cache is not None else []
    kv = KvCacheQuantizer(model.module, attention, op.kv_cache, model.dtype)
    resume = _open_resume(op, run, loaded, memory)
    staged = resume.staged if resume is not None else None
    resumed = resume is not None and resume.start > 0
    opened = run.format.open(target, staged, resumed, attention)  # every tensor's place, before any work
    global_scales = SharedGlobalScales({j.layer.name: j.scheme.quantized_weights.qtype for j in jobs},
                                       lambda name: model.weight_now(*where[name]), loaded.file_to_file, source,
                                       opened.unit_global)
    if resumed and (out := output_writer(opened.writer)) is not None:
        out.keep = True
    # a format that stores its scales in a dtype of its own (GGUF's float16) is rounded with them: qrc's model
    # computes what its runtime decodes
    rounder = Rounder(op.calibration, plan.spans.model, model, opened.writer, global_scales, run.pending,
                      run.progress, ranks=run.ranks, scale_dtype=_scale_dtype(op.format.scale_dtype, model.dtype),
                      encoder=opened.encoder)
    if opened.warning is not None:
        run.pending.warnings.append(opened.warning)
    if memory.disk is not None:
        own_folder(memory.disk)
    smoother = None
    if assignment.smoothing and op.calibration is not None and op.transform is not None:
        smoother = Smoother(op.transform, op.calibration, model, loaded.index, assignment.smoothing, jobs,
                            output_writer(opened.writer), run.ranks)  # the first rank writes
    return Staging(target.output, plan, run.ranks, loaded, assignment, jobs, memory, opened.writer, rounder,
                   global_scales, kv, _layer_costs(model, jobs, smoother), resume, opened.early,
                   opened.config or {}, smoother)


def _layer_costs(model, jobs, smoother: Smoother | None) -> LayerCosts:
    """Each layer's own error against its float weight as a transform left it (what its rounding
    approximates), read from the checkpoint."""
    if smoother is None:
        return LayerCosts(model.shards.read)
    module_of = {j.layer.weight: j.module for j in jobs}
    return LayerCosts(lambda key: smoother.as_folded(module_of[key], model.shards.read(key)))


def open_streams(op: ops.PrepareRun, samples: Streams, staging: Staging, opened_by_transformers: bool,
                 warnings: list[Diagnostic]) -> None:
    """The calibration stream where a layer rounds with data, the KV scales or the transform's statistics
    come from it; verification's float stream, and its quantized one unless the emitted folder is what runs."""
    index = staging.loaded.index
    held = op.held_out
    needed = any(j.needs_data for j in staging.jobs) or op.kv_cache is not None or staging.smoother is not None
    if op.calibration is not None and needed:
        cal = op.calibration
        samples.cal = samples.stream("calibration", data.calibration_batches(
            cal.data, index, cal.chunk, held.samples if held is not None else 0))
    if held is None:
        return
    batches = list(held_out_batches(held, index, warnings))
    # the first rank stages the emitted folder: every rank opens it (ranks on other machines a copy the first
    # sends them), each running its own held-out chunks
    samples.emitted = can_verify_artifact(staging.model) and opened_by_transformers
    quantized = None if samples.emitted else samples.stream("verify (quantized)", batches)
    samples.verify = (samples.stream("verify (float)", batches), quantized, Agreement())


def _open_resume(op: ops.PrepareRun, run, loaded: Loaded, memory: MemoryChoice) -> BlockResume | None:
    """The resume state of a block-wise offload run with `disk` (None for other runs)."""
    if not (memory.offload and memory.disk is not None and op.blocks):
        return None
    identity = (run.plan.recipe_text, checkpoint_identity(loaded.model.folder), str(run.output.resolve()))
    return BlockResume.open(memory.disk, run.output, identity, run.ranks, run.plan.spans.disk,
                            run.pending.warnings, op.blocks)


def _scale_dtype(stored: str | None, model: torch.dtype) -> torch.dtype:
    """The dtype weight scales are rounded to: the output format's where it fixes one, else the model's."""
    return model if stored is None else getattr(torch, stored)
