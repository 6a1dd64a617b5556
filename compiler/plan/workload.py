"""What a compile will do, in the numbers the memory model needs: derived from the recipe and the
resolved model, before any weight is read."""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass

from compiler.data.batches import cache_length, resolve_tokenizer, sample_count, sequence_length
from compiler.data.dataset_schema import tokenizer_location
from compiler.ir.kinds import RoundingData
from compiler.ir.types import (
    AttentionKernel,
    Backend,
    DataKind,
    EmitFormat,
    ExpertRouting,
    LearnedRounding,
    OnlineRotation,
    QType,
    RecipeIR,
    Rounding,
    SensitivityMetric,
    Transform,
)
from compiler.models.index import Layer, LayerKind, ModelIndex
from compiler.plan.activations import propagate
from compiler.quant import fused_float, fused_rtn
from compiler.resolve.assignment import Assignment, LayerAssignment
from compiler.resolve.mixed import choices_of, search_units
from compiler.resolve.rotation import rotates
from compiler.resolve.sizes import quantized_bytes

# `data dataset` imports datasets (pyarrow, pandas) and transformers' tokenizer: an ONNX compile of the tiny
# Llama peaked at 248 MiB reading chat.jsonl against 118 MiB reading the same samples with `data text`
DATASET_LIBRARIES = 130 << 20
# `data text` and `data dataset` load the tokenizer (the tokenizers library's) and it stays resident: about 20 times
# its JSON file (SmolLM2's 1.49 MiB: +30 MiB RSS; all-MiniLM-L6-v2's 0.44 MiB: +9; 2026-12-06), 2 MiB at least.
# Without it the real SmolLM2's compiles on `data text` started 37 MiB above the runtime the plan counted
TOKENIZER_RESIDENT = 20
TOKENIZER_FLOOR = 2 << 20


def _tokenizer_bytes(source, model_ref: str) -> int:
    """What loading the data's tokenizer keeps resident (0 for data that is not tokenized text, or a tokenizer not
    found: `check` says so)."""
    if source.kind not in (DataKind.TEXT, DataKind.DATASET):
        return 0
    path = resolve_tokenizer(source, model_ref) if source.kind is DataKind.TEXT else tokenizer_location(source, model_ref)
    if path is not None and path.is_dir():
        path = path / "tokenizer.json"
    size = path.stat().st_size if path is not None and path.is_file() else 0
    return max(TOKENIZER_FLOOR, TOKENIZER_RESIDENT * size) if size else 0


@dataclass(frozen=True, slots=True)
class Observation:
    """What calibration must see for an assignment: the inputs whose ranges the output needs, the tensors
    observed for them (passthrough producers stand in), and GPTQ's layer inputs."""

    needed: tuple[str, ...]  # activations whose ranges the emitted model needs (inputs of A-quantized layers)
    observed: tuple[str, ...]  # what calibration observes after passthrough propagation
    sources: tuple[tuple[str, str], ...]  # (needed tensor, the tensor its range comes from): itself, or a
    # passthrough ancestor's output (selective propagation: docs/recipe-language.md, `calibrate`)
    gptq_layers: tuple[str, ...]
    hessian_inputs: tuple[tuple[str, int], ...]  # (input tensor, features) of GPTQ's linear layers, once each

    @property
    def source_of(self) -> dict[str, str]:
        """Each needed tensor's observed source."""
        return dict(self.sources)

    @property
    def fetched(self) -> tuple[str, ...]:
        """What the ONNX calibration reads out of the graph: the observed tensors and the GPTQ inputs."""
        return tuple(dict.fromkeys((*self.observed, *(t for t, _ in self.hessian_inputs))))


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload(Observation):
    """What the run must hold and do, in numbers: what the memory model and the lowering read (with what its
    calibration observes)."""
    backend: Backend
    index: ModelIndex
    weights_bytes: int
    quantized_bytes: int
    dequantized_bytes: int  # float weights onnxruntime rebuilds from DequantizeLinear when it runs an ONNX output
    dequantized_largest: int = 0  # the largest of them
    integer_kernel_bytes: int = 0  # of those, what full optimizations fuse into integer kernels instead
    largest_layer_bytes: int
    quantized_layers: tuple[str, ...]
    calibrate: bool  # any step needs a forward pass over calibration data
    gptq: bool
    samples: int  # the calibration samples one rank runs (all of them without torchrun: ranks.py)
    seqlen: int
    past: int  # tokens already in a decoder's cache per sample (an npz's past axis; else 0)
    chunk: int
    bins: int
    histogram: bool  # the calibration method keeps a histogram per observed tensor, not only min/max
    mixed_precision: bool
    search: Search | None  # the mixed-precision search, when there are units to search
    # searched with their inputs' mean squares (a vector per input): `rounding imatrix`, a learned rounding's start
    imatrix_layers: tuple[str, ...] = ()
    learned_layers: tuple[str, ...] = ()  # rounded by `rounding autoround`: learned per block (sign-SGD)
    learned: LearnedRounding | None = None  # its settings (the most steps and samples a step any scheme asks)
    kv_cache: bool = False  # `kv_cache`: its ranges are observed on the calibration stream
    verify_samples: int  # the held-out samples one rank runs
    disk: bool  # block data may be cached on disk (`memory { disk … }`)
    transform: Transform | None = None
    rotated: bool = False  # the weights are rotated as they are read (`transform quarot`)
    online_width: int = 0  # the width of the rotation the runtime applies as it runs (`online r4`), 0: none
    rotation_block: int = 0  # the block of a block-diagonal rotation (`block N`), 0: each of its whole width
    smoothing: tuple[tuple[str | None, int, int], ...] = ()  # per mapping: (block, input width, float32 bytes of
    # its targets' weights), what the transform's statistics and scratch scale with
    smoothing_observed: tuple[str, ...] = ()  # the values the transform's pass observes (its targets' inputs)
    ranks: int = 1  # torchrun processes sharing the run: the samples above are each one's share
    data_libraries: int = 0  # what reading the samples keeps beyond the backend's runtime (DATASET_LIBRARIES, the
    # tokenizer: TOKENIZER_RESIDENT)
    reads_dataset: bool = False  # the samples come through the datasets library (`data dataset`)
    templated: bool = False  # dataset rows rendered through a chat template (in a child process: data/templates.py)
    attention: AttentionKernel = AttentionKernel.MODEL  # `calibrate { attention }`: eager holds the scores
    float_rounded: bool = False  # a weight goes to a floating format (compressed-tensors' torch functions round it)
    kernel_rounded: bool = False  # a weight is rounded by the compiled rtn loop (torch backend: quant/fused_rtn.py)
    kernel_searched: bool = False  # of those, one's scale is searched first by the compiled mse loop (`rounding mse`)
    float_kernel_rounded: bool = False  # every floating-format weight fits the compiled loop (quant/fused_float.py),
    # which rounds them when nothing runs the model (file to file)
    sliced_rounded: bool = False  # an integer weight is rounded outside it, from float32 slices (mse, float16 scales)
    emit_format: EmitFormat | None = None  # the output's format (`emit`), which the backend's cost model asks
    kquant_layers: tuple[tuple[str, str], ...] = ()  # (layer, K-quant type) of the weights that go to a K-quant
    nvfp4_layers: tuple[str, ...] = ()  # the layers rounded to NVFP4 (an FP4 source's take the exact cast's path)
    # NVFP4 layers that compressed-tensors' functions round, not the compiled loop: an MXFP4 source's experts (on
    # its grid: the exact cast) and experts split for a GGUF (a global scale of 1): torch/float_formats.py
    cast_nvfp4_layers: tuple[str, ...] = ()
    fp4_weight_layers: tuple[str, ...] = ()  # the layers rounded to NVFP4 or MXFP4 weights
    fp4_searched_layers: tuple[str, ...] = ()  # NVFP4/MXFP4 layers whose block scales are searched (Scheme.searches_fp4_scales)
    fp4_input_elements: int = 0  # per token, the input elements the layers round to FP4 as they run (NVFP4, MXFP4)
    quantized_input_width: int = 0  # the widest input a layer copies as it runs: its activation scheme's quantized
    # copy, or its squares for imatrix (torch/layers.py Squares)
    every_expert: bool = True  # `calibrate { experts all }`: statistics passes send every token through every expert
    batchable_gptq_layers: tuple[str, ...] = ()  # GPTQ layers whose scales are fixed before the loop (integer
    # grids): an MoE block's same-shape experts among them round as batches (memory.py expert_batches)

    @property
    def histograms(self) -> bool:
        """Whether static inputs are observed by histograms (every calibration method that keeps one), which the
        torch backend bins with a compiled loop (quant/histogram_kernel.py)."""
        return bool(self.observed) and self.histogram

    @property
    def kquant_rounded(self) -> bool:
        """A weight goes to a K-quant (qrc's numpy search of llama.cpp's scales)."""
        return bool(self.kquant_layers)

    @property
    def searched(self) -> Search:
        """The mixed-precision search, for a workload that has one (its score op exists only then)."""
        if self.search is None:
            raise ValueError("this workload has no mixed-precision search")
        return self.search

    @property
    def learned_step_samples(self) -> int:
        """The calibration samples one learned-rounding step runs: its `batch`, drawn from one calibration chunk
        (torch/learned.py), so at most the chunk's samples (0 where nothing is learned)."""
        return self.learned.step_samples(self.chunk, self.samples) if self.learned is not None else 0

    @property
    def inherited(self) -> int:
        """Needed tensors whose range comes from a passthrough ancestor instead of being observed."""
        return sum(source != tensor for tensor, source in self.sources)

    @property
    def blocks(self) -> tuple[str, ...]:
        """The repeated blocks, in order."""
        return self.index.blocks

    def head_calibrates(self) -> bool:
        """Whether the model's last layer (a decoder's LM head) needs calibration data: its inputs observed, its
        Hessian or input statistics summed. Else a whole-model statistics pass runs it on the last position
        only (the torch backend's `last_logits_only`)."""
        head = self.index.layers[-1] if self.index.layers else None
        return head is not None and (head.name in self.gptq_layers or head.name in self.imatrix_layers
                                     or head.input in self.needed)

    def block_bytes(self) -> dict[str, int]:
        """Weight bytes per block (and of what is outside them). A tensor two layers share (an LM head tied to
        the input embedding) is counted once: it is held once (SmolLM2-135M's 108 MiB embedding had been
        counted twice, a 0.85x plan)."""
        sizes: Counter = Counter()
        counted: set[str] = set()
        for layer in self.index.layers:
            if layer.weight in counted:
                continue
            counted.add(layer.weight)
            sizes[layer.block or "(outside blocks)"] += layer.bytes
        return dict(sizes)

    @property
    def hidden(self) -> int:
        """The width of the hidden state between blocks: the most common input width of block layers."""
        widths = Counter(x.in_features for x in self.index.layers if x.block and x.kind is LayerKind.LINEAR)
        return widths.most_common(1)[0][0] if widths else max((x.in_features for x in self.index.layers), default=1)


@dataclass(frozen=True, slots=True)
class Search:
    """What the mixed-precision search scores: its size drives the score op's cost and memory."""

    metric: SensitivityMetric
    units: int
    choices: int
    samples: int
    params: int  # of the searched layers
    largest_params: int
    layers: tuple[str, ...]


def _search(ir: RecipeIR, assignment: Assignment) -> Search | None:
    units = search_units(ir, assignment)
    if not units:
        return None
    layers = [assignment.model.layer(n) for u in units for n in u.members]
    mp = ir.mixed_precision
    assert mp is not None  # search units exist only with `mixed_precision`
    return Search(mp.metric, len(units), len(choices_of(ir)), min(mp.samples, sample_count(ir.calibration.data)),
                  sum(x.params for x in layers), max(x.params for x in layers), tuple(x.name for x in layers))


def _dequantized(quantized: list) -> list[int]:
    """The float bytes of the layers an ONNX output carries as DequantizeLinear before a float op, whose
    weights onnxruntime dequantizes while it runs the emitted model. A weight-only MatMul is not among them:
    onnxruntime's optimizer fuses it into MatMulNBits, which computes from the packed weights, in either
    output format (backends/onnx/kernels.py, checked by tests/test_onnx_kernels.py). Only the ONNX cost model
    reads them."""
    return [a.layer.bytes for a in quantized if not (a.layer.op == "MatMul" and a.scheme.activations is None)]


def _integer_kernel_bytes(quantized: list[LayerAssignment]) -> int:
    """The float weights of the layers whose QDQ group onnxruntime's full optimizations fuse into an integer
    kernel (uint8 inputs, 8-bit weights: MatMulIntegerToFloat, QLinearConv, QGemm; backends/onnx/kernels.py),
    which computes from the int8 weights and rebuilds no float copy: a 55M W8A8 decoder's session held 63 MiB
    for its 43 MiB of int8 weights, its W8A16 form 90."""
    return sum(a.layer.bytes for a in quantized if a.scheme.activations is not None
               and a.scheme.activations.qtype is QType.UINT8 and a.scheme.quantized_weights.qtype.bits == 8
               and a.layer.op in ("MatMul", "Conv", "Gemm"))


def observation(assignment: Assignment, passthrough: tuple[str, ...]) -> Observation:
    """What calibration observes for `assignment` (the plan's, or the one a search chose while running), with
    ranges inherited through the `passthrough` ops of the model's graph."""
    index = assignment.model
    quantized = [a for a in assignment.layers if not a.scheme.is_none]
    static = [a for a in quantized if a.scheme.activations and a.scheme.activations.calibrated]
    needed = tuple(dict.fromkeys(a.layer.input for a in static))
    sources = {t: t for t in needed}
    if index.graph is not None and passthrough:
        sources = propagate(index.graph, needed, passthrough)
    gptq_layers = tuple(a.layer.name for a in quantized if a.scheme.rounding is Rounding.GPTQ)
    hessian_inputs = tuple(dict.fromkeys((a.layer.input, a.layer.in_features) for a in quantized
                                         if a.scheme.rounding is Rounding.GPTQ and a.layer.kind is LayerKind.LINEAR))
    return Observation(needed, tuple(dict.fromkeys(sources.values())), tuple(sources.items()), gptq_layers,
                       hessian_inputs)


def workload(ir: RecipeIR, assignment: Assignment, chunk: int | None = None) -> Workload:
    """The workload of a recipe resolved against its model. The last one is kept: `check` asks whether the
    recipe calibrates and the planner then asks for the same workload (a pass over every layer: 0.4 s of
    Qwen3-235B-A22B's 36,473). Both arguments are frozen, so the same objects give the same workload."""
    last = _LAST.get("workload")
    if last is not None and last[0] is ir and last[1] is assignment and last[2] == chunk:
        return last[3]
    made = _workload(ir, assignment, chunk)
    _LAST["workload"] = (ir, assignment, chunk, made)
    return made


_LAST: dict[str, tuple[RecipeIR, Assignment, int | None, Workload]] = {}


def untied_heads(index: ModelIndex) -> list[Layer]:
    """The LM heads that read the input embedding's tensor (tied): a rotation unties them (the final norm folds
    into the head alone), and quantizing one leaves the embedding's float tensor to the embedding."""
    embeddings = {x.weight for x in index.layers if x.kind is LayerKind.EMBEDDING}
    return [x for x in index.layers if x.kind is LayerKind.LINEAR and x.weight in embeddings]


def _emitted_bytes(index: ModelIndex, quantized: list[LayerAssignment], rotated: bool) -> int:
    """The output's weight bytes: the checkpoint's, each quantized layer at its scheme's size. A tied head writes
    a tensor of its own: quantized beside the float embedding it read (which stays), or, rotated, in float. The
    real SmolLM2 (tied) had been planned 129 MiB for a W8A16 folder of 239 (its head quantized) and 165 for a
    rotated NVFP4 one of 273 (its head float)."""
    heads = {x.name for x in untied_heads(index)}
    total = index.total_bytes
    for a in quantized:
        size = quantized_bytes(a.layer, a.scheme)
        total += size if a.layer.name in heads else size - a.layer.bytes
    if rotated:
        done = {a.layer.name for a in quantized}
        total += sum(x.bytes for x in index.layers if x.name in heads and x.name not in done)
        total += sum(x.bytes for x in transposed_ties(index))
    return total


def transposed_ties(index: ModelIndex) -> list[Layer]:
    """An ONNX graph's tied tensors: a layer whose weight another node reads through a Transpose (torch.onnx's head
    reading the embedding's, onnxruntime-genai's embedding gathering from the head's). A rotation gives the other
    reader a float tensor of its own (onnx/rotation.py)."""
    if index.graph is None:
        return []
    by_weight = {x.weight: x for x in index.layers}
    readers = {i for n in index.graph.nodes if n.op in ("Gather", "MatMul", "Gemm") for i in n.inputs}
    return [by_weight[n.inputs[0]] for n in index.graph.nodes
            if n.op == "Transpose" and n.inputs and n.inputs[0] in by_weight and set(n.outputs) & readers]


def _workload(ir: RecipeIR, assignment: Assignment, chunk: int | None) -> Workload:
    index = assignment.model
    quantized = [a for a in assignment.layers if not a.scheme.is_none]
    dequantized = _dequantized(quantized)
    seen = observation(assignment, ir.calibration.passthrough)
    gptq = bool(seen.gptq_layers)
    # searched with their inputs' mean squares: `rounding imatrix`, and learned rounding's start (torch/learned.py)
    imatrix = tuple(a.layer.name for a in quantized
                    if a.scheme.rounding is Rounding.IMATRIX or a.scheme.learned_start_searched)
    learned = [a for a in quantized if a.scheme.learned is not None]
    mp = ir.mixed_precision
    cal = ir.calibration
    ranks = ir.memory.ranks
    verify_samples = ir.verify.samples if ir.verify else 0
    # a format's own scale dtype (GGUF's float16 blocks), which the torch backend rounds with: not the compiled loop's
    scales = ir.emit.format.scale_dtype if ir.emit is not None else None
    batchable = tuple(a.layer.name for a in quantized if a.scheme.rounding is Rounding.GPTQ and a.scheme.gptq_scales_fixed
                      and not a.scheme.quantized_weights.qtype.is_float and not a.scheme.quantized_weights.qtype.is_kquant)
    return Workload(
        every_expert=cal.experts is ExpertRouting.ALL, batchable_gptq_layers=batchable,
        backend=ir.backend, index=index, weights_bytes=index.total_bytes,
        quantized_bytes=_emitted_bytes(index, quantized, rotates(ir)),
        dequantized_bytes=sum(dequantized),
        dequantized_largest=max(dequantized, default=0),
        integer_kernel_bytes=_integer_kernel_bytes(quantized),
        largest_layer_bytes=max((x.bytes for x in index.layers), default=0),
        quantized_layers=tuple(a.layer.name for a in quantized), needed=seen.needed, observed=seen.observed,
        sources=seen.sources, gptq_layers=seen.gptq_layers, hessian_inputs=seen.hessian_inputs,
        calibrate=bool(seen.observed) or gptq or bool(imatrix) or bool(learned) or bool(mp and mp.metric is not SensitivityMetric.SNR)
        or ir.kv_cache is not None or bool(assignment.smoothing),
        gptq=gptq, samples=rank_share(sample_count(cal.data), chunk or cal.chunk, ranks), seqlen=sequence_length(cal.data),
        past=cache_length(cal.data), chunk=chunk or cal.chunk, bins=cal.bins,
        histogram=cal.method.histogram, mixed_precision=mp is not None,
        search=_search(ir, assignment), imatrix_layers=imatrix,
        learned_layers=tuple(a.layer.name for a in learned), learned=_learned_settings(learned),
        kv_cache=ir.kv_cache is not None,
        verify_samples=rank_share(verify_samples, min(cal.chunk, verify_samples), ranks),
        disk=ir.memory.disk is not None, ranks=ranks, attention=cal.attention,
        float_rounded=any(a.scheme.quantized_weights.qtype.is_float for a in quantized),
        kernel_rounded=any(_kernel_rounded(a, scales) for a in quantized),
        kernel_searched=any(a.scheme.rounding is Rounding.MSE and _kernel_rounded(a, scales) for a in quantized),
        float_kernel_rounded=all(_float_kernel_rounded(a) for a in quantized if a.scheme.quantized_weights.qtype.is_float),
        sliced_rounded=any(a.scheme.rounding.data is RoundingData.NONE and not _kernel_rounded(a, scales)
                           and not a.scheme.quantized_weights.qtype.is_float for a in quantized),
        emit_format=ir.emit.format if ir.emit is not None else None,
        kquant_layers=tuple((a.layer.name, a.scheme.quantized_weights.qtype.name) for a in quantized
                            if a.scheme.quantized_weights.qtype.is_kquant),
        nvfp4_layers=tuple(a.layer.name for a in quantized if a.scheme.quantized_weights.qtype is QType.NVFP4),
        cast_nvfp4_layers=_cast_nvfp4(index, quantized),
        fp4_weight_layers=tuple(a.layer.name for a in quantized
                                if a.scheme.quantized_weights.qtype in (QType.NVFP4, QType.MXFP4)),
        fp4_searched_layers=tuple(a.layer.name for a in quantized if a.scheme.searches_fp4_scales),
        fp4_input_elements=sum(a.layer.in_features for a in quantized
                               if a.scheme.activations is not None and a.scheme.activations.qtype.fixed_group),
        quantized_input_width=max((a.layer.in_features for a in quantized
                                   if a.scheme.activations is not None or a.layer.name in imatrix), default=0),
        data_libraries=(DATASET_LIBRARIES if cal.data.kind is DataKind.DATASET else 0)
        + _tokenizer_bytes(cal.data, index.ref),
        reads_dataset=cal.data.kind is DataKind.DATASET,
        templated=bool(cal.data.rows and cal.data.rows.messages),
        transform=ir.transform if assignment.smoothing else None,
        rotated=rotates(ir),
        online_width=_online_width(ir, index),
        rotation_block=(ir.transform.block or 0) if rotates(ir) and ir.transform is not None else 0,
        smoothing=tuple((m.block, m.width, sum(4 * index.layer(x).params for x in m.targets))
                        for m in assignment.smoothing),
        smoothing_observed=tuple(dict.fromkeys(index.layer(m.targets[0]).input for m in assignment.smoothing)),
    )


def _kernel_rounded(a: LayerAssignment, scales: str | None = None) -> bool:
    """Whether the torch backend rounds this layer's weight with the compiled rtn loop, its scales stored in the
    layer's dtype or in `scales`."""
    return fused_rtn.applies(a.scheme.quantized_weights, a.scheme.rounding, scales or a.layer.dtype)


EXPERT_PROJECTION = re.compile(r"\.experts\.\d+\.")  # one expert's projection: `….experts.7.gate_proj`, Mixtral's `….experts.7.w1`


def _cast_nvfp4(index: ModelIndex, quantized: list[LayerAssignment]) -> tuple[str, ...]:
    """The NVFP4 layers rounded with given block scales (Workload.cast_nvfp4_layers)."""
    packed = set(index.packed_experts)
    return tuple(a.layer.name for a in quantized if a.scheme.quantized_weights.qtype is QType.NVFP4
                 and (a.layer.weight in packed or index.experts_split and EXPERT_PROJECTION.search(a.layer.name + ".")))


def _float_kernel_rounded(a: LayerAssignment) -> bool:
    """Whether the torch backend's file-to-file rounding takes this floating-format layer through the compiled loop."""
    return fused_float.applies(a.scheme.quantized_weights, a.layer.dtype, a.layer.shape)


def rank_share(samples: int, chunk: int, ranks: int) -> int:
    """The most samples one of `ranks` ranks runs when chunk i goes to rank i mod ranks (backends/ranks.py)."""
    if ranks <= 1 or samples <= 0:
        return samples
    chunks = math.ceil(samples / max(chunk, 1))
    return min(samples, math.ceil(chunks / ranks) * chunk)


def _learned_settings(learned: list) -> LearnedRounding | None:
    """The learned rounding's cost settings: the most steps and the most samples a step of any of its schemes."""
    settings = [a.scheme.learned for a in learned]
    if not settings:
        return None
    return LearnedRounding(max(s.iters for s in settings), None, max(s.batch for s in settings))


def _online_width(ir: RecipeIR, index: ModelIndex) -> int:
    """The down projections' input width where the recipe's rotation turns it online (`online r4`), else 0."""
    if ir.transform is None or OnlineRotation.R4 not in ir.transform.online:
        return 0
    return next((x.in_features for x in index.layers if x.name.endswith("mlp.down_proj")), 0)
