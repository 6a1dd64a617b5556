"""What the torch backend's ops share while one plan runs, and the small helpers every op uses on it. The run
(execute.py) is this state with the block-wise ops (blockwise.py) and verification (verifying.py) on it: one
object, as before, split by concern into files."""

from __future__ import annotations

from pathlib import Path

import torch

from compiler.backends.agreement import Agreement
from compiler.backends.emitter import Emitter
from compiler.backends.products import Pending
from compiler.backends.program import Produced
from compiler.backends.ranks import Owned, current
from compiler.backends.sensitivity import Scores
from compiler.backends.torch import streams
from compiler.backends.torch.attribution import LayerCosts
from compiler.backends.torch.check_process import CheckProcess
from compiler.backends.torch.early_check import EarlyCheck
from compiler.backends.torch.formats import TorchFormat, torch_format
from compiler.backends.torch.global_scales import SharedGlobalScales
from compiler.backends.torch.kv_cache import KvCacheQuantizer
from compiler.backends.torch.layers import Job, Statistics
from compiler.backends.torch.model import TorchModel
from compiler.backends.torch.resume import BlockResume
from compiler.backends.torch.rounding import Rounder
from compiler.backends.torch.sharing import share_kv
from compiler.backends.torch.smoother import Smoother
from compiler.ir.types import MemoryMode
from compiler.models.index import ModelIndex
from compiler.plan import ops
from compiler.plan.ops import Plan
from compiler.resolve.assignment import Assignment


class RunState:
    """The state the ops share: the model skeleton, the assignment (the search may change it), the jobs and
    the output writer (made once the assignment is final), and the sample streams. Each handler reads its op;
    what the ops share (the streams, the writer) is made once from the ops that need it (`_ready`)."""

    model = Produced[TorchModel]()  # load_model
    index = Produced[ModelIndex]()  # load_model
    writer = Produced[Emitter]()  # the output format's (formats.py), made by the first op that needs the jobs
    # (_ready); a collector on torchrun's ranks but the first (compiler/backends/ranks.py)
    global_scales = Produced[SharedGlobalScales]()
    kv = Produced[KvCacheQuantizer]()  # `kv_cache`: observes, then rounds, the attention caches (without it: no module)
    costs = Produced[LayerCosts]()  # each layer's own error on the held-out samples
    rounder = Produced[Rounder]()  # rounds into the writer

    def __init__(self, assignment: Assignment, plan: Plan, output: Path, progress, start: float):
        self.assignment, self.plan = assignment, plan
        self.output, self.progress, self.start = output, progress, start
        self.pending = Pending()  # what the rounder and the streams report between ops (program.py drains it)
        self.mode = plan.mode
        self.format: TorchFormat = torch_format(plan.emit.format)  # how the output is written (formats.py)
        self.access = ops.ModelAccess.RESIDENT  # set by load_model
        self._model: TorchModel | None = None
        self._index: ModelIndex | None = None
        self.scores: Scores | None = None
        self.devices: dict = {}
        self.jobs: list[Job] = []
        self._writer: Emitter | None = None
        self.ranks = current()  # one rank outside torchrun
        self._global_scales: SharedGlobalScales | None = None
        self._kv: KvCacheQuantizer | None = None
        self.config: dict = {}  # the output's config.json, its quantization_config checked before any work
        self.stats: Statistics | None = None
        self.cal: streams.Stream | None = None
        # the float stream, qrc's quantized stream (None when the emitted folder is what verification runs),
        # and the comparison
        self.verify_streams: tuple[streams.Stream, streams.Stream | None, Agreement] | None = None
        self.emitted = False  # verification runs the emitted folder as it loads (artifact.py), not qrc's model
        self.unopened = ""  # why transformers' own loader could not open the staged folder (Q427), if it could not
        # the float outputs kept before rounding (full); a list also where this rank has no held-out chunk, so
        # that every rank takes the same path at verification (its collectives)
        self.reference: list | None = None
        self.tail_done = False
        self.disk: Path | None = None  # `memory { disk }`, from select_memory_mode
        self.caches: list[streams.HiddenCache] = []
        self._costs: LayerCosts | None = None
        self._rounder: Rounder | None = None
        self.smoother: Smoother | None = None  # `transform`: folds its scales before each block's calibration
        self.early: EarlyCheck | None = None  # file to file: the final config and the load check, on a thread
        self.check_process: CheckProcess | None = None  # where that thread has them made (check_process.py)
        self.resume: BlockResume | None = None  # offload with `disk`: how far an earlier run got (resume.py)

    @property
    def file_to_file(self) -> bool:
        """Nothing runs the model (the plan opened its files only): no model definition is built, so an
        architecture transformers cannot build here still compiles."""
        return self.access is ops.ModelAccess.FILES

    def _ready(self) -> None:
        """Jobs, writer and streams, once: the run makes them (execute.py)."""
        raise NotImplementedError

    def _jobs_named(self, names: tuple[str, ...]) -> list[Job]:
        wanted = set(names)
        return [j for j in self.jobs if j.layer.name in wanted]

    def _materialize_all(self) -> None:
        missing = [p for p in self.model.keys if not self.model.is_resident(p)]
        if missing:
            self.model.materialize(missing)

    def _write_kv_scales(self, prefix: str) -> None:
        """The KV-cache scales of the modules under `prefix`, from every rank's maxima (sharing.py)."""
        share_kv(self.kv, self.ranks)
        self.kv.write_scales(prefix, self.writer)

    def _cache_folder(self) -> Path | None:
        """Where the hidden states between blocks go: the resume state's folder, `disk` in offload, else RAM."""
        return self.resume.folder if self.resume is not None else self.disk if self.offload else None

    def _stream(self, name: str, batches) -> streams.Stream:
        cache = streams.HiddenCache(self.model.dtype, self._cache_folder())
        self.caches.append(cache)
        # under torchrun each rank runs its own chunks (by index: rank i mod N) and the ranks merge what they
        # measured (sharing.py)
        return streams.Stream(name, [streams.torch_feed(f) for f in Owned(batches, self.ranks)], cache)

    def _verification(self) -> tuple[streams.Stream, streams.Stream | None, Agreement]:
        """The float stream, qrc's quantized one (None when the emitted folder is verified), the comparison."""
        assert self.verify_streams is not None, "made with the jobs when the plan verifies"
        return self.verify_streams

    def _call(self, feed: dict, last_logits_only: bool = False):
        with torch.no_grad():
            return self.model.forward(feed, last_logits_only)

    def _new_forward(self):
        if self.stats is not None:
            self.stats.new_forward()

    @property
    def offload(self) -> bool:
        """Whether the blocks' weights are read from the checkpoint as each block runs, and dropped after."""
        return self.mode is MemoryMode.OFFLOAD
