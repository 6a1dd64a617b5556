"""The kinds a recipe names that plug-ins can add to (compiler/plugins.py holds their registries): weight and
activation types, rounding methods, output formats, outlier transforms and the calibration method's protocol.
The built-ins are registered here, as class attributes; compiler/ir/types.py builds the IR from them."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from compiler.diagnostics import Diagnostics
from compiler.plugins import EMIT_FORMATS, QTYPES, ROUNDINGS, TRANSFORMS, RegisteredValue, Registry
from compiler.syntax import ast


@dataclass(frozen=True, slots=True)
class QType(RegisteredValue):
    """A type weights or activations are quantized to, registered by name (compiler/plugins.py QTYPES): integers of
    any width up to 8 bits, and the floating formats deployments use (FP8 e4m3; NVFP4: e2m1 in blocks of 16 with
    FP8 scales and a global scale; MXFP4/MXFP8: e2m1/e4m3 in blocks of 32 with power-of-two (e8m0) scales). The
    built-ins are the class attributes below; a plug-in registers an integer type of another width, which the
    shared rounding, the torch backend's packer and compressed-tensors' `num_bits` take as it is."""

    REGISTRY: ClassVar[Registry] = QTYPES

    name: str  # what `weights NAME` / `activations NAME` writes
    summary: str  # one line for `qrc explain types`
    bits: int  # bits per value
    signed: bool = True
    is_float: bool = False  # a floating format (symmetric by construction, rounded by compressed-tensors' rules)
    kquant_group: int | None = None  # a GGUF K-quant's sub-block (Q6_K 16, Q4_K/Q5_K 32): written in GGUF only
    fixed_group: int | None = None  # the block size a microscaling format defines (NVFP4 16, MX 32)

    INT8: ClassVar[QType]
    UINT8: ClassVar[QType]
    INT4: ClassVar[QType]
    UINT4: ClassVar[QType]
    INT3: ClassVar[QType]
    INT2: ClassVar[QType]
    FP8: ClassVar[QType]
    NVFP4: ClassVar[QType]
    MXFP4: ClassVar[QType]
    MXFP8: ClassVar[QType]
    Q4_K: ClassVar[QType]
    Q5_K: ClassVar[QType]
    Q6_K: ClassVar[QType]

    @property
    def is_kquant(self) -> bool:
        """One of GGUF's K-quants (written in GGUF files only)."""
        return self.kquant_group is not None

    @property
    def scale_bytes(self) -> int | None:
        """Bytes of one block scale where the format fixes its type (FP8 or e8m0: 1)."""
        return 1 if self.fixed_group else None


QType.INT8 = QTYPES.register(QType("int8", "8-bit signed integers", 8))
QType.UINT8 = QTYPES.register(QType("uint8", "8-bit unsigned integers (onnxruntime's fast activations)", 8, False))
QType.INT4 = QTYPES.register(QType("int4", "4-bit signed integers", 4))
QType.UINT4 = QTYPES.register(QType("uint4", "4-bit unsigned integers", 4, False))
# the widths below 4 that learned rounding and GPTQ make usable (compressed-tensors packs any width into int32 words;
# transformers loads them; vLLM's kernels take 4 and 8 bits only)
QType.INT3 = QTYPES.register(QType("int3", "3-bit signed integers", 3))
QType.INT2 = QTYPES.register(QType("int2", "2-bit signed integers", 2))
QType.FP8 = QTYPES.register(QType("fp8", "FP8 e4m3", 8, is_float=True))
QType.NVFP4 = QTYPES.register(QType("nvfp4", "e2m1 in blocks of 16, FP8 block scales and a global scale", 4,
                                    is_float=True, fixed_group=16))
QType.MXFP4 = QTYPES.register(QType("mxfp4", "e2m1 in blocks of 32 with power-of-two scales", 4, is_float=True,
                                    fixed_group=32))
QType.MXFP8 = QTYPES.register(QType("mxfp8", "e4m3 in blocks of 32 with power-of-two scales", 8, is_float=True,
                                    fixed_group=32))
# GGUF's K-quants (llama.cpp): integers in sub-blocks of 32 (Q6_K: 16) whose scales (and, Q4_K/Q5_K, mins) are
# themselves quantized to 6/8 bits under one float16 scale per super-block of 256 weights
QType.Q4_K = QTYPES.register(QType("q4_k", "llama.cpp's 4-bit K-quant (GGUF only)", 4, kquant_group=32))
QType.Q5_K = QTYPES.register(QType("q5_k", "llama.cpp's 5-bit K-quant (GGUF only)", 5, kquant_group=32))
QType.Q6_K = QTYPES.register(QType("q6_k", "llama.cpp's 6-bit K-quant (GGUF only)", 6, kquant_group=16))


class RoundingData(enum.Enum):
    """What a rounding method needs from calibration: the statistics the backends gather (a closed set)."""
    NONE = "none"  # data-free
    INPUT_SQUARES = "input_squares"  # each input column's mean square over the calibration tokens (imatrix)
    HESSIAN = "hessian"  # the inputs' Hessian X^T X (GPTQ), rounded column by column with error feedback
    # the block's float outputs on the calibration stream: rounding learned per block against them (block by block)
    BLOCK_OUTPUT = "block_output"


@dataclass(frozen=True, slots=True)
class Rounding(RegisteredValue):
    """How weights are rounded: a method registered by name (compiler/plugins.py ROUNDINGS). The built-ins (the
    class attributes below) have their own kernels in the backends; a plug-in gives `scales`, its choice of each
    block's scale and zero point, and is rounded to the nearest grid value by the shared code (quant/weights.py)."""

    REGISTRY: ClassVar[Registry] = ROUNDINGS

    name: str  # what `rounding NAME` writes
    summary: str  # one line for `qrc explain roundings`
    data: RoundingData = RoundingData.NONE
    scales: Any = None  # a data-free plug-in's `(ScaleChoice) -> (scale, zero_point)` (quant/weights.py)
    settings: tuple[str, ...] = ()  # the keys of `rounding NAME { key value … }` it reads
    # its zero points lie between the integers: only outputs that store them as floats take it (Q277)
    float_zero_points: bool = False

    RTN: ClassVar[Rounding]
    MSE: ClassVar[Rounding]
    GPTQ: ClassVar[Rounding]
    IMATRIX: ClassVar[Rounding]
    AUTOROUND: ClassVar[Rounding]
    HQQ: ClassVar[Rounding]  # registered by compiler/quant/hqq.py (its scales are numpy code)




Rounding.RTN = ROUNDINGS.register(Rounding("rtn", "each block's absolute maximum on the grid's end, round to nearest"))
Rounding.MSE = ROUNDINGS.register(Rounding(
    "mse", "each block's clipping range searched for the least squared error, then round to nearest"))
Rounding.GPTQ = ROUNDINGS.register(Rounding(
    "gptq", "column by column, each rounding error spread onto the columns after it by the inputs' Hessian",
    RoundingData.HESSIAN))
# a search weighted by each input column's mean square over the calibration tokens (llama.cpp's imatrix): the
# K-quants' own search; integer groups and channels: `mse`'s clipping search with those weights, then rtn
Rounding.IMATRIX = ROUNDINGS.register(Rounding(
    "imatrix", "`mse`'s search weighted by each input's mean square (llama.cpp's imatrix; the K-quants' own)",
    RoundingData.INPUT_SQUARES))
# AutoRound's sign-SGD (Cheng et al., "Optimize Weight Rounding via Signed Gradient Descent"): per block, each
# weight's rounding offset in [-0.5, 0.5] and each group's clipping of its range learned against the block's float
# outputs on the calibration stream (docs/recipe-language.md, `rounding autoround`)
Rounding.AUTOROUND = ROUNDINGS.register(Rounding(
    "autoround", "per block, rounding offsets and clipping learned by sign-SGD against the block's float outputs",
    RoundingData.BLOCK_OUTPUT, settings=("iters", "lr", "batch")))


@dataclass(frozen=True, slots=True)
class EmitFormat(RegisteredValue):
    """What the emitted model looks like: a format registered by name (compiler/plugins.py EMIT_FORMATS), which
    the backends that write it list in their specs. The built-ins are the class attributes below."""

    REGISTRY: ClassVar[Registry] = EMIT_FORMATS

    name: str  # what `emit … { format NAME }` writes
    suffix: str | None  # the extension runtimes look for in a file of this format (None: a folder)
    summary: str  # one line for `qrc explain formats`
    scale_dtype: str | None = None  # the dtype it stores weight scales in where it fixes one (GGUF: float16)
    settings: tuple[str, ...] = ()  # the `emit` settings it reads beyond `format` (MatMulNBits: accuracy_level)

    QDQ: ClassVar[EmitFormat]
    MATMUL_NBITS: ClassVar[EmitFormat]
    SAFETENSORS: ClassVar[EmitFormat]
    GGUF: ClassVar[EmitFormat]




EmitFormat.QDQ = EMIT_FORMATS.register(EmitFormat(
    "qdq", ".onnx", "ONNX with QuantizeLinear/DequantizeLinear pairs (onnxruntime fuses them into integer kernels)"))
EmitFormat.MATMUL_NBITS = EMIT_FORMATS.register(EmitFormat(
    "matmul_nbits", ".onnx", "ONNX with onnxruntime's MatMulNBits for 2-8-bit weights (onnxruntime-genai's form)",
    settings=("accuracy_level",)))
EmitFormat.SAFETENSORS = EMIT_FORMATS.register(EmitFormat(
    "safetensors", None, "a folder of compressed-tensors safetensors (transformers, vLLM)"))
EmitFormat.GGUF = EMIT_FORMATS.register(EmitFormat(
    "gguf", ".gguf", "one GGUF file (llama.cpp, Ollama, LM Studio; Llama and Qwen decoders)", scale_dtype="float16"))


class CalibrationMethod(Protocol):
    """A calibration method with its settings: a frozen dataclass, registered by name (compiler/ir/methods.py);
    the IR holds it and plans compare it."""

    name: ClassVar[str]  # what a recipe writes: `method NAME`
    summary: ClassVar[str]  # one line for `qrc explain methods` and docs
    settings: ClassVar[str]  # what may follow the name, as recipe text ("" none), for `qrc explain methods`
    histogram: ClassVar[bool]  # observers keep a histogram (`bins` of them per tensor), not only min/max
    grid_search: ClassVar[bool]  # searches a clipping range against the integer grid (NVFP4 inputs have none)

    @classmethod
    def configure(cls, decl: ast.MethodDecl | None, diags: Diagnostics) -> CalibrationMethod:
        """The method with the settings `decl` writes (None: every default); mistakes go to `diags`."""
        ...

    def text(self) -> str:
        """The method as recipe text, every setting written out (`method percentile 99.999`)."""
        ...

    def detail(self) -> str:
        """What the plan's range search says of it (`percentile 99.999`)."""
        ...

    def range(self, observer: Any, qtype: QType, symmetric: bool) -> tuple[float, float] | None:
        """The (rmin, rmax) to quantize a tensor with from its observer, None when it never saw a finite value."""
        ...


class TransformData(enum.Enum):
    """What an outlier transform gathers per mapping from calibration (a closed set: what the backends gather)."""
    MAXIMA = "maxima"  # each input channel's |x| maximum
    GRAM = "gram"  # each input channel's mean |x| and the inputs' XᵀX (AWQ's search of the rounded output's error)


@dataclass(frozen=True, slots=True)
class TransformKind(RegisteredValue):
    """An outlier transform: per-channel scales moved from a layer's inputs into its weights before rounding, a
    kind registered by name (compiler/plugins.py TRANSFORMS). The built-ins are the class attributes below; a
    plug-in gives `scales`, each mapping's scales from its statistics, and the backends fold them as they fold
    SmoothQuant's."""

    REGISTRY: ClassVar[Registry] = TRANSFORMS

    name: str  # what `transform NAME` writes
    summary: str  # one line for `qrc explain transforms`
    settings: tuple[str, ...]  # the settings of the `transform` block it reads (of alpha, grid, duo_scaling, online)
    data: TransformData = TransformData.MAXIMA
    into_linears: bool = False  # its scales also fold into a preceding Linear (v→o, up→down), not only into norms
    # a plug-in's `(ChannelStats, target weights as [out, in] float32 arrays, Transform) -> scales`
    # (compiler/quant/smoothing.py ChannelStats)
    scales: Any = None
    # an orthogonal rotation folded into the weights as they are read (no mappings, no data): the residual stream
    # and each head's values (compiler/quant/rotations.py; the torch backend's torch/rotation.py)
    rotates: bool = False
    # the rotation is learned from calibration text before it is folded (SpinQuant; torch/spinquant.py)
    learns: bool = False

    AWQ: ClassVar[TransformKind]
    SMOOTHQUANT: ClassVar[TransformKind]
    QUAROT: ClassVar[TransformKind]
    SPINQUANT: ClassVar[TransformKind]




TransformKind.AWQ = TRANSFORMS.register(TransformKind(
    "awq", "activation-aware scales searched per mapping for the least output error of the rounded layers",
    ("grid", "duo_scaling"), TransformData.GRAM, into_linears=True))
TransformKind.SMOOTHQUANT = TRANSFORMS.register(TransformKind(
    "smoothquant", "s = max|x|^alpha / max|w|^(1-alpha): the inputs' outliers moved into the weights (W8A8); "
    "`alpha search` picks each mapping's strength (of `grid` + 1) for the least estimated error of its rounded "
    "weights and inputs; `online r4` then turns each down projection's input by a random Hadamard as the runtime "
    "runs (the smoothed inputs' per-token outliers spread)", ("alpha", "grid", "online")))
TransformKind.QUAROT = TRANSFORMS.register(TransformKind(
    "quarot", "the residual stream and each head's values rotated by random Hadamard matrices folded into the "
    "weights (QuaRot R1 + R2): the float model computes the same, its outliers spread before 4-bit activations; "
    "`online r4` also rotates the down projections' inputs as the runtime runs (vLLM); `block N` makes them "
    "block-diagonal", ("online", "block"), rotates=True))
TransformKind.SPINQUANT = TRANSFORMS.register(TransformKind(
    "spinquant", "QuaRot's rotations learned (SpinQuant): R1 and each layer's R2 moved by Cayley SGD on the "
    "calibration text to lower the quantized model's loss, then folded into the weights as QuaRot's are; "
    "`iters`, `lr`, `batch` set the steps, `init hadamard|identity` where they start; `online r4` and `block N` as "
    "QuaRot's (a block-diagonal R1 learns each block within itself)",
    ("online", "iters", "lr", "batch", "init", "block"),
    rotates=True, learns=True))
