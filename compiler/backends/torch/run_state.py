"""What the torch backend's ops share while one plan runs: services only. The values the ops hand each other
(the model, the staged output, the streams…) are the runner's (compiler/backends/values.py; their types in
run_values.py), and each handler reads only those its op declares. The run (execute.py) is this state with
the block-wise ops (blockwise.py) and verification (verifying.py) on it."""

from __future__ import annotations

from pathlib import Path

from compiler.backends.products import Pending
from compiler.backends.ranks import current
from compiler.backends.torch.formats import TorchFormat, torch_format
from compiler.plan.ops import Plan

SERVICES = ("plan", "output", "progress", "start", "pending", "ranks", "format")  # the run state, whole


class RunState:
    """The services every op may use: the plan (its spans, for diagnostics), the destination, progress, the
    start time, what the machinery reports between ops (`pending`: program.py drains it), torchrun's ranks and
    the output format's behaviour (formats.py). Nothing an op produces is kept here."""

    __slots__ = SERVICES

    def __init__(self, plan: Plan, output: Path, progress, start: float):
        self.plan, self.output, self.progress, self.start = plan, output, progress, start
        self.pending = Pending()
        self.ranks = current()  # one rank outside torchrun
        self.format: TorchFormat = torch_format(plan.emit.format)
