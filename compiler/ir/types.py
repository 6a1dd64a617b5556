"""RecipeIR: the elaborated recipe. Frozen, typed, defaults filled, units in bytes, names resolved."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from compiler.source import Span


class Backend(enum.Enum):
    ONNX = "onnx"
    TORCH = "torch"


class QType(enum.Enum):
    INT8 = "int8"
    UINT8 = "uint8"
    INT4 = "int4"
    UINT4 = "uint4"

    @property
    def bits(self) -> int:
        return 4 if self in (QType.INT4, QType.UINT4) else 8

    @property
    def signed(self) -> bool:
        return self in (QType.INT8, QType.INT4)


class Granularity(enum.Enum):
    PER_TENSOR = "per_tensor"
    PER_CHANNEL = "per_channel"
    PER_TOKEN = "per_token"
    GROUP = "group"


class Rounding(enum.Enum):
    RTN = "rtn"
    MSE = "mse"
    GPTQ = "gptq"


class ActivationMode(enum.Enum):
    STATIC = "static"
    DYNAMIC = "dynamic"


class GroupPolicy(enum.Enum):
    PROMOTE = "promote"
    ERROR = "error"


class CalibrationMethod(enum.Enum):
    MINMAX = "minmax"
    PERCENTILE = "percentile"
    ENTROPY = "entropy"
    MSE = "mse"
    LAYERWISE_PERCENTILE = "layerwise_percentile"


class ScoreMetric(enum.Enum):
    MAE = "mae"
    MSE = "mse"


class SensitivityMetric(enum.Enum):
    KLD = "kld"
    MSE = "mse"
    SNR = "snr"


class MemoryMode(enum.Enum):
    AUTO = "auto"
    FULL = "full"
    LOW_MEMORY = "low_memory"
    OFFLOAD = "offload"
    MULTI_GPU = "multi_gpu"


class VerifyMetric(enum.Enum):
    COSINE = "cosine"
    SQNR = "sqnr"
    TOP1 = "top1"
    KLD = "kld"
    EMBEDDING_COSINE = "embedding_cosine"  # of the first output mean-pooled over the attention mask


class Bound(enum.Enum):
    AT_LEAST = "at_least"
    AT_MOST = "at_most"


class EmitFormat(enum.Enum):
    QDQ = "qdq"
    MATMUL_NBITS = "matmul_nbits"
    SAFETENSORS = "safetensors"


class DataKind(enum.Enum):
    SYNTHETIC = "synthetic"
    NPZ = "npz"
    TEXT = "text"


class SelectorKind(enum.Enum):
    GLOB = "glob"
    REGEX = "regex"
    TYPE = "type"


@dataclass(frozen=True, slots=True)
class WeightQuant:
    qtype: QType
    granularity: Granularity  # PER_TENSOR | PER_CHANNEL | GROUP
    group_size: int | None
    symmetric: bool


@dataclass(frozen=True, slots=True)
class ActivationQuant:
    qtype: QType
    granularity: Granularity  # PER_TENSOR | PER_TOKEN
    symmetric: bool
    mode: ActivationMode


@dataclass(frozen=True, slots=True)
class Scheme:
    """A named precision scheme. `weights is None` only for the built-in `none` (leave in float)."""

    name: str
    weights: WeightQuant | None
    activations: ActivationQuant | None
    rounding: Rounding
    base: str | None = None  # the preset or scheme it refines
    span: Span | None = None  # None for presets and `none`
    act_order: bool = False  # gptq: columns in order of decreasing Hessian diagonal

    @property
    def is_none(self) -> bool:
        return self.weights is None


@dataclass(frozen=True, slots=True)
class Selector:
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


@dataclass(frozen=True, slots=True)
class Group:
    """`group "glob with one {…}"` (pattern set) or `group auto qkv` (pattern None)."""

    pattern: str | None
    policy: GroupPolicy
    span: Span


@dataclass(frozen=True, slots=True)
class Located:
    """Spans of the settings written in the recipe, by key; defaults have none."""

    spans: tuple[tuple[str, Span], ...]

    def span_of(self, key: str) -> Span | None:
        return next((span for k, span in self.spans if k == key), None)


@dataclass(frozen=True, slots=True)
class DataSource(Located):
    kind: DataKind
    path: str | None
    samples: int
    seqlen: int
    seed: int
    tokenizer: str | None


@dataclass(frozen=True, slots=True)
class Calibration(Located):
    data: DataSource
    chunk: int
    method: CalibrationMethod
    percentile: float  # for PERCENTILE
    candidates: tuple[float, ...]  # for LAYERWISE_PERCENTILE
    score_metric: ScoreMetric  # for LAYERWISE_PERCENTILE
    passthrough: tuple[str, ...]
    workers: int
    bins: int


@dataclass(frozen=True, slots=True)
class MixedPrecision(Located):
    choices: tuple[str, ...]
    metric: SensitivityMetric
    budget_bits: float
    samples: int


@dataclass(frozen=True, slots=True)
class Memory(Located):
    mode: MemoryMode
    ram: int | None  # bytes; None: detect free memory at plan time
    vram: tuple[int, ...]  # bytes per device
    disk: str | None


@dataclass(frozen=True, slots=True)
class Verify(Located):
    samples: int
    metric: VerifyMetric
    bound: Bound
    threshold: float


@dataclass(frozen=True, slots=True)
class Emit(Located):
    path: str
    format: EmitFormat


@dataclass(frozen=True, slots=True)
class RecipeIR:
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

    def scheme(self, name: str) -> Scheme:
        from compiler.ir.schemes import NONE

        if name == NONE.name:
            return NONE
        return next(s for s in self.schemes if s.name == name)
