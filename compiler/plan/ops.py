"""Plan IR: the program a backend executes. One frozen dataclass per op kind, with typed fields; a plan is
its ops in execution order, and executing a plan is running each op's handler in that order
(compiler/backends/program.py). Each op also carries what the listing shows: a summary, the buffers it
reads and writes, and the estimated peak resident bytes of the whole process while it runs."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import ClassVar

from compiler.ir.printer import recipe_hash
from compiler.ir.runtimes import RuntimeCell
from compiler.ir.types import (
    AttentionKernel,
    Backend,
    Bound,
    Calibration,
    DataSource,
    EmitFormat,
    KvCache,
    MemoryMode,
    RotationStart,
    Rounding,
    Scheme,
    SensitivityMetric,
    Transform,
    TransformKind,
    VerifyMetric,
)
from compiler.models.index import ModelFormat, ModelIndex
from compiler.plan.decision import ModeDecision
from compiler.resolve.assignment import Assignment
from compiler.source import Span


class OpKind(enum.Enum):
    """The name of each op type, as the plan listing, the JSON form and the report show it."""

    EXPORT_ONNX = "export_onnx"
    LEARN_ROTATION = "learn_rotation"
    LOAD_MODEL = "load_model"
    SELECT_MEMORY_MODE = "select_memory_mode"
    SCORE_SENSITIVITY = "score_sensitivity"
    ASSIGN_PRECISION = "assign_precision"
    PREPARE_RUN = "prepare_run"
    SMOOTH = "smooth"
    CAPTURE_REFERENCE = "capture_reference"
    CALIBRATE_CHUNK = "calibrate_chunk"
    CACHE_BLOCK_INPUTS = "cache_block_inputs"
    RUN_BLOCK = "run_block"
    SEARCH_PERCENTILE = "search_percentile"
    PROPAGATE_RANGES = "propagate_ranges"
    QUANTIZE_WEIGHTS = "quantize_weights"
    EMIT = "emit"
    VERIFY = "verify"


class Buffer(enum.Enum):
    """What ops hand each other: an op reads its `inputs` and produces its `outputs`; the plan verifier
    (compiler/plan/verify.py) checks that each is produced before it is read, and the runner
    (compiler/backends/values.py) holds the value of each and hands an op's handler only what the op declares."""

    RECIPE = "recipe"
    CALIBRATION_DATA = "calibration_data"
    VERIFY_DATA = "verify_data"
    ONNX_MODEL = "onnx_model"
    MODEL = "model"
    ROTATION = "rotation"  # a learned rotation, which the model is then read through
    MEMORY_MODE = "memory_mode"
    SENSITIVITY = "sensitivity"
    PRECISION = "precision"
    OUTPUT = "output"  # the output being staged: each layer's job, and what rounds into it and writes it
    STREAMS = "streams"  # the sample streams (calibration, verification) the ops run through the model
    REFERENCE = "reference"
    STATISTICS = "statistics"
    HISTOGRAMS = "histograms"
    RANGES = "ranges"
    BLOCK_INPUTS = "block_inputs"
    QPARAMS = "qparams"
    EMITTED_MODEL = "emitted_model"
    VERIFY_REPORT = "verify_report"


class CacheLocation(enum.Enum):
    """Where block inputs are cached between blocks."""

    RAM = "in RAM"
    DISK = "on disk"


class ModelAccess(enum.Enum):
    """How `load_model` opens the model: what the later ops may read from it, and what it holds resident."""

    GRAPH = "graph"  # the ONNX graph only; weights stay in the data file until a session or the quantizer reads them
    FILES = "files"  # the checkpoint's files only; no model definition is built (nothing runs the model)
    BLOCKS = "blocks"  # the model's skeleton; each block's weights are read when it runs (offload, multi_gpu)
    RESIDENT = "resident"  # every weight read at once


class QuantizeStrategy(enum.Enum):
    """How `quantize_weights` rounds its layers (torch: the planner chose it from the mode and the streams)."""

    STREAMED = "streamed"  # one weight at a time: load → round → write → free
    IN_PLACE = "in_place"  # in the resident model, with the statistics of the whole-model calibration
    TAIL = "tail"  # the model's tail runs on the last block's outputs first (its layers' statistics, verification)
    FILE_TO_FILE = "file_to_file"  # tensor by tensor from the checkpoint's files, no model built


def _shown(name: str) -> dict:
    """Field metadata: the name the listing shows for a field whose attribute name is taken."""
    return {"shown": name}


def carried(default=dataclasses.MISSING):
    """A field the op's handler executes but the listing does not print (a recipe section the summary already
    says in words, a procedure): left out of comparisons too."""
    if default is dataclasses.MISSING:
        return field(metadata={"hidden": True}, compare=False)
    return field(default=default, metadata={"hidden": True}, compare=False)


@dataclass(frozen=True, slots=True)
class Spans:
    """Where in the recipe the plan's decisions come from: what a diagnostic raised while running points at."""

    recipe: Span | None = None
    model: Span | None = None
    data: Span | None = None  # the calibration data source
    experts: Span | None = None  # `calibrate { experts … }`
    ram: Span | None = None
    disk: Span | None = None
    mode: Span | None = None
    transform: Span | None = None
    emit: Span | None = None  # the output path
    verify: Span | None = None  # the verification gate


Resolver = Callable[[ModelIndex, Mapping[str, str]], Assignment]  # the recipe resolved against a model, with the
# layers a search chose given their scheme (the planner closes over the recipe; handlers never see it)


def _text(value) -> str:
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, tuple):
        return ",".join(_text(v) for v in value)
    return str(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanOp:
    """What every op has. `repeat` > 1 is the compact form of identical steps (`calibrate_chunk × 8`): the
    op's handler runs them all. `inputs`/`outputs` are the buffers it reads and produces, so a verifier can
    check that everything is produced before it is used."""

    kind: ClassVar[OpKind]
    summary: str
    inputs: tuple[Buffer, ...]
    outputs: tuple[Buffer, ...]
    peak_bytes: int
    repeat: int = 1
    layers: tuple[str, ...] = ()
    seconds: float = 0.0  # estimated wall time of all its repeats at this machine's rates (plan/timing.py)

    @property
    def params(self) -> tuple[tuple[str, str], ...]:
        """The op's own typed fields as text, in declaration order (the listing's parameter line)."""
        common = {f.name for f in fields(PlanOp)}
        return tuple((f.metadata.get("shown", f.name), _text(getattr(self, f.name)))
                     for f in fields(self) if f.name not in common and not f.metadata.get("hidden"))


class Exporter(enum.Enum):
    """Which maintained exporter turns an HF folder into the graph the ONNX backend compiles: torch.onnx (its
    dynamo exporter for decoders, TorchScript for encoders), or onnxruntime-genai's model builder where it takes
    the folder (backends/onnx/export_builder.py)."""

    TORCH_ONNX = "torch.onnx"
    GENAI_BUILDER = "onnxruntime-genai's builder"


@dataclass(frozen=True, slots=True, kw_only=True)
class ExportOnnx(PlanOp):
    """An HF-style folder compiled on ONNX is exported first (cached by the folder's file metadata)."""

    kind: ClassVar[OpKind] = OpKind.EXPORT_ONNX
    folder: str
    exporter: Exporter
    resolve: Resolver = carried()  # the recipe resolved again against the exported graph


@dataclass(frozen=True, slots=True, kw_only=True)
class LearnRotation(PlanOp):
    """SpinQuant: the float model opened whole, its R1 and R2 learned by Cayley SGD on the calibration samples
    (each step `batch` of them through the model as the recipe quantizes it), then dropped; the load reads the
    checkpoint through the learned rotation."""

    kind: ClassVar[OpKind] = OpKind.LEARN_ROTATION
    model: str
    iters: int
    batch: int
    lr: float
    start: RotationStart
    # (hidden width, head width or None, online down-projection width or None, block or None): QuaRot's start
    rotation: tuple[int, int | None, int | None, int | None] = carried()
    calibration: Calibration = carried()


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadModel(PlanOp):
    """Open the model (graph only, lazily, or whole)."""
    kind: ClassVar[OpKind] = OpKind.LOAD_MODEL
    model: str
    format: ModelFormat  # the form opened: a built-in in the backend's own form
    weights: int
    access: ModelAccess
    attention: AttentionKernel = carried(AttentionKernel.MODEL)  # the summary names it when the recipe does
    # (hidden width, head width or None, online down-projection width or None, block or None) of a rotation
    # folded into the weights as they are read (the summary says so); None: none
    rotation: tuple[int, int | None, int | None, int | None] | None = carried(None)


@dataclass(frozen=True, slots=True, kw_only=True)
class SelectMemoryMode(PlanOp):
    """The memory mode chosen, with the estimate it was chosen by."""
    kind: ClassVar[OpKind] = OpKind.SELECT_MEMORY_MODE
    mode: MemoryMode
    requested: MemoryMode
    estimate: int
    ram_budget: int
    vram: tuple[int, ...] = carried(())  # per GPU (multi_gpu places the blocks within them)
    disk: Path | None = carried(None)  # where block caches, resume state and scores go (`memory { disk }`)


@dataclass(frozen=True, slots=True, kw_only=True)
class ScoreSensitivity(PlanOp):
    """Score every searched unit under every choice (mixed precision)."""
    kind: ClassVar[OpKind] = OpKind.SCORE_SENSITIVITY
    metric: SensitivityMetric
    units: int
    samples: int
    params_searched: int = field(metadata=_shown("params"))
    choices: tuple[Scheme, ...] = carried()  # the schemes searched, cheapest first as written
    data: DataSource = carried()
    chunk: int = carried()


@dataclass(frozen=True, slots=True, kw_only=True)
class AssignPrecision(PlanOp):
    """Choose each unit's scheme under the bit budget."""
    kind: ClassVar[OpKind] = OpKind.ASSIGN_PRECISION
    budget_bits: float
    choices: tuple[str, ...]
    metric: SensitivityMetric = carried(SensitivityMetric.SNR)
    resolve: Resolver | None = carried(None)


@dataclass(frozen=True, slots=True)
class HeldOut:
    """The held-out samples verification runs: how many, the data they are held out from, in which chunks."""

    samples: int
    data: DataSource
    chunk: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PrepareRun(PlanOp):
    """Once the assignment is final: each quantized layer's job, the output opened with every tensor's place
    (before any work, so a layout it cannot hold fails first), and the sample streams the later ops run."""
    kind: ClassVar[OpKind] = OpKind.PREPARE_RUN
    jobs: int
    format: EmitFormat
    streams: tuple[str, ...]
    calibration: Calibration | None = carried(None)  # the first statistics op's samples (None: nothing reads them)
    transform: Transform | None = carried(None)  # folded before the statistics its layers round with
    kv_cache: KvCache | None = carried(None)  # its scales go into the output
    held_out: HeldOut | None = carried(None)  # verification's samples, never calibrated on
    blocks: int = carried(0)  # the blocks run_block runs (0: not block by block): a resumable run's length


@dataclass(frozen=True, slots=True, kw_only=True)
class Smooth(PlanOp):
    """The outlier transform (AWQ, SmoothQuant) over the whole model before any statistic is gathered: its own
    pass over the calibration samples, the scales folded into the weights, the float output checked.
    (Block by block, each block is smoothed inside run_block, which says so.)"""

    kind: ClassVar[OpKind] = OpKind.SMOOTH
    transform: TransformKind
    mappings: int
    settings: Transform = carried()
    calibration: Calibration = carried()


@dataclass(frozen=True, slots=True, kw_only=True)
class CaptureReference(PlanOp):
    """The float model's outputs on the held-out samples, kept for verification (a backend that rounds the
    resident model in place needs them before it rounds)."""

    kind: ClassVar[OpKind] = OpKind.CAPTURE_REFERENCE
    samples: int
    data: DataSource = carried()  # held out from it
    chunk: int = carried()


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrateChunk(PlanOp):
    """Forward passes of the whole model over the calibration samples, `chunk` at a time, `passes` times
    (low_memory splits the observed tensors into groups, one pass each)."""

    kind: ClassVar[OpKind] = OpKind.CALIBRATE_CHUNK
    chunk: int
    samples: int
    seqlen: int
    passes: int
    method: str  # the calibration method's name (its settings: `calibration`)
    observed: int
    calibration: Calibration = carried()
    transform: Transform | None = carried(None)  # folded before the statistics its layers round with
    kv_cache: KvCache | None = carried(None)


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheBlockInputs(PlanOp):
    """Run the samples up to the first block and cache its inputs."""
    kind: ClassVar[OpKind] = OpKind.CACHE_BLOCK_INPUTS
    samples: int
    seqlen: int
    per_sample: int
    where: CacheLocation
    calibration: Calibration = carried()
    transform: Transform | None = carried(None)  # folded before the statistics its layers round with
    kv_cache: KvCache | None = carried(None)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunBlock(PlanOp):
    """Run every block on the cached inputs, block by block."""
    kind: ClassVar[OpKind] = OpKind.RUN_BLOCK
    blocks: int
    chunk: int
    gptq: bool
    calibration: Calibration = carried()
    transform: Transform | None = carried(None)  # folded before the statistics its layers round with
    kv_cache: KvCache | None = carried(None)
    compiled_steps: bool = carried(False)  # learned rounding's steps run through torch.compile (what the time counts)


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchPercentile(PlanOp):
    """Ranges from histograms (percentile, entropy, mse, layer-wise percentile)."""
    kind: ClassVar[OpKind] = OpKind.SEARCH_PERCENTILE
    method: str
    bins: int
    tensors: int
    calibration: Calibration = carried()  # the ranges' settings


@dataclass(frozen=True, slots=True, kw_only=True)
class PropagateRanges(PlanOp):
    """Outputs of passthrough ops take their producer's range."""
    kind: ClassVar[OpKind] = OpKind.PROPAGATE_RANGES
    inherited: int
    needed: int
    observed: int
    calibration: Calibration = carried()  # the ranges' settings


@dataclass(frozen=True, slots=True, kw_only=True)
class QuantizeWeights(PlanOp):
    """Round the weights of the op's layers."""
    kind: ClassVar[OpKind] = OpKind.QUANTIZE_WEIGHTS
    count: int = field(metadata=_shown("layers"))
    rounding: tuple[Rounding, ...]
    strategy: QuantizeStrategy
    calibration: Calibration = carried()  # the ranges' settings


@dataclass(frozen=True, slots=True, kw_only=True)
class Emit(PlanOp):
    """Write the quantized model."""
    kind: ClassVar[OpKind] = OpKind.EMIT
    format: EmitFormat
    path: str
    bytes: int
    accuracy_level: int = carried(4)  # MatMulNBits
    kv_cache: KvCache | None = carried(None)  # its scales go into the output
    streams_weights: bool = carried(False)  # ONNX: each rounded weight goes to the data file at once


@dataclass(frozen=True, slots=True, kw_only=True)
class Verify(PlanOp):
    """Compare the emitted model with float on held-out samples."""
    kind: ClassVar[OpKind] = OpKind.VERIFY
    samples: int
    metric: VerifyMetric
    bound: Bound
    threshold: float
    data: DataSource = carried()  # held out from it
    chunk: int = carried()

    @property
    def params(self) -> tuple[tuple[str, str], ...]:
        """`bound=at_least 0.7`: the bound reads as the recipe writes it."""
        return (("samples", str(self.samples)), ("metric", self.metric.value),
                ("bound", f"{self.bound.value} {self.threshold:g}"))


@dataclass(frozen=True, slots=True)
class Plan:
    """The program: ops in execution order, with the memory decision they were lowered for."""

    recipe: str
    source: str
    model: str
    backend: Backend
    layers: int
    quantized_layers: int
    decision: ModeDecision
    ops: tuple[PlanOp, ...]
    notes: tuple[str, ...] = ()
    spans: Spans = Spans()
    recipe_text: str = ""  # the recipe in canonical form: the output's provenance, the resume state's key
    ranks: int = 1  # torchrun processes sharing the run (`memory { ranks N }`): the peaks are each one's
    start_seconds: float = 0.0  # estimated: what a compile's process does before its first op (plan/timing.py)
    runtimes: tuple[RuntimeCell, ...] = ()  # where the output runs (the backend's table, compiler/ir/runtimes.py)

    @property
    def seconds(self) -> float:
        """The estimated wall time of a compile: its start and every op."""
        return self.start_seconds + sum(op.seconds for op in self.ops)

    @property
    def peak_bytes(self) -> int:
        """The plan's peak: the largest op's."""
        return max((op.peak_bytes for op in self.ops), default=0)

    @property
    def mode(self) -> MemoryMode:
        """The chosen memory mode (a Plan exists only when one fits)."""
        assert self.decision.mode is not None
        return self.decision.mode

    @property
    def provenance(self) -> tuple[tuple[str, str], ...]:
        """What an emitted model records about its making: the recipe's name and the hash of its canonical
        form (no dates, paths or versions, so the same recipe gives the same bytes)."""
        return (("qrc.recipe", self.recipe), ("qrc.recipe_sha256", recipe_hash(self.recipe_text)))

    def first(self, op_type: type) -> PlanOp | None:
        """The first op of this type, if the plan has one."""
        return next((op for op in self.ops if isinstance(op, op_type)), None)

    @property
    def emit(self) -> Emit:
        """The plan's emit op: every plan has one (plan/verify.py)."""
        op = self.first(Emit)
        assert isinstance(op, Emit)
        return op
