"""The ranks of a compile that torchrun (torch.distributed's launcher) started: which one this process is and how
many there are. Outside torchrun a compile is rank 0 of 1 and nothing here imports torch.

On the torch backend a compile is shared: the calibration and held-out samples are split by chunk index, every
statistic is merged exactly on every rank before anything is rounded (torch/sharing.py), the layers of a block
are rounded by the rank each is assigned to and handed to all, and the first rank writes the output. On the
ONNX backend the calibration chunks are split the same way and the observers and Hessians merged; the weights
are rounded N at a time, one per rank, and written by the first rank. Both verify the staged output on every
rank, a copy of it sent to ranks on other machines. What cannot be shared yet is refused (Q431) rather than run
N times over."""

from __future__ import annotations

import datetime
import os
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from compiler.diagnostics import StageError, error
from compiler.env_numbers import env_index, env_number

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


class Owned:
    """The chunks of `batches` (anything iterable in chunks, with a length) that rank `ranks.rank` runs: chunk i
    when i mod N is its rank, in order."""

    def __init__(self, batches, ranks: Ranks):
        self.batches, self.ranks = batches, ranks

    def __iter__(self):
        return (chunk for i, chunk in enumerate(self.batches) if self.ranks.owns(i))

    def __len__(self) -> int:
        return len(range(self.ranks.rank, len(self.batches), self.ranks.world))


def from_environment() -> Ranks:
    """The ranks torchrun describes in the environment (RANK, WORLD_SIZE); one rank without it. Junk or a rank
    outside the count is Q443 (StageError), not a silent single run."""
    rank, world = _index_and_count("RANK", "WORLD_SIZE")
    if world < 1 or rank >= world:
        raise StageError(error("Q443", f"environment variables RANK={rank} and WORLD_SIZE={world} name no rank",
                               None, "out of range", help="RANK runs from 0 to WORLD_SIZE - 1 (torchrun sets both); "
                               "unset both for one process"))
    return Ranks(rank, world)


def _index_and_count(index: str, count: str) -> tuple[int, int]:
    """A process's index and the count, from torchrun's environment variables of those names (0 of 1 where
    they are unset; Q443 where they are not whole numbers)."""
    return env_index(index, 0), env_index(count, 1)


def current() -> Ranks:
    """The ranks of the process group this process joined (one rank when it joined none)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return Ranks(dist.get_rank(), dist.get_world_size())
    return Ranks()


@dataclass(frozen=True, slots=True)
class Peer:
    """Where a rank runs: what a rank that outlives it names when it stops."""

    rank: int
    host: str
    pid: int

    def gone(self) -> bool:
        """Whether this rank's process has ended (known only for processes on this machine: a dead child
        stays a zombie until torchrun reaps it, so its state is read, not just its existence)."""
        if self.host != socket.gethostname() or self.pid == os.getpid():
            return False
        try:
            state = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return True
        return state in ("Z", "X")


@contextmanager
def joined(ranks: Ranks) -> Iterator[list[Peer]]:
    """Join torchrun's process group for the compile (nccl where each local rank has a GPU, else gloo), with a timeout so that a
    rank that died ends the others' waits; yields where every rank runs (nothing to join for one rank)."""
    if ranks.world == 1:
        yield []
        return
    import torch
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=env_number("QRC_RANK_TIMEOUT", TIMEOUT_S, low=1, high=7 * 86400))
    local_rank, local_world = _index_and_count("LOCAL_RANK", "LOCAL_WORLD_SIZE")
    backend = group_backend(torch.cuda.device_count() if torch.cuda.is_available() else 0, local_world)
    if backend == "nccl":  # each rank moves its collectives through its own GPU (nccl refuses two ranks on one)
        torch.cuda.set_device(local_rank)
    try:
        with _killed_by_sigterm():
            dist.init_process_group(backend, timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - a peer that never came, no MASTER_ADDR, a refused port: torch's many types
        said = (str(exc).strip().splitlines() or [""])[0][:200]
        raise StageError(error("Q444", f"rank {ranks.rank} of {ranks.world} could not join the others "
                               f"({type(exc).__name__}: {said})", None, "no process group",
                               help="start every rank with torchrun (it sets MASTER_ADDR, MASTER_PORT, RANK and "
                               "WORLD_SIZE) and check that each one started; QRC_RANK_TIMEOUT sets how long a rank "
                               "waits for the others; nothing was written")) from None
    try:
        yield all_gathered(ranks, Peer(ranks.rank, socket.gethostname(), os.getpid()))
    finally:
        dist.destroy_process_group()


@contextmanager
def _killed_by_sigterm() -> Iterator[None]:
    """SIGTERM ends the process at once (its default action) while the ranks join. The join waits in torch's C++
    rendezvous, where qrc's handler (SIGTERM unwinds as Ctrl-C) would run only once it returned: a rank whose
    peer had died before joining sat there until torchrun's SIGKILL, 30 s after its SIGTERM. Nothing is written
    before the ranks join (the destination's lock is taken after), so there is nothing to clean up."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread sets handlers
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def group_backend(gpus: int, local_world: int) -> str:
    """The process group's backend: nccl where every rank on this machine has a GPU of its own (`gpus` visible
    ones for `local_world` ranks), else gloo. nccl cannot put two ranks on one GPU, and under ranks qrc computes
    on the CPU (multi_gpu is refused, Q431), so a machine with fewer GPUs than ranks loses nothing with gloo."""
    return "nccl" if 0 < local_world <= gpus else "gloo"


def lost_ranks_message(ranks: Ranks, peers: list[Peer]) -> str:
    """What a rank says when the compile's other ranks stopped answering: which ones ended, where known."""
    gone = [p for p in peers if p.gone()]
    if gone:
        named = ", ".join(f"rank {p.rank} (process {p.pid})" for p in gone)
        return f"{named} of the compile's {ranks.world} ended, so rank {ranks.rank} stopped too"
    return (f"rank {ranks.rank} of {ranks.world} stopped: another rank ended or stopped answering (torchrun's "
            "report names it)")


def all_gathered(ranks: Ranks, value: T) -> list[T]:
    """Every rank's `value`, in rank order, on every rank (what a merge in a fixed order needs: the same
    result on each rank, whatever order the messages arrive in)."""
    if ranks.world == 1:
        return [value]
    import torch.distributed as dist

    found: list[Any] = [None] * ranks.world
    dist.all_gather_object(found, value)
    return found


def machine() -> tuple[str, str]:
    """This process's machine, as far as files go: its host and torchrun's node (GROUP_RANK). Two launchers on
    one host (how a test runs two nodes) count as two machines, which share nothing but the process group."""
    return socket.gethostname(), os.environ.get("GROUP_RANK", "0")


FILE_PIECE = 64 << 20  # bytes of a file in flight at once when the first rank sends it to other machines


def staged_everywhere(ranks: Ranks, folder: Path | None, scratch: Path) -> Path:
    """The first rank's staged `folder` (every file under it) where this rank can open it: the folder
    itself on the first rank's machine, else a copy under `scratch`, sent over the process group a piece at a
    time (every rank takes part; only those on other machines write). `folder` is the first rank's; the other
    ranks pass None."""
    listing = [(p.relative_to(folder).as_posix(), p.stat().st_size) for p in sorted(folder.rglob("*"))
               if p.is_file()] if folder else None
    found = all_gathered(ranks, (folder, listing, machine()))
    first_folder, files, first_machine = found[0]
    assert first_folder is not None and files is not None, "the first rank names its staged folder"
    elsewhere = [where != first_machine for _, _, where in found]
    if not any(elsewhere):
        return first_folder
    import torch
    import torch.distributed as dist

    mine = scratch / first_folder.name
    for name, size in files:
        if elsewhere[ranks.rank]:
            (mine / name).parent.mkdir(parents=True, exist_ok=True)
        with ExitStack() as stack:
            source = stack.enter_context(open(first_folder / name, "rb")) if ranks.first else None
            target = stack.enter_context(open(mine / name, "wb")) if elsewhere[ranks.rank] else None
            for start in range(0, size, FILE_PIECE):
                length = min(FILE_PIECE, size - start)
                piece = torch.frombuffer(bytearray(source.read(length)), dtype=torch.uint8) if source \
                    else torch.empty(length, dtype=torch.uint8)
                piece = _on_group_device(piece)
                dist.broadcast(piece, src=0)
                if target is not None:
                    target.write(piece.cpu().numpy().tobytes())
    return mine if elsewhere[ranks.rank] else first_folder


def each_machine_first(ranks: Ranks, work: Callable[[], T]) -> T:
    """`work` done by the first rank of each machine (torchrun's LOCAL_RANK 0) while its other ranks wait, then
    by those others: what a cache per machine needs (one writer each; the rest find what it wrote). A
    StageError that a first rank raised stops every rank with its diagnostic, so none waits for it."""
    if ranks.world == 1:
        return work()
    writes = _index_and_count("LOCAL_RANK", "LOCAL_WORLD_SIZE")[0] == 0
    done, failure = None, None
    if writes:
        try:
            done = work()
        except StageError as exc:
            failure = exc.diagnostic
    failures = [found for found in all_gathered(ranks, failure) if found is not None]
    if failures:
        raise StageError(failures[0])
    return done if writes else work()  # type: ignore[return-value]  # the first rank's work returned


def _on_group_device(tensor):
    """`tensor` where the process group moves it: a GPU under nccl, else the CPU."""
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    return tensor.detach().to(device).contiguous()


def gathered_tensors(ranks: Ranks, tensor):
    """Every rank's `tensor` (the same shape and dtype on each), in rank order, on the CPU: moved through the
    device the process group uses (a GPU under nccl)."""
    import torch
    import torch.distributed as dist

    local = _on_group_device(tensor)
    parts = [torch.empty_like(local) for _ in range(ranks.world)]
    dist.all_gather(parts, local)
    return [part.cpu() for part in parts]


def summed_on(ranks: Ranks, tensor, destinations: frozenset[int] | None = None):
    """Every rank's `tensor` (the same shape and dtype on each) added up in float64 in rank order, on the CPU of
    each rank in `destinations` (all when None); None on the others. One destination is a gather (the others
    only send), several an all_gather. The same sum on every rank that gets it, whatever order messages came in."""
    import torch
    import torch.distributed as dist

    destinations = frozenset(range(ranks.world)) if destinations is None else destinations
    if len(destinations) == 1:
        (destination,) = destinations
        local = _on_group_device(tensor)
        receiving = ranks.rank == destination
        gathered = [torch.empty_like(local) for _ in range(ranks.world)] if receiving else None
        dist.gather(local, gathered, dst=destination)
        parts = [part.cpu() for part in gathered] if gathered is not None else None
    else:
        parts = gathered_tensors(ranks, tensor)
    if ranks.rank not in destinations or parts is None:
        return None
    total = torch.zeros(tuple(tensor.shape), dtype=torch.float64)
    for part in parts:
        total.add_(part)
    return total


def merged(ranks: Ranks, mine: dict[Any, Any]) -> dict[Any, Any]:
    """Every rank's mergeable states by key (observers: `.merge(other)` adds another's exactly), merged in rank
    order on every rank; one rank's are returned as they are."""
    if ranks.world == 1:
        return mine
    out: dict[Any, Any] = {}
    for theirs in all_gathered(ranks, mine):  # fresh copies, unpickled: merging into them touches nothing else
        for key, state in theirs.items():
            if key in out:
                out[key].merge(state)
            else:
                out[key] = state
    return out


def merged_one(ranks: Ranks, state: T) -> T:
    """One mergeable state (`.merge(other)` adds another's) merged over every rank in rank order, on every rank;
    one rank's is returned as it is."""
    return merged(ranks, {"": state})[""]


def gather_to_first(ranks: Ranks, value: T) -> list[T]:
    """Every rank's `value`, in rank order, on the first rank (an empty list on the others)."""
    if ranks.world == 1:
        return [value]
    import torch.distributed as dist

    found: list[Any] | None = [None] * ranks.world if ranks.first else None
    dist.gather_object(value, found, dst=0)
    return list(found) if found is not None else []
