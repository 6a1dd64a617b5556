"""The values the torch backend's ops hand each other, one type per buffer (compiler/plan/ops.py, Buffer): the
runner holds them (compiler/backends/values.py) and each handler reads only those its op declares.

    model        Loaded        load_model: the model (or its files) and the recipe resolved against it
    memory_mode  MemoryChoice  select_memory_mode: the mode run, its disk, the blocks' GPUs
    sensitivity  Scored        score_sensitivity: each searched unit's loss (compiler/backends/sensitivity.py)
    precision    Assignment    assign_precision: the assignment the search chose
    output       Staging       prepare_run: each layer's job, and the output staged with what rounds into it
    streams      Streams       prepare_run: the sample streams (block_inputs: the same, cached at the blocks)
    statistics   Statistics    calibrate_chunk: every layer's statistics over the whole model
    reference    Reference     capture_reference: the float model's outputs on the held-out samples
    qparams      Rounder       each op that rounds: what was rounded (written into the output as it was)
    emitted_model Emitted      emit: the staged files, and what transformers made of them"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from compiler.backends.agreement import Agreement
from compiler.backends.emitter import Emitter
from compiler.backends.ranks import Owned, Ranks
from compiler.backends.torch import streams
from compiler.backends.torch.attribution import LayerCosts
from compiler.backends.torch.check_process import CheckProcess
from compiler.backends.torch.early_check import EarlyCheck
from compiler.backends.torch.global_scales import SharedGlobalScales
from compiler.backends.torch.kv_cache import KvCacheQuantizer
from compiler.backends.torch.layers import Job
from compiler.backends.torch.learned import LearningSteps
from compiler.backends.torch.model import TorchModel
from compiler.backends.torch.resume import BlockResume
from compiler.backends.torch.rounding import Rounder
from compiler.backends.torch.sharing import share_kv
from compiler.backends.torch.smoother import Smoother
from compiler.backends.values import ChosenMemory
from compiler.models.index import ModelIndex
from compiler.plan import ops
from compiler.plan.ops import Plan
from compiler.resolve.assignment import Assignment


@dataclass(frozen=True)
class Loaded:
    """`model`: the skeleton (weights resident or read per block) or, when nothing runs the model, its files
    alone; the recipe resolved against it; where transformers' load check of a file-to-file output runs."""

    model: TorchModel
    assignment: Assignment
    access: ops.ModelAccess
    check_process: CheckProcess | None = None

    @property
    def index(self) -> ModelIndex:
        """The model's layers, as the recipe was resolved against them."""
        return self.assignment.model

    @property
    def file_to_file(self) -> bool:
        """Nothing runs the model (the plan opened its files only): no model definition is built, so an
        architecture transformers cannot build here still compiles."""
        return self.access is ops.ModelAccess.FILES

    def call(self, feed: dict, last_logits_only: bool = False):
        """The model on one feed, without gradients."""
        with torch.no_grad():
            return self.model.forward(feed, last_logits_only)

    def materialize_all(self) -> None:
        """Every weight read (the ops that run the whole model)."""
        missing = [p for p in self.model.keys if not self.model.is_resident(p)]
        if missing:
            self.model.materialize(missing)


@dataclass(frozen=True)
class MemoryChoice(ChosenMemory):
    """`memory_mode`: the mode the run uses (multi_gpu may have fallen back), `memory { disk }`, and each
    block's GPU (multi_gpu)."""

    devices: dict = field(default_factory=dict)


@dataclass(eq=False)
class Target:
    """What an output format opens its output from (formats.py): where, for which plan and ranks, the model,
    its assignment and each quantized layer's job."""

    output: Path
    plan: Plan
    ranks: Ranks
    loaded: Loaded
    assignment: Assignment
    jobs: list[Job]

    @property
    def model(self) -> TorchModel:
        """The model (or its files)."""
        return self.loaded.model

    @property
    def file_to_file(self) -> bool:
        """Nothing runs the model."""
        return self.loaded.file_to_file

    @property
    def check_process(self) -> CheckProcess | None:
        """Where a file-to-file folder's config and load checks run (load_model started it)."""
        return self.loaded.check_process

    def jobs_named(self, names: tuple[str, ...]) -> list[Job]:
        """The jobs of the layers `names`, in job order."""
        wanted = set(names)
        return [j for j in self.jobs if j.layer.name in wanted]


@dataclass(eq=False)
class Staging(Target):
    """`output`: the output staged (the format's writer), what rounds into it, and what each layer's rounding
    needs beside its statistics: the shared global scales, the KV-cache quantizer, each layer's measured
    error, the transform, and a resumable run's state."""

    memory: MemoryChoice
    writer: Emitter
    rounder: Rounder
    global_scales: SharedGlobalScales
    kv: KvCacheQuantizer
    costs: LayerCosts
    resume: BlockResume | None = None
    early: EarlyCheck | None = None  # file to file: the final config and the load check, on a thread
    config: dict = field(default_factory=dict)  # the output's config.json, its quantization_config checked first
    smoother: Smoother | None = None  # `transform`: folds its scales before each block's calibration
    learning: LearningSteps | None = None  # how learned rounding's steps run, chosen at the first block that learns

    def write_kv_scales(self, prefix: str) -> None:
        """The KV-cache scales of the modules under `prefix`, from every rank's maxima (sharing.py)."""
        share_kv(self.kv, self.ranks)
        self.kv.write_scales(prefix, self.writer)


@dataclass(eq=False)
class Streams:
    """`streams` (and `block_inputs`, once they reached the blocks): the calibration stream, verification's
    float and quantized streams with their comparison, and every hidden-state cache made for them (closed
    with the run)."""

    dtype: torch.dtype
    folder: Path | None  # where hidden states go: a resume state's folder, `disk` in offload, else RAM
    ranks: Ranks
    cal: streams.Stream | None = None
    # the calibration samples through the float blocks (learned rounding's targets: torch/learned.py), where a
    # rounding is learned
    cal_float: streams.Stream | None = None
    # the float stream, qrc's quantized stream (None when the emitted folder is what verification runs), and
    # the comparison
    verify: tuple[streams.Stream, streams.Stream | None, Agreement] | None = None
    emitted: bool = False  # verification runs the emitted folder as it loads (artifact.py), not qrc's model
    compared: bool = False  # the tail already compared the streams at the model's output (blockwise.py)
    caches: list[streams.HiddenCache] = field(default_factory=list)

    def stream(self, name: str, batches) -> streams.Stream:
        """A stream over `batches`: under torchrun each rank runs its own chunks (by index: rank i mod N) and
        the ranks merge what they measured (sharing.py)."""
        return streams.Stream(name, [streams.torch_feed(f) for f in Owned(batches, self.ranks)],
                              self.cache(self.dtype))

    def cache(self, dtype: torch.dtype) -> streams.HiddenCache:
        """A new hidden-state cache, closed with the run."""
        made = streams.HiddenCache(dtype, self.folder)
        self.caches.append(made)
        return made

    def running(self) -> list[streams.Stream]:
        """The streams the blocks run: calibration (and its float twin), verification's float and quantized."""
        verify = self.verify
        return [s for s in (self.cal, self.cal_float, verify and verify[0], verify and verify[1]) if s is not None]

    def verification(self) -> tuple[streams.Stream, streams.Stream | None, Agreement]:
        """The float stream, qrc's quantized one (None when the emitted folder is verified), the comparison."""
        assert self.verify is not None, "made by prepare_run when the plan verifies"
        return self.verify


@dataclass(frozen=True)
class Reference:
    """`reference`: the float model's outputs on the held-out samples, kept before rounding (full); a list
    also where this rank has no held-out chunk, so every rank takes the same path at verification."""

    outputs: list


@dataclass(frozen=True)
class Emitted:
    """`emitted_model`: the staged files, and why transformers' own loader could not open them (Q427), if
    it could not (verification then decodes the folder layer by layer, and says so)."""

    files: tuple[Path, ...]
    unopened: str = ""
