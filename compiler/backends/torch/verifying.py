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
from compiler.backends.torch.sharing import share_costs
from compiler.backends.torch.writer import output_writer
from compiler.plan import ops


class Verifying(BlockWise):
    """Verification, after the blocks (block-wise) or on the resident model (full)."""

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
        elif self.format.verified_on:  # qrc's model stands in for the output, in the format's words
            measured_on = self.format.verified_on
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
            out = output_writer(self.writer)
            staged = staged_everywhere(self.ranks, out.temp if out is not None else None, Path(scratch))
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
