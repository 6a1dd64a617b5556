"""Work on one weight split over the machine's cores. numpy releases the GIL inside its array loops, so
slices of a weight rounded on threads run side by side; a thread pool needs no copies between processes."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

_pool: ThreadPoolExecutor | None = None
_lock = threading.Lock()
_inside = threading.local()  # set on the pool's threads: work they start runs on themselves (no deadlock)


def cores() -> int:
    """The cores this process may run on (its CPU affinity, which containers and torchrun narrow)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def _mark_inside() -> None:
    _inside.active = True


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=cores(), thread_name_prefix="qrc-round",
                                       initializer=_mark_inside)
        return _pool


_threads_refused = False  # the system would not start a thread (a process limit, ulimit -v): run on the caller's


def cannot_start_thread(exc: BaseException) -> bool:
    """Whether `exc` is Python's failure to start a thread (the system refused it)."""
    return isinstance(exc, RuntimeError) and "can't start new thread" in str(exc)


def _refused() -> None:
    global _threads_refused
    _threads_refused = True


def parallel_map(fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """fn over items, in order, on every core (on the calling thread when there is one item, one core, the
    caller is itself one of the pool's threads, or the system refuses threads). An exception in any call is
    raised here."""
    work = list(items)
    if len(work) < 2 or cores() < 2 or getattr(_inside, "active", False) or _threads_refused:
        return [fn(item) for item in work]
    try:
        return list(_executor().map(fn, work))
    except RuntimeError as exc:
        if not cannot_start_thread(exc):
            raise
    _refused()  # the calls the pool took finish on its threads before they run here again (calls are pure)
    _executor().shutdown(wait=True)
    return [fn(item) for item in work]


def one_ahead(fn: Callable[[T], R], items: Sequence[T]) -> Iterator[R]:
    """fn over items in order, the next call running on a thread while the caller uses this one's value (so
    reading a weight overlaps rounding the last): at most one call ahead. An exception in a call is raised
    where its value would have been yielded."""
    if not items:
        return
    if _threads_refused:
        yield from (fn(item) for item in items)
        return
    with ThreadPoolExecutor(1, thread_name_prefix="qrc-ahead") as reader:
        try:
            ahead = reader.submit(fn, items[0])  # starts the one thread; later calls reuse it
        except RuntimeError as exc:
            if not cannot_start_thread(exc):
                raise
            _refused()
            yield from (fn(item) for item in items)
            return
        for number in range(len(items)):
            value = ahead.result()
            if number + 1 < len(items):
                ahead = reader.submit(fn, items[number + 1])
            yield value
            del value  # the caller's reference is the only one left while the next call runs


@contextlib.contextmanager
def one_behind(name: str) -> Iterator[Callable[[Callable[[], object]], None]]:
    """A function that runs calls on a thread of their own, in order, one at a time: each call waits for the
    one before to finish (so at most one is running while the caller goes on: writing a rounded weight
    overlaps rounding the next). A call's exception is raised at the next call or on leaving; leaving waits
    for the last call even when the body raised."""
    with ThreadPoolExecutor(1, thread_name_prefix=name) as worker:
        pending: list = []

        def submit(call: Callable[[], object]) -> None:
            if pending:
                pending.pop().result()
            if _threads_refused:
                call()
                return
            try:
                pending.append(worker.submit(call))
            except RuntimeError as exc:
                if not cannot_start_thread(exc):
                    raise
                _refused()
                call()

        yield submit
        if pending:
            pending.pop().result()
