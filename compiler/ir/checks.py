"""Checks that need the whole recipe but no model. Each `check_*` adds diagnostics; CHECKS orders them."""

from __future__ import annotations

from compiler.diagnostics import Diagnostic, Diagnostics, did_you_mean, error
from compiler.ir.elaborate import undefined_scheme_help
from compiler.ir.patterns import PatternError, alternations, check_regex, glob_to_regex
from compiler.ir.schemes import NONE, PRESETS
from compiler.ir.types import (
    AttentionKernel,
    MemoryMode,
    QType,
    RecipeIR,
    SelectorKind,
)
from compiler.safe_files import unnameable
from compiler.source import Span

LAYER_TYPES = ("Linear", "MatMul", "Gemm", "Conv", "Embedding")


def _pattern_span(span: Span, prefix: int, offset: int) -> Span:
    """The character of a pattern at `offset`, inside its quoted literal (`prefix` = 1 for "…", 3 for re"…")."""
    start = span.start + prefix + offset
    return span.source.span(start, min(start + 1, span.end))


def check_selectors(ir: RecipeIR, diags: Diagnostics) -> None:
    """Patterns and regexes that cannot match anything, whatever the model."""
    mapped = [sel for m in (ir.transform.mappings if ir.transform else ()) for sel in (m.source, *m.targets)]
    for sel in [s for rule in ir.rules for s in rule.selectors] + mapped:
        if sel.kind is SelectorKind.TYPE and sel.pattern not in LAYER_TYPES:
            diags.error("Q228", f"unknown layer type `{sel.pattern}`", sel.span, "not a layer type",
                        help=did_you_mean(sel.pattern, LAYER_TYPES))
        elif sel.kind is SelectorKind.GLOB:
            _check_glob(sel.pattern, sel.span, diags)
        elif sel.kind is SelectorKind.REGEX:
            try:
                check_regex(sel.pattern)
            except PatternError as exc:
                diags.error("Q213", f"invalid regex: {exc.message}", _pattern_span(sel.span, 3, exc.offset),
                            "here", help="regexes use Python syntax and must match the whole layer name")


def _check_glob(pattern: str, span: Span, diags: Diagnostics) -> bool:
    try:
        glob_to_regex(pattern)
    except PatternError as exc:
        where = _pattern_span(span, 1, exc.offset) if pattern else span
        diags.error("Q214", f"invalid pattern: {exc.message}", where, "here",
                    help="globs use `*` (any run, dots included), `?` (one character) and `{a,b}`")
        return False
    return True


def check_groups(ir: RecipeIR, diags: Diagnostics) -> None:
    """Group declarations that are malformed."""
    for group in ir.groups:
        if group.pattern is None or not _check_glob(group.pattern, group.span, diags):
            continue
        found = alternations(group.pattern)
        if len(found) != 1 or len(found[0][2]) < 2:
            diags.error("Q212", f'group pattern "{group.pattern}" needs exactly one `{{…}}` with the members',
                        group.span, f"{len(found)} alternation(s)",
                        help='the part that differs between members goes in braces: '
                        '"*.self_attn.{q,k,v}_proj"; or write `group auto qkv`')


def check_scheme_use(ir: RecipeIR, diags: Diagnostics) -> None:
    """Schemes declared and never used."""
    used = {r.scheme for r in ir.rules}
    if ir.mixed_precision:
        used.update(ir.mixed_precision.choices)
    used.update(s.base for s in ir.schemes if s.base)
    for scheme in ir.schemes:
        if scheme.span is not None and scheme.name not in used:
            diags.warning("Q240", f"scheme `{scheme.name}` is never used", scheme.span, "unused",
                          help="name it in a `quantize` rule or in `mixed_precision { choices [...] }`, "
                          "or remove it")
    if not ir.rules:
        diags.warning("Q241", "the recipe quantizes nothing: there are no `quantize` rules", ir.span,
                      "no rules", help='add `quantize { "*" -> SCHEME }`')


def refuse_attention_kernel(ir: RecipeIR, diags: Diagnostics, where: str) -> None:
    """Q270: `calibrate { attention … }` picks a transformers model's attention kernel, which `where` (an
    exported graph, a built-in model: the backends say which they run) does not have: it has its own."""
    if ir.calibration.attention is AttentionKernel.MODEL:
        return
    diags.error("Q270", f"`attention {ir.calibration.attention.value}` chooses a transformers model's attention; "
                f"{where} has its own", ir.calibration.span_of("attention") or ir.span, "no kernel to choose",
                help="remove it, or compile a transformers folder with `backend torch`")


def check_mixed_precision(ir: RecipeIR, diags: Diagnostics) -> None:
    """The mixed-precision block: choices, budget and metric."""
    mp = ir.mixed_precision
    if mp is None or not mp.choices:
        return
    span = mp.span_of("choices")
    known = {s.name: s for s in ir.schemes}
    schemes = []
    for name in dict.fromkeys(mp.choices):
        if name == NONE.name:
            diags.error("Q223", "`none` cannot be a mixed-precision choice", span, "none in choices",
                        help="choices are quantized schemes; layers that stay float get `-> none` in `quantize`")
        elif name not in known:
            diags.error("Q203", f"no scheme named `{name}`", span, "undefined scheme",
                        help=undefined_scheme_help(name, [*known, *PRESETS]))
        else:
            schemes.append(known[name])
    if len(dict.fromkeys(mp.choices)) < 2:
        diags.error("Q223", "mixed precision needs at least two different choices", span, "nothing to choose",
                    help="e.g. `choices [w4, w8]`")
    if len(schemes) < 2 or not mp.budget_bits:
        return
    bits = sorted(s.quantized_weights.qtype.bits for s in schemes)
    if mp.budget_bits < bits[0]:  # storage bits (with scales) are checked against the model, Q229/Q243
        diags.error("Q224", f"budget {mp.budget_bits:g} bits is below the narrowest choice ({bits[0]} bits)",
                    mp.span_of("budget"), "cannot be met", help=f"give a budget between {bits[0]} and {bits[-1]} bits")


def unshared(ir: RecipeIR) -> tuple[str, Span] | None:
    """What torchrun's ranks cannot share yet in this recipe (and where it is written), or None: the torch
    backend shares calibration, the mixed-precision search, AWQ and SmoothQuant, GPTQ, the KV cache,
    verification (backends/torch/sharing.py) and the rounding of safetensors and GGUF outputs, the ONNX backend
    its calibration in every mode, AWQ and SmoothQuant, the mixed-precision search and rounding (an HF folder is
    exported once per machine); multi_gpu placement runs in one process, and learned rounding too."""
    if ir.memory.mode is MemoryMode.MULTI_GPU:
        return "mode multi_gpu", ir.memory.span_of("mode") or ir.span
    # each rank holds its own share of the calibration samples: learned rounding would learn a different rounding
    # on each (its steps' gradients are not summed over the ranks yet)
    learned = next((s for s in ir.used_schemes if s.learned is not None), None)
    if learned is not None:
        return f"rounding {learned.rounding.name}", learned.span or ir.span
    return None


def unshared_error(ir: RecipeIR, ranks: int) -> Diagnostic | None:
    """Q431 for what `ranks` processes cannot share in this recipe (None: nothing, or one process)."""
    found = unshared(ir) if ranks > 1 else None
    if found is None:
        return None
    what, span = found
    return error("Q431", f"`{what}` cannot be shared by {ranks} ranks yet", span, "not shared over ranks",
                 help="torchrun's ranks share calibration, GPTQ, the KV cache and verification; drop `ranks` (and "
                 "run without torchrun), or remove this")


def check_ranks(ir: RecipeIR, diags: Diagnostics) -> None:
    """`memory { ranks N }` on what the ranks cannot share (Q431), before anything is launched."""
    found = unshared_error(ir, ir.memory.ranks)
    if found is not None:
        diags.items.append(found)

def check_fp4_input_method(ir: RecipeIR, diags: Diagnostics) -> None:
    """Q269: NVFP4's global input scale is set from the inputs' range; mse and layerwise_percentile search a
    clipping range against an integer grid, which NVFP4 inputs (rounded per block at run time) do not have."""
    method = ir.calibration.method
    if not method.grid_search:
        return
    for scheme in ir.used_schemes:
        act = scheme.activations
        if act is not None and act.qtype is QType.NVFP4:
            diags.error("Q269", f"scheme `{scheme.name}`: NVFP4 inputs take their global scale from the inputs' "
                        f"range, which `method {method.name}` does not give", ir.calibration.span_of("method") or ir.span,
                        "no grid to search", help="use `method minmax` (llm-compressor's static_minmax), "
                        "`percentile P` or `entropy`")
            return


def check_paths(ir: RecipeIR, diags: Diagnostics) -> None:
    """Q114: a path in the recipe that no file can have (a name past the file system's 255 bytes, a path past
    4096, a NUL byte) is refused where it is written, before anything asks the system about it."""
    data = ir.calibration.data
    paths = [(ir.model.split(":", 1)[1] if ir.model.startswith("package:") else ir.model, ir.model_span, "model"),
             (data.path, data.span_of("data"), "data"), (data.tokenizer, data.span_of("tokenizer"), "tokenizer"),
             (ir.memory.disk, ir.memory.span_of("disk"), "disk"),
             (ir.emit.path if ir.emit else None, ir.emit.span_of("path") if ir.emit else None, "emit")]
    for path, span, what in paths:
        problem = unnameable(path) if path and not path.startswith("builtin:") else None
        if problem:
            diags.error("Q114", f"{what} path: {problem}", span or ir.span, "no file can have this path",
                        help="give the path of a file or folder that exists (or, for an output, one that can)")


def check_disk_in_memory(ir: RecipeIR, diags: Diagnostics) -> None:
    """Q453 (a warning) where `memory { disk }` lies on a file system held in memory: what the plan puts there as
    disk takes RAM (ram_folders.py)."""
    from compiler.ram_folders import memory_filesystem

    disk = ir.memory.disk
    kind = memory_filesystem(disk) if disk and not unnameable(disk) else None
    if kind is not None:
        diags.warning("Q453", f"`memory {{ disk }}` (`{disk}`) is on a {kind}: what the run writes there (block "
                      "caches, resume states, copies of the model) is held in RAM, beside the planned peak",
                      ir.memory.span_of("disk") or ir.span, f"a {kind} is memory",
                      help="give `disk` a folder on a disk; the plan counts what goes there as disk")


# Run in this order after elaboration.
# the backend's own checks of the recipe (the emit format, what it refuses) run after these: BackendSpec.check_text
CHECKS = (check_paths, check_selectors, check_groups, check_scheme_use, check_mixed_precision, check_ranks,
          check_fp4_input_method, check_disk_in_memory)


def run_checks(ir: RecipeIR, diags: Diagnostics) -> None:
    """Every model-free check, in order."""
    for check in CHECKS:
        check(ir, diags)
