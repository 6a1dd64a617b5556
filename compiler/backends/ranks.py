"""The ranks of a compile that torchrun (torch.distributed's launcher) started: which one this process is and how
many there are. Outside torchrun a compile is rank 0 of 1 and nothing here imports torch.

So far the data-free path is shared: each rank rounds its share of the weights (by index) and the first rank
writes the output. A plan that runs the model is refused under torchrun (Q431) rather than run N times over."""

from __future__ import annotations

import datetime
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")
TIMEOUT_S = 600  # a rank that stops answering ends every rank's wait after this long (QRC_RANK_TIMEOUT overrides)


@dataclass(frozen=True, slots=True)
class Ranks:
    """This process's rank among `world` processes."""

    rank: int = 0
    world: int = 1

    @property
    def first(self) -> bool:
        """The rank that writes the output and prints the summary."""
        return self.rank == 0

    def owns(self, index: int) -> bool:
        """Whether item `index` of a sequence the ranks share is this rank's (deterministic: by index)."""
        return index % self.world == self.rank


def from_environment() -> Ranks:
    """The ranks torchrun describes in the environment (RANK, WORLD_SIZE); one rank without it."""
    try:
        rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return Ranks()
    return Ranks(rank, world) if 0 <= rank < world else Ranks()


def current() -> Ranks:
    """The ranks of the process group this process joined (one rank when it joined none)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return Ranks(dist.get_rank(), dist.get_world_size())
    return Ranks()


@contextmanager
def joined(ranks: Ranks) -> Iterator[None]:
    """Join torchrun's process group for the compile (gloo on CPU, nccl with GPUs), with a timeout so that a
    rank that died ends the others' waits; nothing to join for one rank."""
    if ranks.world == 1:
        yield
        return
    import torch
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=float(os.environ.get("QRC_RANK_TIMEOUT", TIMEOUT_S)))
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", timeout=timeout)
    try:
        yield
    finally:
        dist.destroy_process_group()


def gather_to_first(ranks: Ranks, value: T) -> list[T]:
    """Every rank's `value`, in rank order, on the first rank (an empty list on the others)."""
    if ranks.world == 1:
        return [value]
    import torch.distributed as dist

    found: list[Any] | None = [None] * ranks.world if ranks.first else None
    dist.gather_object(value, found, dst=0)
    return list(found) if found is not None else []
