"""What torchrun's ranks merge so that each acts on the statistics of every sample (ranks.py): each rank
calibrates its own chunks, then before anything is rounded the ranks' statistics are gathered onto every
rank and merged in rank order, so every rank holds the same figures whatever order the messages came in.

- input observers (min/max, the histograms of percentile, entropy and mse) merge exactly: the same state as
  one observer that saw every chunk (quant/observers.py), hence the same scales and bytes as one process;
- GPTQ Hessians are summed in float64 over the ranks' float32 partial sums, rows counted exactly, onto the
  ranks that round with them only: the same Hessian for a given rank count (one process sums every row in
  float32);
- KV-cache maxima and verification sums (Agreement: ranks.merged_one; LayerCosts) are maxima and sums.

The rounding of a block is shared too: each layer is assigned to a rank by its cost (the largest first, to
the least loaded rank), rounded there, and the rounded weights are handed to every rank."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from compiler.backends.ranks import Ranks, all_gathered, summed_on
from compiler.backends.torch.attribution import LayerCosts
from compiler.backends.torch.kv_cache import KvCacheQuantizer
from compiler.backends.torch.layers import Hessian, Job, Statistics


def share_statistics(stats: Statistics, ranks: Ranks) -> None:
    """Every rank's observers of the hooked layers, merged in rank order into `stats` on every rank, and which
    layer leads which (q/k/v share one input: the union of what the ranks saw). The Hessians stay each rank's
    partial sums, their shapes and row counts noted in `stats.pending`, until share_hessians sends each to the
    ranks that round with it."""
    if ranks.world == 1 or stats.shared:
        return
    stats.shared = True
    mine = (dict(stats.leader), {k: (tuple(h.sum.shape), h.rows) for k, h in stats.hessians.items()},
            stats.observers)
    observers: dict[str, object] = {}
    for leaders, hessians, observed in all_gathered(ranks, mine):
        stats.leader.update(leaders)
        for key, (shape, seen) in hessians.items():
            stats.pending[key] = (shape, stats.pending.get(key, (shape, 0))[1] + seen)
        for key, observer in observed.items():
            if key in observers:
                observers[key].merge(observer)  # type: ignore[attr-defined]  # every observer merges
            else:
                observers[key] = observer  # unpickled from the gather: a copy of its own
    stats.observers = observers


def share_hessians(stats: Statistics, ranks: Ranks, rounding: Sequence[Job], owner: dict[str, int]) -> None:
    """The Hessians that `rounding`'s GPTQ layers read, summed over the ranks' float32 partial sums in float64,
    in rank order, onto the ranks that own those layers (`owner`), and dropped elsewhere: each rank adds up
    only what it rounds with. A Hessian that layers outside `rounding` read too (rounded by a later call)
    goes to every rank. Every rank calls this with the same jobs (collectives in the same order)."""
    if ranks.world == 1:
        return
    readers: dict[str, set[str]] = {}
    for job in stats.jobs:
        if job.gptq and job.module in stats.leader:
            readers.setdefault(stats.leader[job.module], set()).add(job.layer.name)
    wanted: dict[str, set[int]] = {}
    for job in rounding:
        key = stats.leader.get(job.module)
        if job.gptq and key in stats.pending:
            wanted.setdefault(key, set()).add(owner[job.layer.name])
    named = {job.layer.name for job in rounding}
    for key in sorted(wanted):  # the same order on every rank
        everywhere = not readers.get(key, set()) <= named
        _merge_hessian(stats, ranks, key, frozenset(range(ranks.world)) if everywhere else frozenset(wanted[key]))


def _merge_hessian(stats: Statistics, ranks: Ranks, key: str, destinations: frozenset[int]) -> None:
    shape, rows = stats.pending.pop(key)
    own = stats.hessians.pop(key, None)
    device = own.sum.device if own is not None else torch.device("cpu")
    partial = own.sum if own is not None else torch.zeros(shape, dtype=torch.float32)
    del own
    total = summed_on(ranks, partial, destinations)  # float32 sums, added in float64 in rank order
    del partial
    if total is not None:  # else another rank rounds with it
        stats.hessians[key] = Hessian(total.to(device), rows)


def share_kv(kv: KvCacheQuantizer, ranks: Ranks) -> None:
    """The KV-cache maxima each rank observed, merged (the largest) on every rank, before any scale is taken."""
    if ranks.world == 1 or not kv.state:
        return
    mine = {name: (s.k_absmax, s.v_absmax) for name, s in kv.state.items() if s.scales is None}
    for observed in all_gathered(ranks, mine):
        for name, (k, v) in observed.items():
            state = kv.state[name]
            state.k_absmax, state.v_absmax = max(state.k_absmax, k), max(state.v_absmax, v)


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


def share_sums(ranks: Ranks, sums: dict[str, torch.Tensor], leader: dict[str, str],
               like: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The mixed-precision search's sums (Gram matrices by leading layer, gradients by layer) over every rank's
    scoring chunks: `leader` (layer → the key its sum is under) and the shapes are the union of the ranks'
    (a rank with no chunk has none; `like` gives the shape of a sum no rank made), each sum added in rank order,
    in float64 for Gram matrices (float32 gradients stay float32). The result is the same on every rank."""
    if ranks.world == 1:
        return sums
    shapes: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
    for leaders, described in all_gathered(ranks, (dict(leader), {k: (tuple(v.shape), v.dtype) for k, v in sums.items()})):
        leader.update(leaders)
        shapes.update(described)
    for key, tensor in (like or {}).items():
        shapes.setdefault(key, (tuple(tensor.shape), torch.float32))
    merged = {}
    for key in sorted(shapes):  # the same order on every rank
        shape, dtype = shapes[key]
        own = sums.pop(key, None)
        total = summed_on(ranks, own if own is not None else torch.zeros(shape, dtype=dtype))
        assert total is not None  # every rank gets the sum
        merged[key] = total.to(dtype)
    return merged


def owners(jobs: Sequence[Job], world: int) -> dict[str, int]:
    """The rank that rounds each job: the costliest first, each to the least loaded rank (ties to the lower
    rank), then single moves and swaps off the most loaded rank while they lower it, so a block's rounding
    takes about 1/world of its time (on the bench Llama, a block's 7 layers split 2.56/2.45 s by _cost where
    the first pass gives 2.65/2.36)."""
    owner: dict[str, int] = {}
    load = [0] * world
    for _, job in sorted(enumerate(jobs), key=lambda item: (-_cost(item[1]), item[0])):
        rank = min(range(world), key=lambda r: (load[r], r))
        owner[job.layer.name] = rank
        load[rank] += _cost(job)
    costs = {job.layer.name: _cost(job) for job in jobs}
    while _improved(owner, costs, load):
        pass
    return owner


def _improved(owner: dict[str, int], costs: dict[str, int], load: list[int]) -> bool:
    """One move (a job of the most loaded rank to another) or swap (with a cheaper job of another rank) that
    lowers the larger of the two ranks' loads, applied; False when none does."""
    top = max(range(len(load)), key=lambda r: (load[r], -r))
    for name in sorted((n for n, r in owner.items() if r == top), key=lambda n: (-costs[n], n)):
        for other in range(len(load)):
            if other == top:
                continue
            swaps = [None, *sorted((n for n, r in owner.items() if r == other and costs[n] < costs[name]),
                                   key=lambda n: (-costs[n], n))]
            for partner in swaps:
                shift = costs[name] - (costs[partner] if partner is not None else 0)
                if max(load[top] - shift, load[other] + shift) < load[top]:
                    owner[name], load[top], load[other] = other, load[top] - shift, load[other] + shift
                    if partner is not None:
                        owner[partner] = top
                    return True
    return False


# GPTQ's time per layer, fitted to cProfile runs of both ranks on the 168M bench Llama (bench/ranks_scaling.py,
# 2 ranks of one thread, two different splits of a block's layers): about 0.18 s per million weights (the
# column loop's updates and the group-scale search), 0.19 ms per input column (the rank-one update and the
# Python around it), 0.035 s per 10⁹ of in³ (factorising H) and 0.03 s per layer. In units of one weight:
# 1,040 per input column, in³/5,200 and 167,000 per layer. (Weights and in³ alone made down_proj, with its
# 2,816 input columns, too cheap: the rank rounding it took 1.2× the other's time.)
_COLUMN_STEP_WEIGHTS = 1_040
_FACTORISATION_PER_WEIGHT = 5_200
_LAYER_WEIGHTS = 167_000


def _cost(job: Job) -> int:
    inputs, outputs = max(job.layer.in_features, 1), max(job.layer.out_features, 1)
    if not job.gptq:
        return outputs * inputs
    return (outputs * inputs + inputs * _COLUMN_STEP_WEIGHTS + inputs ** 3 // _FACTORISATION_PER_WEIGHT
            + _LAYER_WEIGHTS)
