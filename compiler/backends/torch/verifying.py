"""The torch backend's Verify op: the held-out samples compared at the model's output, on the emitted folder
as transformers loads it where it can (artifact.py, emitted_verify.py), else on qrc's own model."""

from __future__ import annotations

import tempfile
from pathlib import Path

from compiler.backends.agreement import Agreement, passes
from compiler.backends.products import Product
from compiler.backends.ranks import merged_one, staged_everywhere
from compiler.backends.result import judge
from compiler.backends.torch import streams
from compiler.backends.torch.artifact import open_artifact
from compiler.backends.torch.attribution import jobs_in
from compiler.backends.torch.blockwise import BlockWise
from compiler.backends.torch.emitted_verify import hidden_cache, run_emitted
from compiler.backends.torch.run_values import Emitted, Loaded, Reference, Staging, Streams
from compiler.backends.torch.sharing import share_costs
from compiler.backends.torch.writer import output_writer
from compiler.backends.values import OpValues
from compiler.plan import ops
from compiler.plan.ops import Buffer


class Verifying(BlockWise):
    """Verification, after the blocks (block-wise) or on the resident model (full)."""

    __slots__ = ()

    def verify(self, op: ops.Verify, v: OpValues) -> Product:
        """Compare at the model's output: the quantized model against the kept float outputs (full), or the
        two streams through the tail (block-wise), unless rounding the tail already did."""
        loaded, staging = v.get(Buffer.MODEL, Loaded), v.get(Buffer.OUTPUT, Staging)
        emitted = v.get(Buffer.EMITTED_MODEL, Emitted)
        blockwise = v.declares(Buffer.BLOCK_INPUTS)
        samples = v.get(Buffer.BLOCK_INPUTS if blockwise else Buffer.STREAMS, Streams)
        reference = v.get(Buffer.REFERENCE, Reference) if v.declares(Buffer.REFERENCE) else None
        float_stream, quantized, agreement = samples.verification()
        if samples.emitted:
            self._verify_emitted(loaded, staging, float_stream, agreement, reference)
            measured_on = (
                "the emitted folder, loaded as transformers loads it (compressed-tensors)" if not emitted.unopened
                else "the emitted folder's tensors, decoded layer by layer by compressed-tensors (Q427: transformers "
                "itself did not open it)")
            rotation = getattr(loaded.model.shards, "rotation", None)  # torch/rotation.py RotatedShards
            if rotation is not None and rotation.down is not None:
                measured_on += ", its online R4 applied by compressed-tensors from its transform_config"
        elif reference is not None:
            assert quantized is not None  # qrc's own model is verified: its quantized stream exists
            advance = self.progress("verify", len(quantized))
            with staging.costs.watching(loaded.model.module, staging.jobs):
                for feed, ref in zip(quantized.feeds, reference.outputs, strict=True):
                    agreement.update(ref.numpy(), loaded.call(feed).float().numpy(), *streams.tokens_of(feed))
                    advance()
        elif not samples.compared:
            self._tail(loaded, staging, samples, None, samples.verify, [], None)
        if self.ranks.world > 1:  # every rank's held-out chunks
            agreement = merged_one(self.ranks, agreement)
            share_costs(staging.costs, self.ranks)
            shared = f"its held-out samples shared by {self.ranks.world} torchrun ranks"
            measured_on = f"{measured_on}, {shared}" if samples.emitted else f"qrc's model, {shared}"
        elif self.format.verified_on:  # qrc's model stands in for the output, in the format's words
            measured_on = self.format.verified_on
        elif not samples.emitted:
            measured_on = "qrc's model (a built-in has no loader outside qrc)" if loaded.model.folder is None \
                else "qrc's model (compressed-tensors is not installed to load the emitted folder)"
        # Q501's help names the worst layers
        errors = {} if passes(agreement.value(op.metric), op.bound, op.threshold) else staging.costs.added()
        verdict = judge(op, self.plan.spans.verify, self.output, agreement, measured_on, errors, self.ranks.first)
        v.put(Buffer.VERIFY_REPORT, verdict)
        return Product(verification=verdict)  # the model goes into place after the last op

    def _verify_emitted(self, loaded: Loaded, staging: Staging, float_stream: streams.Stream, agreement: Agreement,
                        reference: Reference | None) -> None:
        """The held-out samples through the staged folder as transformers and compressed-tensors load it,
        against the float outputs: those kept before rounding (full), or the float stream's last hidden
        states through the float model's tail (its weights read again from the checkpoint: the tail may
        have been rounded in place). Under torchrun each rank runs its own held-out chunks through the folder the
        first rank staged (on another machine, through the copy the first sends: ranks.staged_everywhere)."""
        with tempfile.TemporaryDirectory(prefix="qrc-staged-") as scratch:
            out = output_writer(staging.writer)
            staged = staged_everywhere(self.ranks, out.temp if out is not None else None, Path(scratch))
            artifact = open_artifact(staged, loaded.model, self.plan.spans.emit)
            self._run_emitted(loaded, staging, artifact, float_stream, agreement, reference)

    def _run_emitted(self, loaded: Loaded, staging: Staging, artifact, float_stream: streams.Stream,
                     agreement: Agreement, kept: Reference | None) -> None:
        span, model, rounder, memory = self.plan.spans.emit, loaded.model, staging.rounder, staging.memory
        if kept is not None and kept.outputs:
            reference = iter(list(kept.outputs))
            kept.outputs.clear()  # each goes as it is compared
            model.release([p for p in model.keys if model.is_resident(p)])  # qrc's model is done with
        else:
            for hook in rounder.hooks:  # the tail's input quantizers: its float outputs are wanted here
                hook.remove()
            rounder.hooks.clear()
            model.materialize(model.outside())
            reference = streams.replay_tail(model.block_modules(), float_stream, loaded.call, lazy=True)
        disk = memory.disk if memory.offload else None

        def costs_in(scope: str | None, artifact):
            """While the emitted model runs a scope (a block, None: outside the blocks, "": everything): each
            quantized layer's own output error there."""
            return staging.costs.watching(artifact.module, jobs_in(staging.jobs, scope, model.container))
        run_emitted(span, artifact, float_stream.feeds, reference, agreement, hidden_cache(model.dtype, disk),
                    memory.devices, costs_in, self.progress)
        if memory.offload:
            model.release([p for p in model.outside() if model.is_resident(p)])
