"""Measured memory: a background thread samples this process's RSS at a fixed interval, and the kernel's
high-water mark (VmHWM, reset when the compile starts) catches the spikes between two samples."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from compiler.plan.ops import PlanOp
from compiler.source import Span


@dataclass
class RssSampler:
    """Samples RSS every `interval` seconds, each tagged with the plan op running then. With a `limit` (the
    recipe's `ram`), the first sample above it is kept, and `check()` stops the run there (Q302)."""

    interval: float = 0.02
    limit: int | None = None
    span: Span | None = None  # where the recipe sets `ram` (Q302 points there)
    over: tuple[int, PlanOp | None] | None = None  # (rss, op) of the first sample above `limit`
    samples: list[tuple[float, int, PlanOp | None]] = field(default_factory=list)  # (seconds, rss bytes, op)
    phase: PlanOp | None = None  # the plan op running (None before the first)
    high_water: int = 0  # VmHWM at the end, when it could be reset at the start (else 0: samples only)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _children: list = field(default_factory=list)  # processes the compile started (an export): their memory counts
    with_children: bool = False  # a child's memory was counted (the peak is then of qrc's processes together)
    _start: float = 0.0

    def __enter__(self) -> RssSampler:
        import psutil

        self._process = psutil.Process()
        _ACTIVE.append(self)
        self._reset = _reset_high_water_mark()
        self._start = time.perf_counter()
        self._sample()
        self._thread = threading.Thread(target=self._run, name="qrc-rss", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        _ACTIVE.remove(self)
        self._stop.set()
        if self._thread:
            self._thread.join()
        self._sample()
        if self._reset:
            self.high_water = _high_water_mark()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def _sample(self) -> None:
        self.add(self.resident())

    def resident(self) -> int:
        """This process's resident set size now, and that of the child processes it follows."""
        rss = self._process.memory_info().rss
        for child in list(self._children):
            try:
                rss += child.memory_info().rss
            except Exception:  # noqa: BLE001 - psutil.Error: the child ended between two samples
                continue
        return rss

    def add(self, rss: int) -> None:
        """A measurement taken elsewhere (a child's high-water mark plus this process's RSS then), as a sample."""
        self.samples.append((time.perf_counter() - self._start, rss, self.phase))
        if self.limit is not None and rss > self.limit and self.over is None:
            self.over = (rss, self.phase)

    def check_now(self) -> None:
        """A sample taken now (and the kernel's high-water mark, when it was reset at the start: a spike between
        samples), then `check`: after each op, so even an op shorter than the interval is held to the budget
        before the output goes into place."""
        self._sample()
        if self._reset and self.limit is not None:
            peak = _high_water_mark()
            if peak > self.limit and self.over is None:
                self.over = (peak, self.phase)
        self.check()

    def check(self) -> None:
        """Raise Q302 once a sample went above the budget: the run stops instead of overrunning it."""
        if self.over is None:
            return
        from compiler.backends import BackendError
        from compiler.diagnostics import error
        from compiler.ir.values import human_bytes

        rss, op = self.over
        where = f" during `{op.kind.value}`" if op is not None else ""
        raise BackendError(error("Q302", f"the compile used {human_bytes(rss)}{where}, above the recipe's `ram` "
                                 f"{human_bytes(self.limit or 0)}; it stopped there", self.span, "over budget",
                                 help="raise `ram`, or use a smaller `chunk` or `mode offload` (qrc plan shows "
                                      "what each needs); nothing was written to the destination"))

    @property
    def peak(self) -> int:
        """The largest RSS sampled, or the kernel's high-water mark over the compile when that is larger (a
        spike shorter than the sampling interval)."""
        return max(max((rss for _, rss, _ in self.samples), default=0), self.high_water)


_STATUS = "/proc/self/status"
_ACTIVE: list[RssSampler] = []  # the samplers of the compiles running in this process (one, in practice)


@contextmanager
def following(pid: int) -> Iterator[None]:
    """While a child process the compile started runs, every active sampler counts its RSS too."""
    import psutil

    try:
        child = psutil.Process(pid)
    except psutil.Error:  # it already ended
        yield
        return
    for sampler in _ACTIVE:
        sampler._children.append(child)
        sampler.with_children = True
    try:
        yield
    finally:
        for sampler in _ACTIVE:
            if child in sampler._children:
                sampler._children.remove(child)


def record_child_peak(child_high_water: int, parent_rss: int) -> None:
    """A finished child's high-water mark plus this process's RSS while it ran: the peak the sampler may
    have missed between two samples."""
    for sampler in _ACTIVE:
        sampler.add(child_high_water + parent_rss)
        sampler.with_children = True


def own_rss() -> int:
    """This process's resident set size now (without children)."""
    import psutil

    return psutil.Process().memory_info().rss


def own_high_water_mark() -> int:
    """This process's VmHWM in bytes (0 where the kernel does not say)."""
    return _high_water_mark()


def _reset_high_water_mark() -> bool:
    """Reset this process's VmHWM to its current RSS (Linux: `5` to /proc/self/clear_refs); False where that
    is not possible, and then the peak is the samples' only (an earlier compile in the same process, or the
    imports, must not count)."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return _high_water_mark() > 0
    except OSError:
        return False


def _high_water_mark() -> int:
    try:
        with open(_STATUS) as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0

