"""Checks of a recipe against a model: patterns that match nothing, shadowed rules, schemes a layer cannot take."""

from __future__ import annotations

import difflib
import math
import re
from collections import defaultdict
from collections.abc import Callable

from compiler.diagnostics import Diagnostics
from compiler.ir.types import Granularity, RecipeIR, Rounding, Scheme, SelectorKind
from compiler.models.index import LayerKind
from compiler.models.names import compress
from compiler.resolve.assignment import Assignment, LayerAssignment, rule_matches


def check_unmatched_selectors(ir: RecipeIR, assignment: Assignment, diags: Diagnostics) -> None:
    """Q201: selectors that match no layer of the model."""
    layers = assignment.model.layers
    for rule in ir.rules:
        for selector, matched in zip(rule.selectors, rule_matches(rule, layers), strict=True):
            if matched:
                continue
            if selector.kind is SelectorKind.TYPE:
                kinds = sorted({layer.kind.value for layer in layers} | {layer.op for layer in layers})
                hint = f"this model has: {', '.join(kinds)}"
            else:
                hint = "closest names: " + ", ".join(closest_names(selector.pattern, [x.name for x in layers]))
            diags.error("Q201", f"pattern {_shown(selector)} matches no layer", selector.span,
                        f"0 of {len(layers)} layers", help=hint)


def _shown(selector) -> str:
    return {SelectorKind.GLOB: f'"{selector.pattern}"', SelectorKind.REGEX: f're"{selector.pattern}"'}.get(
        selector.kind, f"`type {selector.pattern}`")


def closest_names(pattern: str, names: list[str], n: int = 3) -> list[str]:
    """Layer names most like a pattern, one per name shape (`layers.0` and `layers.7` count once)."""
    literal = re.sub(r"[*?{}\\^$()|+]", "", pattern)
    scored = sorted(names, key=lambda name: -difflib.SequenceMatcher(None, literal, name).ratio())
    picked, shapes = [], set()
    for name in scored:
        shape = re.sub(r"\d+", "N", name)
        if shape not in shapes:
            shapes.add(shape)
            picked.append(name)
        if len(picked) == n:
            break
    return picked


def check_shadowed_rules(ir: RecipeIR, assignment: Assignment, diags: Diagnostics) -> None:
    """Q202: rules that never win for any layer."""
    won = {a.rule.index for a in assignment.layers if a.rule is not None}
    for rule in ir.rules:
        matched = {layer.name for sel in rule_matches(rule, assignment.model.layers) for layer in sel}
        if not matched or rule.index in won:
            continue
        later = sorted({a.rule.span.line for a in assignment.layers if a.layer.name in matched and a.rule})
        diags.warning("Q202", f"rule {rule.index} never wins: later rules take all {len(matched)} layers it matches",
                      rule.span, "shadowed", help=f"overridden by the rule(s) at line(s) {', '.join(map(str, later))}; "
                      "remove this rule or move it after them (the last matching rule wins)")


# A layer × scheme's misfit codes, and a code's (message, help) for the layers of one rule that have it
Misfits = Callable[[LayerAssignment], list[str]]
MisfitText = Callable[[str, Scheme, list[str], Assignment], tuple[str, str]]


def report_misfits(ir: RecipeIR, assignment: Assignment, diags: Diagnostics, misfits: Misfits,
                   text: MisfitText) -> None:
    """One error per rule and misfit code, at the rule's scheme, naming the layers it gives that scheme: the
    shared form of the checks below and of a backend's own (compiler/backends/onnx/layer_checks.py)."""
    problems: dict[tuple[int, str], list[str]] = defaultdict(list)
    rules = {}
    for a in assignment.layers:
        if a.rule is None or a.scheme.is_none:
            continue
        rules[a.rule.index] = a.rule
        for code in misfits(a):
            problems[(a.rule.index, code)].append(a.layer.name)
    for (index, code), names in sorted(problems.items()):
        rule = rules[index]
        scheme = ir.scheme(rule.scheme)
        message, help_ = text(code, scheme, names, assignment)
        diags.error(code, message, rule.scheme_span, f"rule {index} gives `{scheme.name}`", help=help_)


def check_scheme_fits_layers(ir: RecipeIR, assignment: Assignment, diags: Diagnostics) -> None:
    """Schemes a layer cannot take whatever the backend (group sizes, activations on embeddings, weights that are
    not float); what one backend refuses is its own check."""
    report_misfits(ir, assignment, diags, _misfits, _misfit_text)


_FLOAT_WEIGHTS = ("float32", "float16", "bfloat16", "float64")


def rounds_float_weights(a: LayerAssignment) -> bool:
    """Whether the layer's weight is a float tensor with elements (else Q249, and nothing else about it matters)."""
    return a.layer.dtype in _FLOAT_WEIGHTS and a.layer.params > 0


def _misfits(a: LayerAssignment) -> list[str]:
    layer, w = a.layer, a.scheme.quantized_weights
    if not rounds_float_weights(a):
        return ["Q249"]  # nothing else about it matters
    found = []
    if w.granularity is Granularity.GROUP and w.group_size:
        length = layer.out_features if layer.kind is LayerKind.EMBEDDING else layer.in_features
        if length % w.group_size:
            found.append("Q235")
    act = a.scheme.activations
    if act is not None and layer.kind is LayerKind.EMBEDDING:
        found.append("Q236")
    elif act is not None and act.granularity is Granularity.GROUP and act.group_size and layer.in_features % act.group_size:
        found.append("Q268")
    return found


def _group_help(sizes: list[int], current: int) -> str:
    """Group sizes that divide every one of `sizes` (powers of two from 16, as kernels want), or the advice
    to give these layers another scheme when none does."""
    common = math.gcd(*sizes)
    fitting = [g for g in (256, 128, 64, 32, 16) if common % g == 0 and g != current]
    if len(fitting) > 1:
        others = ", ".join(f"`group {g}`" for g in fitting[1:3])
        return f"`group {fitting[0]}` divides them (so do {others}), or give these layers another scheme"
    if fitting:
        return f"`group {fitting[0]}` divides them, or give these layers another scheme"
    return (f"no power-of-two group of 16 or more divides {', '.join(map(str, sizes))}: give these layers a "
            "per-channel scheme or `-> none`")


def _misfit_text(code: str, scheme, names: list[str], assignment: Assignment) -> tuple[str, str]:
    layers = [assignment.model.layer(n) for n in names]
    listed = ", ".join(compress(names)[:4])
    if code == "Q235":
        sizes = sorted({x.out_features if x.kind is LayerKind.EMBEDDING else x.in_features for x in layers})
        return (f"`group {scheme.quantized_weights.group_size}` does not divide the input features of {len(names)} "
                f"layer{'s' if len(names) != 1 else ''}: {listed} (features: {', '.join(map(str, sizes))})",
                _group_help(sizes, scheme.quantized_weights.group_size))
    if code == "Q268":
        sizes = sorted({x.in_features for x in layers})
        return (f"`{scheme.name}` quantizes inputs in groups of {scheme.activations.group_size}, which do not divide "
                f"the input features of {listed} (features: {', '.join(map(str, sizes))}): compressed-tensors' "
                "forward, which transformers runs, splits each input row into whole groups and fails there",
                "give these layers a scheme with per-token inputs (e.g. `FP8_DYNAMIC`) or `-> none`")
    if code == "Q249":
        kinds = ", ".join(sorted({f"{x.dtype} {'x'.join(map(str, x.shape))}" for x in layers}))
        return (f"{listed}: weights qrc cannot round ({kinds}): already quantized, or empty",
                "qrc rounds float weights with elements; give these layers `-> none`")
    assert code == "Q236", code
    return (f"`{scheme.name}` quantizes activations, but {listed}: Embedding layer(s) whose input is token ids",
            "give embeddings a weight-only scheme (e.g. W8A16) or `none`")


def check_gptq_rows(ir: RecipeIR, assignment: Assignment, diags: Diagnostics) -> None:
    """Q255: GPTQ layers whose Hessian (K×K, from calibration tokens) has fewer than 2·K rows: rank-deficient
    below K and poorly determined up to about 2·K, so GPTQ fits the calibration tokens and can round held-out
    inputs worse than rtn. Measured: a random Qwen2 with 1408-input down projections, 512 tokens: cosine
    0.936 against rtn's 0.955, 2048 tokens: 0.963; a random 16-layer Llama with 5632-input ones, 6144
    tokens: 0.807 against rtn's 0.827 (bench/onnx_large_decoder.py)."""
    from compiler.data.batches import sequence_length

    tokens = ir.calibration.data.samples * sequence_length(ir.calibration.data)
    starved = [a.layer for a in assignment.layers if a.scheme.rounding is Rounding.GPTQ and not a.scheme.is_none
               and a.layer.kind is LayerKind.LINEAR and 2 * a.layer.in_features > tokens]
    if not starved:
        return
    widest = max(x.in_features for x in starved)
    seqlen = max(1, sequence_length(ir.calibration.data))
    layers = f"{len(starved)} layers with up to" if len(starved) > 1 else "1 layer with"
    state = "rank-deficient" if widest > tokens else "poorly determined"
    diags.warning("Q255", f"GPTQ rounds {layers} {widest} inputs from {tokens} calibration tokens, fewer than "
                  f"twice the inputs: {'their Hessians are' if len(starved) > 1 else 'its Hessian is'} {state} "
                  f"({', '.join(compress([x.name for x in starved])[:2])})",
                  ir.calibration.data.span_of("data") or ir.calibration.span_of("data") or ir.span, "too few tokens",
                  help=f"calibrate with at least {-(-2 * widest // seqlen)} samples of {seqlen} tokens (twice the "
                  "widest input), or round these layers with rtn or mse")


CHECKS = (check_unmatched_selectors, check_shadowed_rules, check_scheme_fits_layers, check_gptq_rows)


def run(ir: RecipeIR, assignment: Assignment, diags: Diagnostics) -> None:
    """Every check against the model, in order."""
    for check in CHECKS:
        check(ir, assignment, diags)
