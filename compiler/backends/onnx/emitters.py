"""The ONNX emitters (compiler.backends.emitter.Emitter): QDQ, and MatMulNBits (QDQ for what MatMulNBits
cannot take). The quantize op puts each rounded weight, which becomes its initializers and nodes at once
(with external data, its bytes go straight to the staged data file), and each activation's scale and zero
point; at `finish` the graph is rewritten (compiler/backends/onnx/rewrite.py), the kept float initializers
are read back (or, with external data, copied file to file), and the model is staged to be moved into
place atomically."""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from compiler.backends.emitter import Emitter, Spec
from compiler.backends.onnx.files import ModelFiles, load_remaining
from compiler.backends.onnx.kernels import uses_matmul_nbits
from compiler.backends.onnx.output_streams import EXTERNAL_THRESHOLD
from compiler.backends.onnx.rewrite import (
    Replacement,
    WeightJob,
    activation_consumers,
    replacement,
    rewrite,
    weight_axes,
    weight_nodes,
)
from compiler.backends.release import trim_heap
from compiler.ir.types import EmitFormat, Granularity, QType
from compiler.models.onnx_write import DataFile, commit, new_staging, stage
from compiler.quant import qparams
from compiler.quant.weights import QuantizedWeight
from compiler.resolve.assignment import Assignment


def _serialized_bytes(model: onnx.ModelProto) -> int:
    """About the model's serialized size (never less, 4-bit payloads counted at a byte per value): the
    initializers' bytes from their shapes and types, plus the nodes. ByteSize() walks every byte of the
    proto (0.2 s per 100 MB); the choice this feeds, inline or a data file at 1 GiB of protobuf's 2 GiB,
    needs no more."""
    total = sum(node.ByteSize() for node in model.graph.node)
    for tensor in model.graph.initializer:
        if tensor.data_type != onnx.TensorProto.STRING and tensor.HasField("raw_data"):
            itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
            total += math.prod(tensor.dims) * itemsize + 64 * len(tensor.dims) + len(tensor.name)
        else:
            total += tensor.ByteSize()
    return total


@dataclass(frozen=True)
class ActivationQParams:
    """A static input's quantization: scale, zero point, type, and the nodes (of quantized layers) reading it."""

    scale: np.ndarray
    zero_point: np.ndarray
    qtype: QType
    consumers: frozenset[str]


def activation_specs(assignment: Assignment, light: onnx.ModelProto,
                     bounds: dict[str, tuple[float, float]]) -> dict[str, ActivationQParams]:
    """The scale, zero point and consumer nodes of each activation-quantized layer's input, from its calibrated
    range (`bounds`; an input without one stays float)."""
    consumers = activation_consumers(assignment, light)
    specs: dict[str, ActivationQParams] = {}
    for a in assignment.layers:
        act, tensor = a.scheme.activations, a.layer.input
        if a.scheme.is_none or act is None or tensor in specs or tensor not in bounds:
            continue
        lo, hi = bounds[tensor]
        scale, zp = qparams.scale_zero_point(np.array(lo), np.array(hi), act.qtype, act.symmetric)
        specs[tensor] = ActivationQParams(scale, zp, act.qtype, frozenset(consumers[tensor]))
    return specs


class QdqEmitter(Emitter):
    """Weights as DequantizeLinear of integer initializers, static inputs as QuantizeLinear/DequantizeLinear."""

    format = EmitFormat.QDQ

    def __init__(self, files: ModelFiles, jobs: dict[str, WeightJob], output: Path, external: bool,
                 accuracy_level: int = 4):
        self.files, self.jobs, self.output, self.external = files, jobs, output, external
        self.accuracy_level = accuracy_level
        self.side: dict[str, bytes] = {}  # files written beside the model (genai.py)
        self.replacements: dict[str, Replacement] = {}
        self.readers = {name: node for node, name in self.weight_nodes()}
        self.data: DataFile | None = None  # external: the staged data file, filled as weights come
        self.activations: dict[str, ActivationQParams] = {}
        self.kept: set[str] = set()
        self.props: list[tuple[str, str]] = []
        self.staging: Path | None = None

    def weight_nodes(self) -> list[tuple[onnx.NodeProto, str]]:
        """(first node reading it, weight name) for every weight to quantize, in graph order."""
        return weight_nodes(self.files.light, self.jobs)

    def specs(self) -> list[Spec]:
        """The integer weights and their scales and zero points, from each layer's shape and scheme."""
        inits = {t.name: tuple(t.dims) for t in self.files.light.graph.initializer}
        out: list[Spec] = []
        for node, weight in self.weight_nodes():
            out += self._weight_specs(node, weight, inits[weight], self.jobs[weight])
        return out

    def _weight_specs(self, node: onnx.NodeProto, weight: str, shape: tuple[int, ...], job: WeightJob) -> list[Spec]:
        spec = job.scheme.quantized_weights
        channel, inputs = weight_axes(node)
        if spec.granularity is Granularity.PER_TENSOR:
            scales: tuple[int, ...] = ()
        elif spec.granularity is Granularity.GROUP:
            scales = tuple(math.ceil(d / spec.group) if i == inputs else d for i, d in enumerate(shape))
        else:
            scales = (shape[channel],)
        return [Spec(f"{weight}_quantized", spec.qtype.name, shape), Spec(f"{weight}_scale", _scale_dtype(job), scales),
                Spec(f"{weight}_zero_point", spec.qtype.name, scales)]

    def put(self, name: str, value: QuantizedWeight | ActivationQParams) -> None:
        """A rounded weight (by weight name) or a static input's quantization (by tensor name)."""
        if isinstance(value, QuantizedWeight):
            swap = replacement(self.readers[name], name, value, self.jobs[name], self.format, self.accuracy_level)
            if self.external:
                swap = Replacement(tuple(self._data().put(t) for t in swap.initializers), swap.nodes, swap.output)
            self.replacements[name] = swap
        else:
            self.activations[name] = value

    def _data(self) -> DataFile:
        if self.data is None:
            self.staging = new_staging(self.output)
            self.data = DataFile(self.staging, self.output)
        return self.data

    def copy_raw(self, name: str, *source) -> None:
        """Keep a float initializer as it is (read back from the external data at `finish`)."""
        self.kept.add(name)

    def metadata(self, key: str, value: str) -> None:
        """A metadata property of the model (provenance: no dates, paths or versions)."""
        self.props.append((key, value))

    def finish(self, check: Callable[[Path | bytes], None] | None = None) -> list[Path]:
        """Rewrite the graph, load the kept initializers, stamp, write atomically; the files written. `check`
        gets the model as written: a model written whole into one file as its bytes, while they are written
        (the two overlap), otherwise the staged file once its data file is complete."""
        missing = [w for w in self.jobs if w not in self.replacements]
        if missing:
            raise AssertionError(f"emit before {len(missing)} weights were put, e.g. {missing[0]}")
        activations = {t: (a.scale, a.zero_point, a.qtype, set(a.consumers)) for t, a in self.activations.items()}
        light = onnx.ModelProto()
        light.CopyFrom(self.files.light)  # weight-free: the float graph stays as it was for verification
        model = rewrite(light, self.jobs, self.replacements, activations, self.kept, self.format)
        del light
        # in the model now: the rounded values need not stay beside it while it is serialized, checked, verified
        self.replacements.clear()
        self.activations.clear()
        # and their heap pages go back, before the kept float tensors load and the model is serialized beside
        # itself: glibc kept them (the real SmolLM2's int4: 677 MiB at serialization against 613 planned)
        trim_heap()
        if self.external:
            data = self._data()
            for tensor in model.graph.initializer:
                if tensor.name in self.kept and tensor.data_location == onnx.TensorProto.EXTERNAL:
                    data.copy(tensor, self.files.base_dir)
            data.close()
        else:
            load_remaining(model, self.files.base_dir)
        del model.metadata_props[:]
        for key, value in self.props:
            model.metadata_props.add(key=key, value=value)
        model.producer_name, model.producer_version = "qrc", ""
        external = self.external or _serialized_bytes(model) > EXTERNAL_THRESHOLD
        if not external and self.staging is None:  # one file: checked from its bytes while they are written
            blob = model.SerializeToString(deterministic=True)
            del model  # onnxruntime's parse of the bytes then reuses the proto's memory
            self.staging = stage(blob, self.output, False, self.side, alongside=check)
        else:
            self.staging = stage(model, self.output, external, self.side, self.staging)
            if check is not None:
                check(self.staged_model)
        return sorted(self.staging.iterdir())

    @property
    def staged_model(self) -> Path:
        """The staged .onnx file (after finish)."""
        assert self.staging is not None, "finish() stages the model first"
        return self.staging / self.output.name

    def commit(self) -> list[Path]:
        """The staged model into place (data first, model last); the files at the destination."""
        staging, self.staging = self.staging, None
        assert staging is not None, "finish() stages the model before it is committed"
        return commit(staging, self.output)

    def abort(self) -> None:
        """Remove the staged model, if any: nothing appears at the destination."""
        if self.data is not None:
            self.data.handle.close()
        if self.staging is not None:
            shutil.rmtree(self.staging, ignore_errors=True)
            self.staging = None


def _scale_dtype(job: WeightJob) -> str:
    """Scales are in the weight's float type (fp16 and bf16 graphs keep theirs)."""
    return job.layer.dtype if job.layer.dtype in ("float16", "bfloat16") else "float32"


class MatMulNBitsEmitter(QdqEmitter):
    """Weight-only groups on MatMul as com.microsoft.MatMulNBits; everything else as QDQ."""

    format = EmitFormat.MATMUL_NBITS

    def _weight_specs(self, node: onnx.NodeProto, weight: str, shape: tuple[int, ...], job: WeightJob) -> list[Spec]:
        if not uses_matmul_nbits(self.format, node.op_type, job.scheme):
            return super()._weight_specs(node, weight, shape, job)
        spec = job.scheme.quantized_weights
        k, n = shape
        bits, blocks = spec.qtype.bits, k // spec.group
        out = [Spec(f"{weight}_Q{bits}", "uint8", (n, blocks, spec.group * bits // 8)),
               Spec(f"{weight}_scales", _scale_dtype(job), (n, blocks))]
        if not spec.symmetric:  # float zero points (`rounding hqq`): one per block in the scales' type, unpacked
            out.append(Spec(f"{weight}_zero_points", _scale_dtype(job), (n, blocks)) if job.scheme.rounding.float_zero_points
                       else Spec(f"{weight}_zero_points", "uint8", (n, math.ceil(blocks * bits / 8))))
        return out


def emitter_for(fmt: EmitFormat, files: ModelFiles, jobs: dict[str, WeightJob], output: Path,
                external: bool, accuracy_level: int = 4) -> QdqEmitter:
    """The emitter of an ONNX format."""
    kind = {EmitFormat.QDQ: QdqEmitter, EmitFormat.MATMUL_NBITS: MatMulNBitsEmitter}[fmt]
    return kind(files, jobs, output, external, accuracy_level)
