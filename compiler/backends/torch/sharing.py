"""What torchrun's ranks merge so that each acts on the statistics of every sample (ranks.py): each rank
calibrates its own chunks, then before anything is rounded the ranks' statistics are gathered onto every
rank and merged in rank order, so every rank holds the same figures whatever order the messages came in.

- input observers (min/max, the histograms of percentile, entropy and mse) merge exactly: the same state as
  one observer that saw every chunk (quant/observers.py), hence the same scales and bytes as one process;
- GPTQ Hessians are summed in float64 over the ranks' float32 partial sums, rows counted exactly: the same
  Hessian for a given rank count (one process sums every row in float32);
- KV-cache maxima and verification sums (Agreement, LayerCosts) are maxima and sums.

The rounding of a block is shared too: each layer is assigned to a rank by its cost (the largest first, to
the least loaded rank), rounded there, and the rounded weights are handed to every rank."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import fields

import torch

from compiler.backends.agreement import Agreement
from compiler.backends.ranks import Ranks, all_gathered
from compiler.backends.torch.attribution import LayerCosts
from compiler.backends.torch.kv_cache import KvCacheQuantizer
from compiler.backends.torch.layers import Hessian, Job, Statistics


def share_statistics(stats: Statistics, ranks: Ranks) -> None:
    """Every rank's Hessians and observers of the hooked layers, merged in rank order into `stats` on every
    rank; which layer leads which (q/k/v share one input) is the union of what the ranks saw."""
    if ranks.world == 1 or stats.shared:
        return
    stats.shared = True
    mine = (dict(stats.leader), {k: (h.sum.cpu(), h.rows) for k, h in stats.hessians.items()}, stats.observers)
    sums: dict[str, tuple[torch.Tensor, int]] = {}
    observers: dict[str, object] = {}
    devices = {k: h.sum.device for k, h in stats.hessians.items()}
    for leaders, hessians, observed in all_gathered(ranks, mine):
        stats.leader.update(leaders)
        for key, (partial, rows) in hessians.items():
            total, seen = sums.get(key, (torch.zeros(partial.shape, dtype=torch.float64), 0))
            sums[key] = (total.add_(partial.double()), seen + rows)
        for key, observer in observed.items():
            if key in observers:
                observers[key].merge(observer)  # type: ignore[attr-defined]  # every observer merges
            else:
                observers[key] = copy.deepcopy(observer)
    stats.hessians = {k: Hessian(total.to(devices.get(k, "cpu")), rows) for k, (total, rows) in sums.items()}
    stats.observers = observers


def share_kv(kv: KvCacheQuantizer, ranks: Ranks) -> None:
    """The KV-cache maxima each rank observed, merged (the largest) on every rank, before any scale is taken."""
    if ranks.world == 1 or not kv.state:
        return
    mine = {name: (s.k_absmax, s.v_absmax) for name, s in kv.state.items() if s.scales is None}
    for observed in all_gathered(ranks, mine):
        for name, (k, v) in observed.items():
            state = kv.state[name]
            state.k_absmax, state.v_absmax = max(state.k_absmax, k), max(state.v_absmax, v)


def share_agreement(agreement: Agreement, ranks: Ranks) -> Agreement:
    """The comparison over every rank's held-out chunks: each running sum added up, in rank order."""
    if ranks.world == 1:
        return agreement
    merged = Agreement()
    for part in all_gathered(ranks, agreement):
        for f in fields(Agreement):
            setattr(merged, f.name, getattr(merged, f.name) + getattr(part, f.name))
    return merged


def share_costs(costs: LayerCosts, ranks: Ranks) -> None:
    """Each layer's output error over every rank's held-out chunks (sums, in rank order)."""
    if ranks.world == 1:
        return
    noise: dict[str, float] = {}
    signal: dict[str, float] = {}
    for part_noise, part_signal in all_gathered(ranks, (costs.noise, costs.signal)):
        for name, value in part_noise.items():
            noise[name] = noise.get(name, 0.0) + value
        for name, value in part_signal.items():
            signal[name] = signal.get(name, 0.0) + value
    costs.noise, costs.signal = noise, signal


def owners(jobs: Sequence[Job], world: int) -> dict[str, int]:
    """The rank that rounds each job: the costliest first, each to the least loaded rank (ties to the lower
    rank), so a block's rounding takes about 1/world of its time. GPTQ costs about out·in² + in³ (the
    column loop and the factorisation), the other roundings out·in."""
    load = [0] * world
    owner: dict[str, int] = {}
    ranked = sorted(enumerate(jobs), key=lambda item: (-_cost(item[1]), item[0]))
    for _, job in ranked:
        rank = min(range(world), key=lambda r: (load[r], r))
        owner[job.layer.name] = rank
        load[rank] += _cost(job)
    return owner


def _cost(job: Job) -> int:
    inputs, outputs = max(job.layer.in_features, 1), max(job.layer.out_features, 1)
    return outputs * inputs * inputs + inputs ** 3 if job.gptq else outputs * inputs
