"""The transform inside a torch run: statistics over the calibration stream for the mappings of one block
(or of the whole model in `full`), scales, the fold, a check that the float output did not change (Q422),
and the folded tensors no rounding job writes (norms, biases, float layers) written to the output."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from compiler.backends.ranks import Ranks, merged
from compiler.backends.result import refuse_changed_output
from compiler.backends.torch.layers import Job, quantize_job
from compiler.backends.torch.model import TorchModel
from compiler.backends.torch.smoothing import SmoothingStatistics, fold, norm_offset
from compiler.backends.torch.writer import OutputWriter
from compiler.ir.types import Calibration, Rounding, Transform, TransformKind, WeightQuant
from compiler.models.index import ModelIndex
from compiler.quant.smoothing import awq_scales, searched_smoothquant_scales, smoothquant_scales, transform_summary
from compiler.quant.weights import Convention, quantize_weight
from compiler.resolve.smoothing import SmoothingMapping, SourceKind


class Smoother:
    """Runs the recipe's transform on the mappings the run reaches, block by block or all at once."""

    def __init__(self, transform: Transform, calibration: Calibration, model: TorchModel, index: ModelIndex,
                 mappings: tuple[SmoothingMapping, ...], jobs: list[Job],
                 writer: OutputWriter | None,
                 ranks: Ranks = Ranks()):
        self.transform, self.calibration = transform, calibration
        self.model, self.index, self.writer = model, index, writer  # no writer on torchrun's ranks but the first
        self.ranks = ranks  # each saw its own chunks: the statistics are merged before any scale is taken
        self.mappings = list(mappings)
        self.jobs = {j.layer.name: j for j in jobs}
        weights = {**{n.name: n.weight for n in index.norms}, **{x.name: x.weight for x in index.layers}}
        # index names (checkpoint) → module names: the module computing with the tensor
        self.modules = {name: model.module_computing(weights[name]) for m in self.mappings
                        for name in (m.source, *m.targets)}
        self.gains: list[float] = []  # AWQ, a searched SmoothQuant strength: each mapping's relative error reduction
        self.alphas: list[float | None] = []  # a searched SmoothQuant strength: each mapping's (None: identity)
        self.folded = 0
        # module → what the fold multiplied its input columns by (targets) and divided its rows by (a Linear
        # source): as_folded() gives a checkpoint weight as the transform left it
        self.column_scales: dict[str, torch.Tensor] = {}
        self.row_scales: dict[str, torch.Tensor] = {}
        # `online r4`: D, which turns each down projection once its mapping has folded (and the modules turned)
        rotation = getattr(model.shards, "rotation", None)
        self.down = rotation.down if rotation is not None and rotation.after_fold else None
        self.turned: set[str] = set()

    def of_block(self, block: str | None) -> list[SmoothingMapping]:
        """The mappings of one block (None: those outside the blocks, run with the model's tail)."""
        return [m for m in self.mappings if m.block == block]

    def summary(self) -> str:
        """What the transform did, for the compile summary."""
        return transform_summary(self.transform, self.folded, self.gains, self.alphas)

    def run(self, mappings: list[SmoothingMapping], forward: Callable[[], object],
            probe: Callable[[], torch.Tensor]) -> None:
        """Statistics over the stream (`forward` runs it), scales, fold; then `probe` (the output on one chunk)
        must match what it was before the fold."""
        if not mappings:
            return
        before = probe().detach().float()
        with SmoothingStatistics(self.model.module, mappings, self.modules, self.transform,
                                 self.calibration) as stats:
            forward()
        found = merged(self.ranks, stats.stats)  # every rank's samples, in rank order
        for m in mappings:
            self._fold(m, found.get(m.source))
        self._turn_down(mappings)
        after = probe().detach().float()
        self._check(mappings, before, after)
        for m in mappings:
            self._write(m)

    def _fold(self, m: SmoothingMapping, stats) -> None:
        if stats is None or not stats.rows:
            return  # no calibration token reached it (an expert the router never chose): left as it is
        root = self.model.module
        source = root.get_submodule(self.modules[m.source])
        targets = [root.get_submodule(self.modules[x]) for x in m.targets]
        weights = [t.weight.detach().float().cpu().numpy() for t in targets if isinstance(t.weight, torch.Tensor)]
        t = self.transform
        if t.alpha_search:
            schemes = [self.jobs[x].scheme if x in self.jobs else None for x in m.targets]
            scales, alpha, gain = searched_smoothquant_scales(stats, weights, schemes, t.grid, self._rounding(m))
            self.gains.append(gain)
            self.alphas.append(alpha)
        elif t.kind is TransformKind.SMOOTHQUANT:
            scales = smoothquant_scales(stats, weights, t.alpha)
        elif t.kind.scales is not None:  # a registered plug-in's
            scales = t.kind.scales(stats, weights, t)
        else:
            specs = [self.jobs[x].scheme.weights if x in self.jobs else None for x in m.targets]
            scales, gain = awq_scales(stats, weights, specs, t.grid, t.duo_scaling, self._rounding(m))
            self.gains.append(gain)
        fold(source, m.kind, targets, scales, norm_offset(source) if m.kind is SourceKind.NORM else 0.0)
        self.folded += 1
        factor = torch.as_tensor(scales, dtype=torch.float32)
        for name in m.targets:
            module = self.modules[name]
            self.column_scales[module] = self.column_scales.get(module, torch.ones_like(factor)) * factor
        if m.kind is not SourceKind.NORM:
            module = self.modules[m.source]
            self.row_scales[module] = self.row_scales.get(module, torch.ones_like(factor)) * factor

    def _turn_down(self, mappings: list[SmoothingMapping]) -> None:
        """`online r4`: each down projection of these mappings turned by D after the fold, W·diag(s)·D, and its
        input x/s turned by D as the model runs (as the runtime will, from the folder's transform_config): the
        smoothing acts on the unrotated channels, where the outliers are, and the rotation spreads what is left
        of each token's outliers over the whole width. Every down projection is turned, folded or not: the
        runtime turns every one's input."""
        if self.down is None:
            return
        from compiler.backends.torch.rotation import turn_input

        root, down = self.model.module, self.down
        for name in {self.modules[x] for m in mappings for x in m.targets if x.endswith("mlp.down_proj")}:
            if name in self.turned:
                continue
            module = root.get_submodule(name)
            weight = module.weight
            assert isinstance(weight, torch.Tensor)
            # in place, as the fold scales: the skeleton's weights share a storage a new tensor would not free
            weight.detach().copy_(down.right(weight.detach().float()))
            turn_input(module, down)
            self.turned.add(name)

    def as_folded(self, module: str, weight: torch.Tensor) -> torch.Tensor:
        """`module`'s checkpoint weight [out, in] as the transform left it (float32 where it changed): its input
        columns times their scales, its rows divided by theirs (what its quantized weight approximates)."""
        columns, rows = self.column_scales.get(module), self.row_scales.get(module)
        if columns is None and rows is None and module not in self.turned:
            return weight
        folded = weight.float()
        if columns is not None:
            folded = folded * columns.to(folded.device).view(1, -1)
        if rows is not None:
            folded = folded / rows.to(folded.device).view(-1, 1)
        if module in self.turned and self.down is not None:
            folded = self.down.right(folded)
        return folded

    def _rounding(self, m: SmoothingMapping) -> Callable[[np.ndarray, WeightQuant], np.ndarray]:
        """How the search rounds a target: as the run will (rtn), integers in numpy, floating formats through
        compressed-tensors."""
        jobs = [self.jobs[x] for x in m.targets if x in self.jobs]
        dtype = str(self.model.dtype).removeprefix("torch.")

        def rounding(w: np.ndarray, spec: WeightQuant) -> np.ndarray:
            if not spec.qtype.is_float:
                return quantize_weight(w, spec, Rounding.RTN, 0, 1, Convention.TORCH, dtype).dequantize()
            job = next(j for j in jobs if j.scheme.weights == spec).with_rtn()
            return quantize_job(job, torch.from_numpy(w), None, self.model.dtype).dequantize()

        return rounding

    def _check(self, mappings: list[SmoothingMapping], before: torch.Tensor, after: torch.Tensor) -> None:
        """Q422: the fold must leave the float output as it was."""
        computed = next(self.model.module.get_submodule(self.modules[mappings[0].source]).parameters()).dtype
        refuse_changed_output(self.transform.span, before.cpu().numpy(), after.cpu().numpy(), computed == torch.float32,
                              [m.source for m in mappings])

    def _write(self, m: SmoothingMapping) -> None:
        """Folded tensors that no rounding job writes: the norm's weight and bias, a Linear source's bias,
        float layers' weights (by the first rank: the others write nothing)."""
        if self.writer is None:
            return
        index = self.index
        names: list[tuple[str, str]] = []  # (checkpoint tensor, module parameter)
        if m.kind is SourceKind.NORM:
            norm = next(n for n in index.norms if n.name == m.source)
            module = self.modules[m.source]
            names += [(norm.weight, f"{module}.weight")] + ([(norm.bias, f"{module}.bias")] if norm.bias else [])
        else:
            layer = index.layer(m.source)
            module = self.modules[m.source]
            bias = layer.weight.removesuffix("weight") + "bias"
            if bias in self.writer.where:
                names.append((bias, f"{module}.bias"))
        for x in (m.source, *m.targets) if m.kind is SourceKind.LINEAR else m.targets:
            if x not in self.jobs:
                names.append((index.layer(x).weight, f"{self.modules[x]}.weight"))
        for tensor, param in names:
            self.writer.put_float(tensor, self.model.module.get_parameter(param).detach().cpu())
