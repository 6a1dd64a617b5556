"""ModelIndex: backend-neutral facts about a model, gathered without loading its weights."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from compiler.models.graph import GraphSummary
from compiler.models.safetensors_dtypes import SAFETENSORS_DTYPES

# Bytes per element of the dtypes that weights come in (every safetensors dtype; packed sub-byte ones count 1).
DTYPE_BYTES = {d.torch_name or d.code.lower(): max(1, d.bits // 8) for d in SAFETENSORS_DTYPES.values()}


class LayerKind(enum.Enum):
    """The families a recipe selects with `type` (the value is the name written in recipes)."""

    LINEAR = "Linear"
    CONV = "Conv"
    EMBEDDING = "Embedding"


class ModelFormat(enum.Enum):
    """Where a model's facts were read from."""

    ONNX = "onnx"  # an .onnx file (built-ins are indexed from their ONNX form)
    HF = "hf"  # an HF-style folder: config.json and *.safetensors
    TORCH = "torch"  # a PyTorch module in memory


# a checkpoint's tensors as its headers describe them: name → (dtype, shape); what the index reads, no bytes
Headers = dict[str, tuple[str, tuple[int, ...]]]

# the `op` of an MoE router (hf_index.py marks them): its own kind, which `type Linear` does not select
ROUTER_OP = "Router"


@dataclass(frozen=True, slots=True)
class Layer:
    """A weight-bearing operator, named by its dotted module path (`model.layers.0.self_attn.q_proj`).

    `kind` is the family a recipe selects with `type` (Linear, Conv, Embedding); `op` is what the model
    format calls it (MatMul, Gemm, Conv, Gather in ONNX; Linear, Conv2d, Embedding in torch).

    `named_only` layers are left alone by `type` rules and quantized only where a rule names them: a VLM's
    vision tower and projector (calibration feeds the language model), an MoE router (op `Router`: its logits
    pick the experts, and serving stacks keep it in float), and an LM head tied to the input embedding (its
    `weight` is the embedding's tensor; quantizing it unties it in the output).
    Features are those of the matching torch module: Linear in/out, Conv in_channels·kernel/out_channels,
    Embedding num_embeddings/embedding_dim.
    """

    name: str
    kind: LayerKind
    op: str
    weight: str  # the weight tensor's name in the model file
    input: str  # the activation the layer consumes (an ONNX value name; `NAME:input` where there is no graph)
    shape: tuple[int, ...]  # as stored in the file
    dtype: str
    in_features: int
    out_features: int
    block: str | None  # `model.layers.3`, or None outside the repeated blocks
    named_only: bool = False  # selected by name rules only: a VLM's vision tower or projector, a router, a tied head

    @property
    def params(self) -> int:
        """Number of weight elements."""
        return math.prod(self.shape)

    @property
    def bytes(self) -> int:
        """Bytes of the weight as stored."""
        return self.params * DTYPE_BYTES.get(self.dtype, 4)


@dataclass(frozen=True, slots=True)
class Norm:
    """A normalisation with a per-channel weight (`model.layers.0.input_layernorm`): where an outlier transform
    divides the activations by its scales (its weight, and its bias when it has one). `output` is the ONNX
    value the normalised, weighted activations leave in ('' where there is no graph)."""

    name: str
    weight: str
    bias: str | None
    width: int
    block: str | None
    output: str = ""


def norm_module(tensor: str) -> str | None:
    """The module a 1-D tensor named like a normalisation's weight belongs to (`…input_layernorm.weight` →
    `…input_layernorm`), else None. Names are what transformers saves; `norm` anywhere in the last part counts."""
    module, _, leaf = tensor.rpartition(".")
    return module if leaf in ("weight", "scale") and "norm" in module.rpartition(".")[2].lower() else None


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """A graph input or output: dims are ints or symbolic names (`batch`, `sequence`)."""

    name: str
    dtype: str
    shape: tuple[int | str, ...]


@dataclass(frozen=True, slots=True)
class ModelIndex:
    """Backend-neutral facts about a model: its layers, inputs, outputs and sizes."""
    ref: str  # what the recipe or the command line said
    format: ModelFormat
    family: str  # "llama", "bert", "cnn", "onnx", …
    layers: tuple[Layer, ...]  # in model order
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    total_bytes: int  # all weights, layers or not
    config: tuple[tuple[str, int | float | str], ...] = ()  # architecture numbers (hidden, layers, …)
    graph: GraphSummary | None = None  # ONNX only: values, nodes and shapes for the memory model
    norms: tuple[Norm, ...] = ()  # per-channel normalisation weights, in model order (outlier transforms)
    opset: int | None = None  # ONNX only: the default domain's opset (what QDQ emission may use)
    fused_experts: tuple[str, ...] = ()  # 3-D expert tensors stored fused (no layer stands for them: float)
    compressed_source: bool = False  # a compressed-tensors folder: its weights decompressed as they are read
    packed_experts: tuple[str, ...] = ()  # an MXFP4 checkpoint's expert tensors (gpt-oss): decoded as they are read
    fp4_compressed: tuple[str, ...] = ()  # a compressed-tensors source's weights stored NVFP4/MXFP4 (decompressed, slower)
    mxfp4_compressed: tuple[str, ...] = ()  # of those, MXFP4's: on a power-of-two grid, which NVFP4 casts exactly
    experts_split: bool = False  # fused experts indexed per expert for a GGUF output (models/expert_slices.py)
    gguf_decoded: tuple[str, ...] = ()  # a GGUF source's tensors stored in GGML blocks: decoded each time they are read
    inline_bytes: int = 0  # ONNX only: weights stored inside the .onnx file (split into a data file before a run)

    @property
    def blocks(self) -> tuple[str, ...]:
        """The repeated blocks, in order."""
        return tuple(dict.fromkeys(layer.block for layer in self.layers if layer.block))

    def layer(self, name: str) -> Layer:
        """The layer named `name`."""
        return next(layer for layer in self.layers if layer.name == name)

    def config_value(self, key: str, default=None):
        """An architecture number from the config, or `default`."""
        return next((v for k, v in self.config if k == key), default)
