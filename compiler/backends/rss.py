"""Measured memory: a background thread samples this process's RSS at a fixed interval."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from compiler.plan.ops import PlanOp


@dataclass
class RssSampler:
    """Samples RSS every `interval` seconds, each tagged with the plan op running then."""

    interval: float = 0.02
    samples: list[tuple[float, int, PlanOp | None]] = field(default_factory=list)  # (seconds, rss bytes, op)
    phase: PlanOp | None = None  # the plan op running (None before the first)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _start: float = 0.0

    def __enter__(self) -> RssSampler:
        import psutil

        self._process = psutil.Process()
        self._start = time.perf_counter()
        self._sample()
        self._thread = threading.Thread(target=self._run, name="qrc-rss", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()
        self._sample()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def _sample(self) -> None:
        self.samples.append((time.perf_counter() - self._start, self._process.memory_info().rss, self.phase))

    @property
    def peak(self) -> int:
        """The largest RSS sampled."""
        return max((rss for _, rss, _ in self.samples), default=0)

