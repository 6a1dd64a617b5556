"""Outlier-transform mappings resolved against the model: which module's output each one divides by its
scales (a normalisation, or a Linear) and which layers read that output and take the scales into their
weights. Inferred for known block shapes, or written as `map SOURCE -> TARGETS`; every mapping is checked
here, before any work (Q260-Q264), from names, shapes and (ONNX) the graph — no weight is read."""

from __future__ import annotations

import enum
from collections import defaultdict
from dataclasses import dataclass, replace

from compiler.diagnostics import Diagnostic, Diagnostics
from compiler.ir.types import Mapping, RecipeIR, Scheme, Selector, Transform
from compiler.models.index import Layer, LayerKind, ModelIndex, Norm
from compiler.models.names import compress
from compiler.resolve.model_checks import closest_names
from compiler.resolve.selectors import matcher, name_matcher
from compiler.source import Span

# Layers that read an attention block's normalised input, by the last part of their name.
_ATTENTION_INPUTS = frozenset({"q_proj", "k_proj", "v_proj", "qkv_proj", "q_a_proj", "kv_a_proj_with_mqa"})
_MLP_CONTAINERS = ("mlp", "block_sparse_moe", "feed_forward")
_MLP_OUTPUTS = frozenset({"down_proj", "w2"})  # read the MLP's intermediate, not its normalised input
# A Linear whose output another Linear reads channel for channel (through attention, or the gated product).
LINEAR_PAIRS = (("v_proj", "o_proj"), ("up_proj", "down_proj"), ("w3", "w2"))
# SmoothQuant's own: the MLP's gated product into its output projection, whose input carries the largest
# outliers (llm-compressor's default Llama mappings include it; on the real SmolLM2-135M per-token W8A8 at
# alpha 0.5, norms only +1.24% perplexity, with up → down +1.02%). v → o is AWQ's.
_SMOOTHQUANT_PAIRS = (("up_proj", "down_proj"), ("w3", "w2"))
# Families whose named norms sit after the sublayer (their output meets the residual, which a scale would
# change): no normalisation of theirs is a smoothing source.
_POST_NORM_FAMILIES = frozenset({"olmo2", "bert"})


class SourceKind(enum.Enum):
    """What divides its output by the scales."""
    NORM = "norm"  # its per-channel weight (and bias)
    LINEAR = "linear"  # its weight's rows (and bias)


@dataclass(frozen=True, slots=True)
class SmoothingMapping:
    """One resolved mapping: `source`'s output channels are divided by the scales, each target's input
    columns multiplied by them (the float model computes the same)."""
    source: str
    kind: SourceKind
    targets: tuple[str, ...]
    width: int
    block: str | None
    span: Span  # the `map` line, or the `transform` declaration for inferred mappings
    inferred: bool


def resolve_smoothing(ir: RecipeIR, index: ModelIndex, schemes: dict[str, Scheme],
                      diags: Diagnostics) -> tuple[SmoothingMapping, ...]:
    """The transform's mappings on this model (schemes: layer → its final scheme); problems to `diags`."""
    t = ir.transform
    if t is None or t.kind.rotates:  # a rotation has no mappings (resolve/rotation.py checks it)
        return ()
    norms_only = ir.backend_facts.smooths_into_norms_only  # ONNX: into norms, and the gated pairs the graph shows
    found = _written(t, index, norms_only, diags) if t.mappings else _inferred(t, index, norms_only)
    if not found and not t.mappings:
        diags.error("Q260", f"`transform {t.kind.name}` infers no mapping for this `{index.family}` model",
                    t.span, "nothing to smooth", help=_no_inference_help(index))
        return ()
    kept = [m for m in found if _quantized(m, schemes)]  # inferred ones that reach no quantized layer: dropped
    floats = [m.source for m in found if m not in kept and not m.inferred]
    if floats:
        diags.warning("Q263", f"{len(floats)} mapping(s) scale only layers that stay float: "
                      f"{', '.join(compress(floats)[:3])}", t.span, "skipped",
                      help="their targets get no quantized scheme; quantize them, or drop the mapping")
    mixed: list[list[Diagnostic]] = []
    for m in kept:
        local = Diagnostics()
        _check_schemes(m, schemes, local)
        if local.items:
            mixed.append(local.items)
    diags.items += _once(mixed[0], len(mixed)) if mixed else []
    return tuple(kept)


def _quantized(m: SmoothingMapping, schemes: dict[str, Scheme]) -> bool:
    return any(not schemes[x].is_none for x in m.targets)


def _check_schemes(m: SmoothingMapping, schemes: dict[str, Scheme], diags: Diagnostics) -> None:
    """Q262: one set of scales serves every target, so the quantized ones share a scheme (float targets take
    the scales exactly)."""
    by_scheme: dict[tuple, list[str]] = defaultdict(list)
    for x in m.targets:
        s = schemes[x]
        if not s.is_none:
            by_scheme[(s.weights, s.activations, s.rounding)].append(f"{x.rpartition('.')[2]} ({s.name})")
    if len(by_scheme) > 1:
        parts = "; ".join(", ".join(v) for v in by_scheme.values())
        diags.error("Q262", f"the targets of `{m.source}` are quantized with different schemes: {parts}", m.span,
                    "one set of scales for different schemes",
                    help="give them one scheme (a `group` keeps them together), or split them into mappings of "
                    "their own")


def _no_inference_help(index: ModelIndex) -> str:
    if index.family in _POST_NORM_FAMILIES:
        return (f"`{index.family}` normalises after each sublayer, so its norms also feed the residual; write "
                "`map` lines for Linear pairs (e.g. `map \"*.value\" -> \"*.attention.output.dense\"`)")
    return "write `map \"SOURCE\" -> \"TARGET\", …` lines (`qrc inspect MODEL` lists the layers and norms)"


# ---- inferred ------------------------------------------------------------------------------------------
def _inferred(t: Transform, index: ModelIndex, norms_only: bool) -> list[SmoothingMapping]:
    """Norm → the layers it feeds (both methods), and the Linear pairs whose widths match (AWQ: v → o and
    up → down, v → o skipped under grouped-query attention, where v has fewer channels than o reads;
    SmoothQuant: up → down)."""
    out = []
    for norm in index.norms:
        readers = norm_readers(index, norm)
        if readers:
            out.append(SmoothingMapping(norm.name, SourceKind.NORM, tuple(readers), norm.width, norm.block, t.span,
                                        True))
    # a layer-to-layer mapping needs a backend that folds into layers (Q264); on ONNX, the gated product's pair
    # where the graph shows it (`gated_pair`)
    pairs = LINEAR_PAIRS if t.kind.into_linears else _SMOOTHQUANT_PAIRS
    by_name = {x.name: x for x in index.layers}
    for layer in index.layers:
        parent, _, leaf = layer.name.rpartition(".")
        partner = next((b for a, b in pairs if a == leaf), None)
        reader = by_name.get(f"{parent}.{partner}") if partner else None
        if reader is not None and reader.in_features == layer.out_features and \
                (not norms_only or gated_pair(index, layer, reader)):
            out.append(SmoothingMapping(layer.name, SourceKind.LINEAR, (reader.name,), layer.out_features,
                                        layer.block, t.span, True))
    return out


def gated_pair(index: ModelIndex, source: Layer, reader: Layer) -> bool:
    """ONNX: whether `reader` reads `source`'s output through the gated product alone (source's MatMul output read
    by one Mul only, whose output only `reader` reads): dividing source's output channels by s and multiplying
    reader's input rows by s then leaves the model's output unchanged, as an MLP's up → down does."""
    graph = index.graph
    if graph is None:
        return False
    readers: dict[str, list] = {}
    for node in graph.nodes:
        for name in node.inputs:
            readers.setdefault(name, []).append(node)
    made = next((n for n in graph.nodes if n.op == "MatMul" and n.inputs[1:2] == (source.weight,)), None)
    if made is None or len(made.outputs) != 1:
        return False
    products = readers.get(made.outputs[0], [])
    if len(products) != 1 or products[0].op != "Mul" or products[0].inputs.count(made.outputs[0]) != 1:
        return False
    product = products[0].outputs[0]
    return reader.input == product and [n.op for n in readers.get(product, [])] == [reader.op]


def norm_readers(index: ModelIndex, norm: Norm) -> list[str] | None:
    """The layers that read a normalisation's output, when qrc knows them and nothing else reads it (else
    None: not a smoothing source, or a role qrc cannot tell). ONNX: from the graph; otherwise by the block
    shapes transformers names (input_layernorm → attention inputs; the pre-MLP norm → the MLP's inputs,
    routers and experts included)."""
    if index.graph is not None:
        readers = [x.name for x in index.layers if x.input == norm.output]
        others = [n for n in index.graph.nodes if norm.output in n.inputs and n.op not in ("MatMul", "Gemm")]
        return readers if readers and not others else None
    if norm.block is None or index.family in _POST_NORM_FAMILIES:
        return None
    leaf = norm.name.rpartition(".")[2]
    gemma = index.family.startswith("gemma")
    in_block = [x for x in index.layers if x.block == norm.block and x.kind is LayerKind.LINEAR
                and x.in_features == norm.width]
    if leaf == "input_layernorm":
        return [x.name for x in in_block if x.name.rpartition(".")[2] in _ATTENTION_INPUTS] or None
    if leaf == "pre_feedforward_layernorm" or (leaf == "post_attention_layernorm" and not gemma):
        return [x.name for x in in_block if _in_mlp(x, norm.block) and x.name.rpartition(".")[2] not in _MLP_OUTPUTS] \
            or None
    return None


def _in_mlp(layer: Layer, block: str) -> bool:
    return any(layer.name.startswith(f"{block}.{c}.") for c in _MLP_CONTAINERS)


# ---- written: `map SOURCE -> TARGETS` ------------------------------------------------------------------
def _written(t: Transform, index: ModelIndex, norms_only: bool, diags: Diagnostics) -> list[SmoothingMapping]:
    out = []
    for m in t.mappings:
        sources = _sources(m.source, index)
        targets = [[x for x in index.layers if matcher(sel)(x)] for sel in m.targets]
        if not sources:
            _unmatched(m.source, "module", [n.name for n in index.norms] + [x.name for x in index.layers], diags)
        for sel, matched in zip(m.targets, targets, strict=True):
            if not matched:
                _unmatched(sel, "layer", [x.name for x in index.layers], diags)
        if not sources or not all(targets):
            continue
        found: list[Diagnostic] = []
        failed = 0
        for source in sources:
            local = Diagnostics()
            resolved = _one(m, source, [x for group in targets for x in group], index, norms_only, local)
            if resolved is not None:
                out.append(resolved)
            failed += bool(local.items)
            found = found or local.items
        diags.items += _once(found, failed)
    return out


def _once(found: list[Diagnostic], failed: int) -> list[Diagnostic]:
    """The first failing block's diagnostics stand for all of them: one mistake in a `map` line is one error,
    not one per block."""
    if failed <= 1:
        return found
    more = f" (and the same in {failed - 1} other block{'s' if failed > 2 else ''})"
    return [replace(d, message=d.message + more) for d in found]


def _sources(sel: Selector, index: ModelIndex) -> list[Norm | Layer]:
    """Norms, then Linear layers, the source pattern names (by module name)."""
    match = name_matcher(sel)
    norms = [n for n in index.norms if match(n.name)]
    return norms + [x for x in index.layers if x.kind is LayerKind.LINEAR and match(x.name)]


def _unmatched(sel: Selector, what: str, names: list[str], diags: Diagnostics) -> None:
    shown = f'"{sel.pattern}"' if sel.kind.value == "glob" else f're"{sel.pattern}"'
    diags.error("Q260", f"map pattern {shown} matches no {what}", sel.span, f"0 of {len(names)}",
                help="closest names: " + ", ".join(closest_names(sel.pattern, names)))


def _one(m: Mapping, source: Norm | Layer, candidates: list[Layer], index: ModelIndex, norms_only: bool,
         diags: Diagnostics) -> SmoothingMapping | None:
    """One source with the targets in its block, checked: it can absorb a scale, feeds every target, and
    (where qrc knows what reads it) every reader is a target."""
    is_norm = isinstance(source, Norm)
    width = source.width if isinstance(source, Norm) else source.out_features
    targets = [x for x in candidates if x.block == source.block and x.name != source.name]
    if not targets:
        _not_feeding(m, source.name, f"none of the targets lies in its block `{source.block}`", diags)
        return None
    narrow = [x.name for x in targets if x.in_features != width]
    if narrow:
        _not_feeding(m, source.name, f"it has {width} output channels, but {', '.join(compress(narrow)[:2])} "
                     f"read{'s' if len(narrow) == 1 else ''} {index.layer(narrow[0]).in_features}", diags)
        return None
    if isinstance(source, Layer) and norms_only and not (len(targets) == 1 and gated_pair(index, source, targets[0])):
        diags.error("Q264", f"`{source.name}` is a MatMul: the ONNX backend folds scales into normalisation "
                    "weights, and into a MatMul only where its output reaches one other MatMul through the "
                    "gated product (an MLP's up → down)", m.source.span, "cannot absorb the scale here",
                    help="map from a norm, or `up_proj -> down_proj`, on ONNX; or compile the model with "
                    "`backend torch`")
        return None
    if not _feeds_all(m, source, targets, index, diags):
        return None
    kind = SourceKind.NORM if is_norm else SourceKind.LINEAR
    return SmoothingMapping(source.name, kind, tuple(x.name for x in targets), width, source.block, m.span, False)


def _feeds_all(m: Mapping, source: Norm | Layer, targets: list[Layer], index: ModelIndex, diags: Diagnostics) -> bool:
    names = {x.name for x in targets}
    if isinstance(source, Norm):
        readers = norm_readers(index, source)
        if readers is None and (index.graph is not None or index.family in _POST_NORM_FAMILIES):
            code = "Q264" if index.graph is not None else "Q261"  # the graph shows the other reader
            diags.error(code, f"the output of `{source.name}` is also read outside the layers (a residual "
                        "connection): scaling it would change the model", m.source.span, "cannot absorb the scale",
                        help="map from a norm that feeds only Linear layers (a pre-norm block's input norm)")
            return False
        if readers is None:
            return True  # a role qrc cannot tell from names: the run checks the block's float output
    else:
        leaf = source.name.rpartition(".")[2]
        partner = next((b for a, b in LINEAR_PAIRS if a == leaf), None)
        if partner is None:
            return True  # the run checks the block's float output after folding
        readers = [x.name for x in index.layers if x.name == f"{source.name.rpartition('.')[0]}.{partner}"]
    extra = sorted(names - set(readers))
    missing = [x for x in readers if x not in names]
    if extra:
        _not_feeding(m, source.name, f"it does not feed {', '.join(compress(extra)[:2])}", diags)
    if missing:
        diags.error("Q261", f"`{', '.join(compress(missing)[:2])}` also read{'s' if len(missing) == 1 else ''} "
                    f"`{source.name}`: left out of the targets, its input would change", m.span, "incomplete mapping",
                    help="add it to the targets (every layer that reads the source takes the scales)")
    return not extra and not missing


def _not_feeding(m: Mapping, source: str, why: str, diags: Diagnostics) -> None:
    diags.error("Q261", f"`{source}` does not feed the mapping's targets: {why}", m.span, "source and targets "
                "do not match", help="a mapping's source is the norm or Linear whose output the targets read, "
                "in the same block")


def mapping_rows(mappings: tuple[SmoothingMapping, ...]) -> list[tuple[str, str, str, str]]:
    """The mappings as `qrc inspect` and the report show them: (source, kind, targets, how it was found)."""
    return [(m.source, m.kind.value, ", ".join(compress(list(m.targets))), "inferred" if m.inferred else
             f"map, line {m.span.line}") for m in mappings]
