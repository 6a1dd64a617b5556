"""Scores for the mixed-precision search on PyTorch (compiler/backends/sensitivity.py says what they mean).

kld is the first-order estimate of Olive's `kld_gradient`: every searched weight at its unit's cheapest
choice, gradients of KL(float ‖ quantized) over the scoring samples, then a unit's loss under a choice
is Σ g ⊙ (Q_choice(W) − Q_cheapest(W)) over its members: one forward and backward pass per chunk,
whatever the number of units. mse and kld hold the float model resident while scoring; its parameters
go back to the meta device afterwards.

Under torchrun each rank runs its share of the scoring chunks (chunk i on rank i mod N); the Gram matrices and
the gradients are summed over the ranks in rank order (torch/sharing.py), so every rank scores alike.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import numpy as np
import torch

from compiler.backends.ranks import Owned, Ranks
from compiler.backends.sensitivity import fake_quantize, scoring_batches
from compiler.backends.torch.float_formats import quantize_scheme
from compiler.backends.torch.sharing import share_sums
from compiler.ir.types import Scheme
from compiler.models.exports import files_hash
from compiler.models.index import Layer, ModelIndex
from compiler.plan.ops import ScoreSensitivity
from compiler.quant.weights import Convention
from compiler.resolve.mixed import Unit, cheapest


class TorchScorer:
    """What the mixed-precision search reads from a torch model: weights, input Gram matrices, estimated KL."""
    convention = Convention.TORCH

    def rounded(self, w: np.ndarray, scheme: Scheme) -> np.ndarray:
        """The weight as the scheme rounds it, back in float: integer schemes by qrc's rounding, the floating
        formats by compressed-tensors' (float_formats.py; NVFP4's global scale from the weight alone)."""
        if not scheme.quantized_weights.qtype.is_float:
            return fake_quantize(w, scheme, self.convention)
        return quantize_scheme(torch.from_numpy(w), scheme, torch.float32).dequantize()

    def __init__(self, op: ScoreSensitivity, index: ModelIndex, model, feed, ranks: Ranks = Ranks()):
        """`index` has the model's inputs (to make data); `feed` turns a numpy chunk into torch tensors; under
        torchrun `ranks` says which chunks are this rank's."""
        self.index, self.model, self.ranks = index, model, ranks
        batches = scoring_batches(op, index)
        self.chunks = len(batches)  # every rank's: the KL's mean is over all of them
        self.feeds = [feed(f) for f in Owned(batches, ranks)]

    def digest(self) -> str:
        """A content hash of the checkpoint's files (the score cache key)."""
        return files_hash(sorted({e.file for e in self.model.shards.entries.values()}))

    def weight(self, layer: Layer) -> np.ndarray:
        """The float weight of `layer` as [out, in] float32."""
        w = self.model.shards.read(layer.weight).float().numpy()
        return w.reshape(w.shape[0], -1)

    def _resident(self):
        """The float model in memory for scoring; a function that puts it back the way it was."""
        missing = [p for p in self.model.keys if not self.model.is_resident(p)]
        self.model.materialize(missing)
        return lambda: self.model.release(missing)

    def _module(self, layer: Layer) -> torch.nn.Linear:
        module = self.model.module.get_submodule(self.model.module_computing(layer.weight))
        assert isinstance(module, torch.nn.Linear)  # the torch backend quantizes Linear layers only (Q411)
        return module

    # ---- mse: Σ xᵀx of each layer's input ------------------------------------------------------------
    def grams(self, layers: Sequence[Layer], progress) -> dict[str, np.ndarray]:
        """One sum per distinct input tensor: layers fed the same tensor in a forward pass (q/k/v,
        gate/up) share it, recognised by weak reference as the calibration hooks do."""
        restore = self._resident()
        sums: dict[str, torch.Tensor] = {}
        leader: dict[str, str] = {}
        seen: dict[int, tuple[weakref.ref, str]] = {}

        def hook_for(name):
            def hook(module, args):
                x = args[0]
                found = seen.get(id(x))
                if found is not None and found[0]() is x:
                    leader[name] = found[1]
                    return
                seen[id(x)] = (weakref.ref(x), name)
                leader[name] = name
                rows = x.detach().reshape(-1, x.shape[-1]).double()
                rows = rows[torch.isfinite(rows).all(dim=1)]
                total = sums.setdefault(name, torch.zeros(rows.shape[1], rows.shape[1], dtype=torch.float64))
                total.addmm_(rows.T, rows)
            return hook

        hooks = [self._module(layer).register_forward_pre_hook(hook_for(layer.name)) for layer in layers]
        try:
            advance = progress("score data", len(self.feeds))
            for feed in self.feeds:
                seen.clear()
                with torch.no_grad():
                    self.model.forward(feed)
                advance()
        finally:
            for hook in hooks:
                hook.remove()
            restore()
        sums = share_sums(self.ranks, sums, leader)
        return {layer.name: sums[leader[layer.name]].numpy() for layer in layers}

    # ---- kld: first-order estimate ------------------------------------------------------------------
    def kld(self, units: Sequence[Unit], schemes: Sequence[Scheme], progress) -> dict[str, list[float]]:
        """Each unit's first-order KL estimate under each scheme (Olive's kld_gradient)."""
        restore = self._resident()
        layers = {n: self.index.layer(n) for u in units for n in u.members}
        params = {n: self._module(layer).weight for n, layer in layers.items()}
        floats = {n: p.data for n, p in params.items()}
        fakes = {n: [torch.from_numpy(self.rounded(floats[n].numpy(), s)).reshape(floats[n].shape)
                     for s in schemes] for n in layers}
        low = {n: fakes[n][cheapest(u)] for u in units for n in u.members}
        for p in params.values():
            p.requires_grad_(True)
            p.grad = None
        try:
            advance = progress("score kld", len(self.feeds))
            for feed in self.feeds:
                for n, p in params.items():
                    p.data = floats[n]
                with torch.no_grad():
                    teacher = torch.log_softmax(self.model.forward(feed).float(), dim=-1)
                for n, p in params.items():
                    p.data = low[n]
                student = torch.log_softmax(self.model.forward(feed).float(), dim=-1)
                per_position = (teacher.exp() * (teacher - student)).sum(-1)
                (per_position.mean() / self.chunks).backward()
                advance()
            grads = {n: p.grad.detach().clone() for n, p in params.items() if p.grad is not None}
            grads = share_sums(self.ranks, grads, {n: n for n in params}, like={n: floats[n] for n in params})
        finally:
            for n, p in params.items():
                p.data = floats[n]
                p.grad = None
                p.requires_grad_(False)
            restore()
        return {u.name: [float(sum((grads[n] * (fakes[n][k] - low[n])).sum() for n in u.members))
                         for k in range(len(schemes))] for u in units}
