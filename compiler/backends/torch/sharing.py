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

from collections.abc import Sequence
from dataclasses import fields

import torch

from compiler.backends.agreement import Agreement
from compiler.backends.ranks import Ranks, all_gathered, gathered_tensors
from compiler.backends.torch.attribution import LayerCosts
from compiler.backends.torch.kv_cache import KvCacheQuantizer
from compiler.backends.torch.layers import Hessian, Job, Statistics


def share_statistics(stats: Statistics, ranks: Ranks) -> None:
    """Every rank's Hessians and observers of the hooked layers, merged in rank order into `stats` on every
    rank; which layer leads which (q/k/v share one input) is the union of what the ranks saw. The small state
    travels as objects, the Hessians as tensors (no pickling of K×K matrices)."""
    if ranks.world == 1 or stats.shared:
        return
    stats.shared = True
    mine = (dict(stats.leader), {k: (tuple(h.sum.shape), h.rows) for k, h in stats.hessians.items()},
            stats.observers)
    shapes: dict[str, tuple[int, ...]] = {}
    rows: dict[str, int] = {}
    observers: dict[str, object] = {}
    for leaders, hessians, observed in all_gathered(ranks, mine):
        stats.leader.update(leaders)
        for key, (shape, seen) in hessians.items():
            shapes[key], rows[key] = shape, rows.get(key, 0) + seen
        for key, observer in observed.items():
            if key in observers:
                observers[key].merge(observer)  # type: ignore[attr-defined]  # every observer merges
            else:
                observers[key] = observer  # unpickled from the gather: a copy of its own
    merged = {}
    for key in sorted(shapes):  # the same order on every rank
        own = stats.hessians.get(key)
        device = own.sum.device if own is not None else torch.device("cpu")
        partial = own.sum if own is not None else torch.zeros(shapes[key], dtype=torch.float32)
        stats.hessians.pop(key, None)
        total = torch.zeros(shapes[key], dtype=torch.float64)
        for part in gathered_tensors(ranks, partial):  # float32 sums, added in float64 in rank order
            total.add_(part.double())
            del part
        del partial
        merged[key] = Hessian(total.to(device), rows[key])
    stats.hessians = merged
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
    rank), so a block's rounding takes about 1/world of its time."""
    load = [0] * world
    owner: dict[str, int] = {}
    ranked = sorted(enumerate(jobs), key=lambda item: (-_cost(item[1]), item[0]))
    for _, job in ranked:
        rank = min(range(world), key=lambda r: (load[r], r))
        owner[job.layer.name] = rank
        load[rank] += _cost(job)
    return owner


# GPTQ's time, profiled on the 168M bench Llama (bench/ranks_scaling.py, one thread): the column loop and the
# group-scale search go with the weight's size (about 0.23 s per million weights), the factorisation of H with
# in³ (about 0.033 s per 10⁹): one unit of in³ costs what 1/7,000 of a weight does
_FACTORISATION_PER_WEIGHT = 7_000


def _cost(job: Job) -> int:
    inputs, outputs = max(job.layer.in_features, 1), max(job.layer.out_features, 1)
    return outputs * inputs + (inputs ** 3 // _FACTORISATION_PER_WEIGHT if job.gptq else 0)
