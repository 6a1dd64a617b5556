"""RecipeIR: the elaborated recipe. Frozen, typed, defaults filled, units in bytes, names resolved."""

from __future__ import annotations

import enum
from dataclasses import dataclass

# the kinds plug-ins add to live in kinds.py; the IR's users import them from here with the rest of the IR
from compiler.ir.kinds import CalibrationMethod, EmitFormat, QType, Rounding, TransformData, TransformKind
from compiler.ir.runtimes import RuntimeTarget
from compiler.source import Span


class Backend(enum.Enum):
    """Which backend compiles the recipe."""
    ONNX = "onnx"
    TORCH = "torch"


class Granularity(enum.Enum):
    """How many scales a tensor gets: one, one per channel, per group of inputs, per token."""
    PER_TENSOR = "per_tensor"
    PER_CHANNEL = "per_channel"
    PER_TOKEN = "per_token"
    GROUP = "group"
    BLOCK = "block"  # weights: 2-D tiles [rows x columns] (FP8_BLOCK's 128x128)


class ActivationMode(enum.Enum):
    """Activation scales fixed by calibration (static) or computed at run time (dynamic)."""
    STATIC = "static"
    DYNAMIC = "dynamic"


class GroupPolicy(enum.Enum):
    """What a group does when its members' schemes differ."""
    PROMOTE = "promote"
    ERROR = "error"


class ExpertRouting(enum.Enum):
    """Which experts of an MoE block see each calibration token (the block's output always follows the router)."""
    ALL = "all"  # every token through every expert, for statistics: no expert is left without data
    ROUTED = "routed"  # only the tokens the router sends (an expert that saw none falls back to data-free rounding)


class AttentionKernel(enum.Enum):
    """The attention implementation a transformers model runs calibration and verification with."""
    MODEL = "model"  # what its config asks for (transformers' default: SDPA)
    EAGER = "eager"  # scores materialized, softmax in the model's dtype: what llm-compressor calibrates under
    SDPA = "sdpa"  # torch's scaled_dot_product_attention


class SensitivityMetric(enum.Enum):
    """How the mixed-precision search scores a choice."""
    KLD = "kld"
    MSE = "mse"
    SNR = "snr"


class MemoryMode(enum.Enum):
    """How the run holds the model: whole, block by block, blocks from disk, or over GPUs."""
    AUTO = "auto"
    FULL = "full"
    LOW_MEMORY = "low_memory"
    OFFLOAD = "offload"
    MULTI_GPU = "multi_gpu"


class VerifyMetric(enum.Enum):
    """What verification measures at the model's output."""
    COSINE = "cosine"
    SQNR = "sqnr"
    TOP1 = "top1"
    KLD = "kld"
    EMBEDDING_COSINE = "embedding_cosine"  # of the first output mean-pooled over the attention mask
    PERPLEXITY = "perplexity"  # the emitted model's perplexity over the float model's, as an increase in percent


class Bound(enum.Enum):
    """Which side of the threshold passes."""
    AT_LEAST = "at_least"
    AT_MOST = "at_most"


@dataclass(frozen=True, slots=True)
class BackendFacts:
    """What the recipe's checks need to know of its backend, declared by the backend's spec
    (compiler/backends/*/spec.py) and carried on the IR, so that ir/ and resolve/ name no backend."""
    default_format: EmitFormat  # `emit` without a `format`
    activation_qtype: QType  # integer activations as the backend's runtime fuses them (uint8 for onnxruntime)
    static_activations_only: bool  # holds calibrated per-tensor input ranges only (QDQ): presets' W8A8 is static
    takes_model: tuple[str, ...]  # model references a recipe without `backend` runs here (prefixes or suffixes)
    smooths_into_norms_only: bool  # SmoothQuant/AWQ scales fold into a norm, and into a preceding layer only
    # through the gated product the graph shows (ONNX: resolve/smoothing.py gated_pair)


class DataKind(enum.Enum):
    """Where calibration samples come from."""
    SYNTHETIC = "synthetic"
    NPZ = "npz"
    TEXT = "text"
    DATASET = "dataset"


class RowPolicy(enum.Enum):
    """How `data dataset` turns rows of any length into samples of exactly `seqlen` tokens."""
    PAD = "pad"  # one row per sample: cut at seqlen, shorter ones padded (the attention mask hides the padding)
    TRUNCATE = "truncate"  # one row per sample: cut at seqlen, shorter rows skipped
    PACK = "pack"  # rows' tokens joined end to end and cut into seqlen pieces (the last partial piece dropped)


class SelectorKind(enum.Enum):
    """How a rule selects layers: glob, regex, or layer type."""
    GLOB = "glob"
    REGEX = "regex"
    TYPE = "type"


@dataclass(frozen=True, slots=True)
class WeightQuant:
    """How a scheme quantizes weights."""
    qtype: QType
    granularity: Granularity  # PER_TENSOR | PER_CHANNEL | GROUP | BLOCK
    group_size: int | None
    symmetric: bool
    block: tuple[int, int] | None = None  # BLOCK: [output rows, input columns] per scale

    @property
    def group(self) -> int:
        """The group size of a GROUP spec (elaboration gives every group spec one)."""
        if self.group_size is None:
            raise ValueError(f"{self.granularity.value} weights have no group size")
        return self.group_size

    @property
    def block_shape(self) -> tuple[int, int]:
        """The (rows, columns) per scale of a BLOCK spec."""
        if self.block is None:
            raise ValueError(f"{self.granularity.value} weights have no block shape")
        return self.block


@dataclass(frozen=True, slots=True)
class ActivationQuant:
    """How a scheme quantizes a layer's inputs."""
    qtype: QType
    granularity: Granularity  # PER_TENSOR | PER_TOKEN | GROUP (dynamic float formats)
    symmetric: bool
    mode: ActivationMode
    group_size: int | None = None  # GROUP: columns per dynamic scale

    @property
    def group(self) -> int:
        """The columns per dynamic scale of a GROUP spec."""
        if self.group_size is None:
            raise ValueError(f"{self.granularity.value} inputs have no group size")
        return self.group_size

    @property
    def calibrated(self) -> bool:
        """Calibration sets something of it: static scales, or NVFP4's global input scale (its block scales
        are dynamic, computed per group of 16 at run time under one calibrated global scale)."""
        return self.mode is ActivationMode.STATIC or self.qtype is QType.NVFP4


@dataclass(frozen=True, slots=True)
class LearnedRounding:
    """`rounding autoround { iters N  lr X  batch B }`: sign-SGD steps per block, the learning rate of the first
    step (decaying linearly to 0), and the calibration samples each step runs. AutoRound's defaults: 200 steps, a
    learning rate of 1/iters, 8 samples a step."""

    iters: int = 200
    lr: float | None = None  # None: 1 / iters
    batch: int = 8

    @property
    def rate(self) -> float:
        """The first step's learning rate."""
        return self.lr if self.lr is not None else 1.0 / self.iters

    def step_samples(self, chunk: int, samples: int) -> int:
        """The samples a step runs: its `batch`, drawn from one calibration chunk of `chunk` (torch/learned.py),
        so at most the chunk's, and at most the `samples` there are."""
        return max(1, min(self.batch, chunk, samples))


class RotationStart(enum.Enum):
    """Where a learned rotation starts (`transform spinquant { init … }`)."""
    HADAMARD = "hadamard"  # QuaRot's random Hadamards (SpinQuant's own start)
    IDENTITY = "identity"  # no rotation: the norms folded, nothing mixed until the steps move it


@dataclass(frozen=True, slots=True)
class RotationLearning:
    """`transform spinquant { iters N  lr X  batch B  init I }`: Cayley SGD steps over the whole model, the first
    step's learning rate (decaying linearly to 0), the calibration samples each step runs, and where the rotation
    starts. SpinQuant's published settings are 100 steps at 1.5 (8 samples of 2048 tokens a step on a GPU) from a
    random Hadamard; one sample a step suits a CPU."""

    iters: int = 100
    lr: float = 1.5
    batch: int = 1
    start: RotationStart = RotationStart.HADAMARD


def gptq_scales_fixed(weights: WeightQuant, act_order: bool, static_groups: bool) -> bool:
    """Whether GPTQ takes every scale of these weights before its column loop (Scheme.gptq_scales_fixed)."""
    return static_groups or act_order or weights.granularity is not Granularity.GROUP


@dataclass(frozen=True, slots=True)
class Scheme:
    """A named precision scheme. `weights is None` only for the built-in `none` (leave in float)."""

    name: str
    weights: WeightQuant | None
    activations: ActivationQuant | None
    rounding: Rounding
    base: str | None = None  # the preset or scheme it refines
    span: Span | None = None  # None for presets and `none`
    act_order: bool = False  # gptq: columns in order of decreasing Hessian diagonal (a recipe's gptq: by default)
    static_groups: bool = False  # gptq: group scales from the float weight (False: as the loop reaches each group;
    # act_order implies True)
    mse_scales: bool = False  # gptq: each scale the range shrink with the least squared error (`rounding mse`'s
    # search; `rounding gptq` sets it unless `minmax_scales`), else the min/max range
    learned: LearnedRounding | None = None  # autoround: its settings (None for every other rounding)

    @property
    def is_none(self) -> bool:
        """The scheme leaves the layer in float."""
        return self.weights is None

    @property
    def learned_start_searched(self) -> bool:
        """Learned rounding of symmetric integer groups starts from the scale search weighted by the inputs' mean
        squares (`rounding imatrix`'s), which needs those squares gathered first (torch/learned.py)."""
        w = self.weights
        return self.learned is not None and w is not None and w.symmetric and not w.qtype.is_float \
            and not w.qtype.is_kquant

    @property
    def searches_fp4_scales(self) -> bool:
        """NVFP4/MXFP4 block scales chosen by the compiled loop's search (quant/float_kernels.py): `rounding mse`,
        `rounding imatrix` (each column weighted by its inputs' mean square) and GPTQ's default `mse_scales`
        (weighted by the Hessian's diagonal: torch/fp4_gptq.py)."""
        w = self.weights
        if w is None or w.qtype not in (QType.NVFP4, QType.MXFP4):
            return False
        return self.rounding in (Rounding.MSE, Rounding.IMATRIX) or (self.rounding is Rounding.GPTQ and self.mse_scales)

    @property
    def gptq_scales_fixed(self) -> bool:
        """GPTQ takes every scale before its column loop (per channel, or groups with act-order or static
        groups), so same-shape weights can round as one batch (quant/gptq_batch.py); else a group's scale is
        taken from the columns as the loop leaves them, one weight at a time."""
        return gptq_scales_fixed(self.quantized_weights, self.act_order, self.static_groups)

    @property
    def quantized_inputs(self) -> ActivationQuant:
        """How the inputs are quantized, for a scheme that quantizes them."""
        if self.activations is None:
            raise ValueError(f"scheme `{self.name}` leaves the inputs in float")
        return self.activations

    @property
    def quantized_weights(self) -> WeightQuant:
        """How the weights are quantized, for a scheme that quantizes them (every scheme but `none`)."""
        if self.weights is None:
            raise ValueError(f"scheme `{self.name}` leaves the weights in float")
        return self.weights


# The scheme of a layer left in float (`use none`): what every layer no rule names gets.
NONE = Scheme("none", None, None, Rounding.RTN)


@dataclass(frozen=True, slots=True)
class Selector:
    """One selector of a rule, with its source span."""
    kind: SelectorKind
    pattern: str
    span: Span


@dataclass(frozen=True, slots=True)
class Rule:
    """`selectors -> scheme`; rules apply in order and the last match wins."""

    index: int
    selectors: tuple[Selector, ...]
    scheme: str
    span: Span
    scheme_span: Span


class AutoGroup(enum.Enum):
    """What `group auto …` finds by name: layers fused kernels compute together."""
    QKV = "qkv"  # q/k/v of one attention block
    GATE_UP = "gate_up"  # gate/up of one MLP or one MoE expert
    ALL = "all"  # both (`group auto`)


@dataclass(frozen=True, slots=True)
class Group:
    """`group "glob with one {…}"` (pattern set) or `group auto [qkv|gate_up]` (pattern None, `auto` set)."""

    pattern: str | None
    policy: GroupPolicy
    span: Span
    auto: AutoGroup = AutoGroup.QKV  # what a pattern-less group finds


@dataclass(frozen=True, slots=True)
class Located:
    """Spans of the settings written in the recipe, by key; defaults have none."""

    spans: tuple[tuple[str, Span], ...]

    def span_of(self, key: str) -> Span | None:
        """The span of the setting written as `key`, if it was written."""
        return next((span for k, span in self.spans if k == key), None)


@dataclass(frozen=True, slots=True)
class DataSource(Located):
    """The `data` of calibration (and verification) samples."""
    kind: DataKind
    path: str | None
    samples: int
    seqlen: int
    seed: int
    tokenizer: str | None
    rows: DatasetRows | None = None  # `data dataset` only


@dataclass(frozen=True, slots=True)
class DatasetRows:
    """What `data dataset` reads from each row, and how rows become samples."""
    field: str  # the column holding the text, or the chat messages
    messages: bool  # the field is a list of {role, content}: rendered through the tokenizer's chat template
    image: str | None  # an image column: each row's image and text (a prompt) go through the model's processor
    split: str
    shuffle: bool  # rows in the order of `Dataset.shuffle(seed)` (the recipe's `seed`), else file order
    policy: RowPolicy


@dataclass(frozen=True, slots=True)
class Calibration(Located):
    """The `calibrate` block."""
    data: DataSource
    chunk: int
    method: CalibrationMethod  # a registered method with its settings (compiler/ir/methods.py)
    passthrough: tuple[str, ...]
    workers: int
    bins: int
    experts: ExpertRouting = ExpertRouting.ALL
    attention: AttentionKernel = AttentionKernel.MODEL


@dataclass(frozen=True, slots=True)
class MixedPrecision(Located):
    """The `mixed_precision` block."""
    choices: tuple[str, ...]
    metric: SensitivityMetric
    budget_bits: float
    samples: int


@dataclass(frozen=True, slots=True)
class Memory(Located):
    """The `memory` block: budgets (each rank's), mode, disk, and how many torchrun ranks share the run."""
    mode: MemoryMode
    ram: int | None  # bytes; None: detect free memory at plan time
    vram: tuple[int, ...]  # bytes per device
    disk: str | None
    ranks: int = 1  # processes torchrun starts for the compile (backends/ranks.py); the plan is each one's


@dataclass(frozen=True, slots=True)
class Verify(Located):
    """The `verify` block."""
    samples: int
    metric: VerifyMetric
    bound: Bound
    threshold: float


@dataclass(frozen=True, slots=True)
class Emit(Located):
    """The `emit` declaration."""
    path: str
    format: EmitFormat
    accuracy_level: int = 4  # MatMulNBits: int8 compute of the activations, onnxruntime's fast CPU path
    target: RuntimeTarget | None = None  # `runtime NAME  device D`: where the output must run


@dataclass(frozen=True, slots=True)
class KvCache:
    """`kv_cache { … }`: the attention modules' key/value cache quantized (FP8, static per-tensor scales)."""
    quant: ActivationQuant
    span: Span


@dataclass(frozen=True, slots=True)
class Mapping:
    """`map SOURCE -> TARGETS`: the module whose output is divided by the scales, and the layers that read
    that output and take the scales into their weights' input columns."""
    source: Selector
    targets: tuple[Selector, ...]
    span: Span


class OnlineRotation(enum.Enum):
    """A rotation the runtime applies to a layer's input as the model runs (`transform quarot { online r4 }`),
    its inverse folded into that layer's weight: QuaRot's names."""
    R4 = "r4"  # the down projection's input (the MLP's intermediate width)


@dataclass(frozen=True, slots=True)
class Transform(Located):
    """`transform awq|smoothquant|quarot { … }`. `mappings` empty: inferred from the model's block shape."""
    kind: TransformKind
    alpha: float  # smoothquant: migration strength
    grid: int  # awq: ratios searched in [0, 1)
    duo_scaling: bool  # awq: scales from activation and weight magnitudes (False: activations only)
    mappings: tuple[Mapping, ...]
    span: Span
    online: tuple[OnlineRotation, ...] = ()  # quarot: the rotations the runtime applies as it runs
    block: int | None = None  # quarot: R1 and R4 block-diagonal, blocks of this order (None: the whole width)
    learning: RotationLearning | None = None  # spinquant: how R1 and R2 are learned (None: random, QuaRot's)
    alpha_search: bool = False  # smoothquant `alpha search`: each mapping's strength searched over `grid` + 1 values

    @property
    def data(self) -> TransformData:
        """What its statistics pass gathers: a searched SmoothQuant strength scores its candidates with XᵀX too."""
        return TransformData.GRAM if self.alpha_search else self.kind.data

    @property
    def search_points(self) -> int:
        """Candidates each mapping's search scores (0: nothing searched): AWQ's grid ratios, the strengths of a
        searched SmoothQuant (0, 1/grid, …, 1) and the identity."""
        if self.alpha_search:
            return self.grid + 2
        if self.kind is TransformKind.SMOOTHQUANT:  # a fixed strength: its `grid` is a searching one's
            return 0
        return self.grid if "grid" in self.kind.settings else 0


@dataclass(frozen=True, slots=True)
class RecipeIR:
    """A recipe as the compiler understands it: every default written out, presets expanded."""
    name: str
    model: str
    model_span: Span | None  # None when the recipe has no `model`
    backend: Backend
    backend_from_model: bool
    schemes: tuple[Scheme, ...]  # defined ones in order, then presets used directly
    rules: tuple[Rule, ...]
    groups: tuple[Group, ...]
    calibration: Calibration
    mixed_precision: MixedPrecision | None
    memory: Memory
    verify: Verify | None
    emit: Emit | None
    source_name: str
    span: Span
    kv_cache: KvCache | None = None
    transform: Transform | None = None
    facts: BackendFacts | None = None  # the backend's, as its spec declares them (None: elaborated without them)

    @property
    def backend_facts(self) -> BackendFacts:
        """The backend's facts (every IR the front end elaborates carries them)."""
        if self.facts is None:
            raise ValueError(f"recipe `{self.name}` was elaborated without its backend's facts")
        return self.facts

    def scheme(self, name: str) -> Scheme:
        """The scheme named `name` (declared or a preset)."""
        if name == NONE.name:
            return NONE
        return next(s for s in self.schemes if s.name == name)

    @property
    def used_schemes(self) -> list[Scheme]:
        """The schemes a rule or the mixed-precision search's choices name (declared ones may go unused)."""
        names = {r.scheme for r in self.rules} | set(self.mixed_precision.choices if self.mixed_precision else ())
        return [s for s in self.schemes if s.name in names]
