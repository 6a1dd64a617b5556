"""Schemes: the built-in presets and `none`, and elaboration of `scheme` declarations."""

from __future__ import annotations

import functools
import math
from dataclasses import replace

from compiler.diagnostics import Diagnostics, did_you_mean, expected_help
from compiler.ir.types import (
    NONE,
    ActivationMode,
    ActivationQuant,
    BackendFacts,
    Granularity,
    KvCache,
    LearnedRounding,
    QType,
    Rounding,
    Scheme,
    WeightQuant,
)
from compiler.ir.values import keyed_settings, whole_number
from compiler.plugins import QTYPES, ROUNDINGS
from compiler.syntax import ast

_W8 = WeightQuant(QType.INT8, Granularity.PER_CHANNEL, None, True)
_A8 = ActivationQuant(QType.INT8, Granularity.PER_TENSOR, False, ActivationMode.STATIC)
# compressed-tensors' W8A8 (and INT8): each token's inputs rounded symmetrically at run time. A real model's
# activation outliers break one static range per tensor (SmolLM2-135M: +48% perplexity static against +3%
# per token, bench/results/real_quality.md); static ranges stay an explicit choice (`W8A8_STATIC`).
_A8_TOKEN = ActivationQuant(QType.INT8, Granularity.PER_TOKEN, True, ActivationMode.DYNAMIC)
_FP8_TOKEN = ActivationQuant(QType.FP8, Granularity.PER_TOKEN, True, ActivationMode.DYNAMIC)
# Named as the field names them (compressed-tensors' and llm-compressor's presets): the FP8 family (static
# per-tensor; per-channel weights with dynamic per-token inputs; DeepSeek-style 128x128 blocks with dynamic
# inputs in groups of 128), and the 4-bit floating formats' weight-only forms.
PRESETS = {
    "W4A16": Scheme("W4A16", WeightQuant(QType.INT4, Granularity.GROUP, 128, True), None, Rounding.RTN),
    "W8A16": Scheme("W8A16", _W8, None, Rounding.RTN),
    "W8A8": Scheme("W8A8", _W8, _A8_TOKEN, Rounding.RTN),
    "W8A8_STATIC": Scheme("W8A8_STATIC", _W8, _A8, Rounding.RTN),
    "FP8": Scheme("FP8", WeightQuant(QType.FP8, Granularity.PER_TENSOR, None, True),
                  ActivationQuant(QType.FP8, Granularity.PER_TENSOR, True, ActivationMode.STATIC), Rounding.RTN),
    "FP8_DYNAMIC": Scheme("FP8_DYNAMIC", WeightQuant(QType.FP8, Granularity.PER_CHANNEL, None, True), _FP8_TOKEN,
                          Rounding.RTN),
    "FP8_BLOCK": Scheme("FP8_BLOCK", WeightQuant(QType.FP8, Granularity.BLOCK, None, True, (128, 128)),
                        ActivationQuant(QType.FP8, Granularity.GROUP, True, ActivationMode.DYNAMIC, 128), Rounding.RTN),
    "NVFP4A16": Scheme("NVFP4A16", WeightQuant(QType.NVFP4, Granularity.GROUP, 16, True), None, Rounding.RTN),
    "MXFP4A16": Scheme("MXFP4A16", WeightQuant(QType.MXFP4, Granularity.GROUP, 32, True), None, Rounding.RTN),
    "MXFP8A16": Scheme("MXFP8A16", WeightQuant(QType.MXFP8, Granularity.GROUP, 32, True), None, Rounding.RTN),
    # W4A4 floating formats: inputs rounded per block at run time like the weights (NVFP4's blocks of 16 under
    # a global input scale calibration fixes; MXFP4's blocks of 32 with e8m0 scales), and compressed-tensors'
    # W4AFP8: int4 weights in groups of 128 with dynamic FP8 inputs per token
    "NVFP4": Scheme("NVFP4", WeightQuant(QType.NVFP4, Granularity.GROUP, 16, True),
                    ActivationQuant(QType.NVFP4, Granularity.GROUP, True, ActivationMode.DYNAMIC, 16), Rounding.RTN),
    "MXFP4": Scheme("MXFP4", WeightQuant(QType.MXFP4, Granularity.GROUP, 32, True),
                    ActivationQuant(QType.MXFP4, Granularity.GROUP, True, ActivationMode.DYNAMIC, 32), Rounding.RTN),
    "W4AFP8": Scheme("W4AFP8", WeightQuant(QType.INT4, Granularity.GROUP, 128, True), _FP8_TOKEN, Rounding.RTN),
}
# What a fresh `weights …` spec means before its items refine it (activations: `default_activations`).
DEFAULT_WEIGHTS = _W8



@functools.cache
def presets(facts: BackendFacts) -> dict[str, Scheme]:
    """The presets as the backend writes them: integer activations in the type its runtime fuses (uint8 on
    ONNX); where it holds static ranges only (QDQ, onnxruntime's `quantize_static` form), `W8A8` is the static
    preset."""
    a8 = default_activations(facts)
    if a8 == _A8 and not facts.static_activations_only:
        return PRESETS
    return {name: (replace(s, activations=a8) if s.activations in (_A8, _A8_TOKEN) else s)
            for name, s in PRESETS.items()}


def default_activations(facts: BackendFacts) -> ActivationQuant:
    """What `activations …` starts from before its items refine it."""
    return _A8 if facts.activation_qtype is _A8.qtype else replace(_A8, qtype=facts.activation_qtype)

_WEIGHT_GRANULARITIES = {"per_tensor", "per_channel"}
_ACTIVATION_GRANULARITIES = {"per_tensor", "per_token"}


def elaborate_scheme(decl: ast.SchemeDecl, known: dict[str, Scheme], facts: BackendFacts,
                     diags: Diagnostics) -> Scheme | None:
    """A `scheme` declaration → Scheme, refining its base (`= PRESET`, as the backend writes it) when it has one."""
    base = _base(decl, known, presets(facts), diags)
    if decl.base is not None and base is None:
        return None
    weights = base.weights if base else None
    activations = base.activations if base else None
    weight_items = decl.bare_items + tuple(i for s in decl.specs if s.role == "weights" for i in s.items)
    if weight_items or any(s.role == "weights" for s in decl.specs):
        weights = _weights(weight_items, weights or DEFAULT_WEIGHTS, diags)
    for spec in (s for s in decl.specs if s.role == "activations"):
        activations = None if spec.is_none else _activations(spec.items, activations or default_activations(facts), diags)
    _check_single(decl.specs, diags)
    kinds = tuple(k for k in decl.rounding if k.kind not in ("act_order", "group_scales", "scale_search"))
    rounding = _rounding(kinds, base.rounding if base else Rounding.RTN, diags)
    act_order = _act_order(decl.rounding, rounding, base, diags)
    # a base's static_groups carries over where it was chosen, not where its act_order implied it
    static_groups = _static_groups(decl.rounding, rounding, act_order,
                                   bool(base and base.static_groups and not base.act_order), diags)
    mse_scales = _scale_search(decl.rounding, rounding, base, diags)
    learned = _learned(decl.rounding_options, rounding, base, diags)
    if weights is not None and rounding is Rounding.AUTOROUND:
        _check_learned(decl, weights, diags)
    if weights is not None and rounding.float_zero_points:
        _check_float_zero_points(decl, weights, activations, rounding, diags)
    if weights is not None:
        _check_floats(decl, weights, activations, rounding, diags)
        other_grid = (static_groups and not act_order) or not mse_scales  # act_order implies static_groups
        # FP4 blocks take their scales from the float weight before the column loop (by its ranges with
        # `minmax_scales`, searched with the Hessian's diagonal by default): never from updated columns
        chosen = next((k for k in decl.rounding if k.kind == "group_scales"), None)
        if weights.qtype.is_float and rounding is Rounding.GPTQ and chosen is not None:
            diags.error("Q256", f"scheme `{decl.name.value}`: GPTQ rounds {weights.qtype.name} onto block scales "
                        "taken from the float weight before the column loop", chosen.span,
                        "no other scales", help=f"drop `{chosen.value}`; `minmax_scales` takes the blocks' ranges, "
                        "`mse_scales` (the default) searches them")
        if weights.qtype.is_kquant and rounding is Rounding.GPTQ and other_grid:
            diags.error("Q256", f"scheme `{decl.name.value}`: {weights.qtype.name}'s grid is llama.cpp's imatrix "
                        "search of the float weight, before GPTQ rounds onto it", decl.name.span,
                        "no other grid", help="drop `static_groups` and `minmax_scales`")
    if weights is None:
        diags.error("Q206", f"scheme `{decl.name.value}` quantizes no weights", decl.name.span, "no `weights`",
                    help="add e.g. `weights int8 per_channel symmetric`, or refine a preset: "
                    f"`scheme {decl.name.value} = W8A16 {{ … }}`")
        return None
    base_name = decl.base.value if decl.base else None
    return Scheme(decl.name.value, weights, activations, rounding, base_name, decl.name.span, act_order,
                  static_groups, mse_scales, learned)


def _learned(options: ast.RoundingOptions | None, rounding: Rounding, base: Scheme | None,
             diags: Diagnostics) -> LearnedRounding | None:
    """`rounding autoround { iters N  lr X  batch B }`: the learned rounding's settings (a scheme refining an
    autoround scheme keeps the settings it does not give); settings after a rounding that reads none are Q107."""
    found = keyed_settings(options.settings if options is not None else (), rounding.settings,
                           f"rounding {rounding.name}", diags, f"`rounding {rounding.name}` takes no settings; drop the braces")
    if rounding is not Rounding.AUTOROUND:
        return None
    inherited = base.learned if base is not None and base.learned is not None else LearnedRounding()
    iters = _count(found.get("iters"), "`iters`", diags)
    batch = _count(found.get("batch"), "`batch`", diags)
    lr = found.get("lr")
    rate = inherited.lr
    if lr is not None:
        value = lr.value
        if not isinstance(value, ast.Number) or not math.isfinite(value.value) or not 0 < value.value <= 1:
            diags.error("Q274", "`lr` must be a number in (0, 1]", lr.span, "not a learning rate",
                        help="write e.g. `lr 0.005` (the default is 1 / iters, AutoRound's)")
        else:
            rate = value.value
    return LearnedRounding(iters or inherited.iters, rate, batch or inherited.batch)


def _count(setting: ast.Setting | None, what: str, diags: Diagnostics) -> int | None:
    """A whole-number setting (None when absent or invalid: the default stands)."""
    if setting is None:
        return None
    if not isinstance(setting.value, ast.Number):
        diags.error("Q217", f"{what} must be a positive whole number", setting.span, "expected a number",
                    help=f"write e.g. `{what.strip('`')} 8`")
        return None
    return whole_number(setting.value, what, diags)


def _check_learned(decl: ast.SchemeDecl, w: WeightQuant, diags: Diagnostics) -> None:
    """Learned rounding rounds onto an integer grid in groups or per channel (what its offsets and clipping
    factors are learned for): not one scale per tensor or 2-D blocks. The floating formats and the K-quants, which
    round by their own rules, are Q256's."""
    if w.qtype.is_float or w.qtype.is_kquant or w.granularity in (Granularity.GROUP, Granularity.PER_CHANNEL):
        return
    problem = f"{w.granularity.value} weights have no per-group range to clip"
    diags.error("Q274", f"scheme `{decl.name.value}`: `rounding autoround` learns integer rounding per group or "
                f"channel; {problem}", decl.name.span, "cannot learn its rounding",
                help="use integer weights in groups or per channel (e.g. `W4A16 { group 64 }`), or another rounding")


def _check_float_zero_points(decl: ast.SchemeDecl, w: WeightQuant, a: ActivationQuant | None, rounding: Rounding,
                             diags: Diagnostics) -> None:
    """A rounding whose zero points are floats (`rounding hqq`) is for what MatMulNBits stores that way: 4-bit
    integer weights in groups with a zero point each, weight-only. Elsewhere the zero point would be rounded to an
    integer and its gain lost (the floating formats are Q256's)."""
    if w.qtype.is_float or w.qtype.is_kquant:
        return
    problem = None
    if w.qtype.bits != 4 or w.granularity is not Granularity.GROUP:
        problem = f"{w.qtype.name} {w.granularity.value} weights"
    elif w.symmetric:
        problem = "symmetric weights (no zero point to optimise)"
    elif a is not None:
        problem = "activations quantized too (MatMulNBits is weight-only)"
    if problem is not None:
        diags.error("Q277", f"scheme `{decl.name.value}`: `rounding {rounding.name}` finds a float zero point for "
                    f"each group of 4-bit weights (MatMulNBits stores it so), not {problem}", decl.name.span,
                    "no float zero points here",
                    help="write e.g. `W4A16 { group 64  asymmetric  rounding hqq }`, or `rounding mse` (integer "
                    "zero points)")


_KV_DEFAULT = ActivationQuant(QType.FP8, Granularity.PER_TENSOR, True, ActivationMode.STATIC)


def elaborate_kv_cache(decl: ast.KvCacheDecl | None, diags: Diagnostics) -> KvCache | None:
    """`kv_cache { fp8 }` → KvCache: FP8 keys and values with one static scale each per attention module
    (what vLLM's compressed-tensors loader takes); Q256 for any other setting."""
    if decl is None:
        return None
    quant = _activations(decl.items, _KV_DEFAULT, diags)
    if quant != _KV_DEFAULT:
        diags.error("Q256", "the KV cache is `fp8 per_tensor symmetric static` here", decl.span, "cannot be stored",
                    help="write `kv_cache { fp8 }` (per-head scales and integer caches are not built yet)")
    return KvCache(quant, decl.span)


def _base(decl: ast.SchemeDecl, known: dict[str, Scheme], builtin: dict[str, Scheme],
          diags: Diagnostics) -> Scheme | None:
    if decl.base is None:
        return None
    name = decl.base.value
    if name in builtin:
        return builtin[name]
    if name in known and name != NONE.name:
        return known[name]
    choices = [*PRESETS, *(k for k in known if k != NONE.name)]
    diags.error("Q205", f"unknown preset or scheme `{name}`", decl.base.span, "nothing to refine",
                help=f"{did_you_mean(name, choices)} (presets: {', '.join(PRESETS)}; or a scheme defined above)")
    return None


def _qtype(word: ast.Keyword, diags: Diagnostics) -> QType | None:
    """The registered type a `weights`/`activations` item names; an unknown one is Q107 (None)."""
    found = QTYPES.get(word.value)
    if found is None:
        diags.error("Q107", f"unknown keyword `{word.value}`", word.span, "not a keyword here",
                    help=expected_help(word.value, QTYPES.names()))
    return found


def _check_single(specs: tuple[ast.QuantSpec, ...], diags: Diagnostics) -> None:
    seen: set[str] = set()
    for spec in specs:
        if spec.role in seen:
            diags.error("Q215", f"`{spec.role}` given twice in one scheme", spec.span, "second one",
                        help=f"write all items of `{spec.role}` on one line")
        seen.add(spec.role)


def _rounding(items: tuple[ast.Keyword, ...], default: Rounding, diags: Diagnostics) -> Rounding:
    for extra in items[1:]:
        diags.error("Q215", "`rounding` given twice in one scheme", extra.span, "second one")
    if not items:
        return default
    found = ROUNDINGS.get(items[0].value)
    if found is None:
        diags.error("Q107", f"unknown keyword `{items[0].value}`", items[0].span, "not a keyword here",
                    help=expected_help(items[0].value, ROUNDINGS.names()))
        return default
    return found


def _act_order(items: tuple[ast.Keyword, ...], rounding: Rounding, base: Scheme | None, diags: Diagnostics) -> bool:
    """`act_order` (GPTQ's default: columns by decreasing Hessian diagonal, llm-compressor's default too, and
    better on both real models measured, docs/recipe-language.md) or `no_act_order` (the stored order, which
    an explicit `updated_groups` implies). A scheme refining a GPTQ scheme keeps its choice."""
    flag = next((k for k in items if k.kind == "act_order"), None)
    if flag is not None and rounding is not Rounding.GPTQ:
        diags.error("Q238", f"`{flag.value}` applies to `rounding gptq`, not `{rounding.name}`", flag.span,
                    "not gptq", help=f"write `rounding gptq {flag.value}`, or drop `{flag.value}`")
    if rounding is not Rounding.GPTQ:
        return False
    if flag is not None:
        return flag.value == "act_order"
    if any(k.kind == "group_scales" and k.value == "updated_groups" for k in items):
        return False
    return base.act_order if base is not None and base.rounding is Rounding.GPTQ else True


def _static_groups(items: tuple[ast.Keyword, ...], rounding: Rounding, act_order: bool, inherited: bool,
                   diags: Diagnostics) -> bool:
    """`updated_groups` (the default: measured better on a decoder, bench/gptq_group_scales.py) or
    `static_groups`: where GPTQ takes each group's scale from. `act_order` takes them from the float weight."""
    flag = next((k for k in items if k.kind == "group_scales"), None)
    if flag is None:
        return inherited or act_order
    if rounding is not Rounding.GPTQ:
        diags.error("Q238", f"`{flag.value}` applies to `rounding gptq`, not `{rounding.name}`", flag.span,
                    "not gptq", help=f"write `rounding gptq {flag.value}`, or drop `{flag.value}`")
        return True
    if flag.value == "updated_groups" and act_order:
        diags.error("Q238", "`updated_groups` with `act_order`: groups visited out of order need a group index "
                    "(g_idx) that qrc's formats do not write", flag.span, "conflicts with act_order",
                    help="drop one of them; `act_order` takes its group scales from the float weight")
        return True
    return flag.value == "static_groups"


def _scale_search(items: tuple[ast.Keyword, ...], rounding: Rounding, base: Scheme | None, diags: Diagnostics) -> bool:
    """`mse_scales` (the default: GPTQ's KL 13% lower than with min/max ranges on bench/gptq_llmc.py's Llama,
    10-16% on bench/gptq_group_scales.py's decoder) or `minmax_scales`: how GPTQ chooses each scale."""
    flag = next((k for k in items if k.kind == "scale_search"), None)
    if flag is not None and rounding is not Rounding.GPTQ:
        diags.error("Q238", f"`{flag.value}` applies to `rounding gptq`, not `{rounding.name}`", flag.span,
                    "not gptq", help="`rounding mse` searches rtn's scales; for GPTQ write "
                    f"`rounding gptq {flag.value}`")
        return False
    if rounding is not Rounding.GPTQ:
        return False
    if flag is None:
        return base.mse_scales if base is not None and base.rounding is Rounding.GPTQ else True
    return flag.value == "mse_scales"


def _set_once(seen: dict[str, ast.QSpecItem], item: ast.QSpecItem, slot: str, diags: Diagnostics) -> bool:
    if slot in seen:
        first = seen[slot]
        diags.error("Q215", f"conflicting {slot}: `{_text(first)}` and `{_text(item)}`", item.span,
                    "conflicts with an earlier item", help=f"keep one {slot} per spec")
        return False
    seen[slot] = item
    return True


def _text(item: ast.QSpecItem) -> str:
    return item.span.text


def _weights(items, base: WeightQuant, diags: Diagnostics) -> WeightQuant:
    result, seen = base, dict[str, ast.QSpecItem]()
    for item in items:
        slot = "granularity" if item.field in ("granularity", "group", "block") else item.field
        if item.field == "mode" or (item.field == "granularity" and item.value.value not in _WEIGHT_GRANULARITIES):
            diags.error("Q207", f"`{_text(item)}` does not apply to weights", item.span, "not a weight option",
                        help="weights take a type, `per_tensor`, `per_channel`, `group N` or `block RxC`, and "
                        "`symmetric`/`asymmetric`")
            continue
        if not _set_once(seen, item, slot, diags):
            continue
        if item.field == "dtype":
            qtype = _qtype(item.value, diags)
            if qtype is None:
                continue
            result = replace(result, qtype=qtype)
            block = qtype.fixed_group or qtype.kquant_group
            if block and "granularity" not in seen:  # the format's own block size
                result = replace(result, granularity=Granularity.GROUP, group_size=block, block=None)
        elif item.field == "symmetry":
            result = replace(result, symmetric=item.value.value == "symmetric")
        elif item.field == "granularity":
            result = replace(result, granularity=Granularity(item.value.value), group_size=None, block=None)
        elif item.field == "block":
            rows, cols = (int(n) for n in item.value.value.split("x"))
            result = replace(result, granularity=Granularity.BLOCK, group_size=None, block=(rows, cols))
        else:
            size = whole_number(item.value, "a group size", diags)
            if size is not None:
                result = replace(result, granularity=Granularity.GROUP, group_size=size, block=None)
    if result.qtype.is_float and "symmetry" not in seen:  # floating formats are symmetric
        result = replace(result, symmetric=True)
    if result.qtype.is_kquant and "symmetry" not in seen:  # Q4_K/Q5_K keep a min per sub-block, Q6_K none
        result = replace(result, symmetric=result.qtype is QType.Q6_K)
    if not result.qtype.is_float and base.qtype.is_float and "granularity" not in seen:
        result = replace(result, granularity=Granularity.PER_CHANNEL, group_size=None, block=None)
    return result


def _activations(items, base: ActivationQuant, diags: Diagnostics) -> ActivationQuant:
    result, seen = base, dict[str, ast.QSpecItem]()
    for item in items:
        if item.field == "block" or (item.field == "granularity" and item.value.value not in _ACTIVATION_GRANULARITIES):
            diags.error("Q207", f"`{_text(item)}` does not apply to activations", item.span,
                        "not an activation option",
                        help="activations take `int8`/`uint8`/`fp8`, `per_tensor`, `per_token` or `group N` (fp8 "
                        "dynamic), `symmetric`/`asymmetric` and `static`/`dynamic`")
            continue
        slot = "granularity" if item.field == "group" else item.field
        if not _set_once(seen, item, slot, diags):
            continue
        if item.field == "dtype":
            qtype = _qtype(item.value, diags)
            if qtype is None:
                continue
            if qtype.is_kquant:
                diags.error("Q225", f"activations cannot be `{qtype.name}`", item.span, "a GGUF weight format",
                            help="K-quants are weight formats; llama.cpp quantizes its inputs itself (drop `activations`)")
                continue
            if qtype.bits == 4 and not qtype.fixed_group:
                diags.error("Q225", f"activations cannot be `{qtype.name}`", item.span, "4-bit activations",
                            help="qrc quantizes activations to `int8`, `uint8`, `fp8`, `nvfp4` or `mxfp4`; for "
                            "4-bit integer weights use a weight-only scheme (W4A16) or W4AFP8")
                continue
            result = replace(result, qtype=qtype)
            if qtype.fixed_group and "granularity" not in seen:  # the format's own blocks, scaled at run time
                result = replace(result, granularity=Granularity.GROUP, group_size=qtype.fixed_group,
                                 mode=ActivationMode.DYNAMIC)
        elif item.field == "symmetry":
            result = replace(result, symmetric=item.value.value == "symmetric")
        elif item.field == "granularity":
            result = replace(result, granularity=Granularity(item.value.value), group_size=None)
        elif item.field == "group":
            size = whole_number(item.value, "a group size", diags)
            if size is not None:
                result = replace(result, granularity=Granularity.GROUP, group_size=size)
        else:
            result = replace(result, mode=ActivationMode(item.value.value))
    if result.qtype.is_float and "symmetry" not in seen:
        result = replace(result, symmetric=True)
    return result


def _check_floats(decl: ast.SchemeDecl, w: WeightQuant, a: ActivationQuant | None, rounding: Rounding,
                  diags: Diagnostics) -> None:
    """Q256 where a floating format meets a setting it cannot take (or a setting only they take meets an
    integer type)."""
    problem = _float_problem(w, a, rounding)
    if problem is not None:
        diags.error("Q256", f"scheme `{decl.name.value}`: {problem[0]}", decl.name.span, "cannot be stored",
                    help=problem[1])


def _kquant_problem(w: WeightQuant, a: ActivationQuant | None, rounding: Rounding) -> tuple[str, str] | None:
    """What a K-quant scheme cannot take."""
    fmt = w.qtype
    if w.granularity is not Granularity.GROUP or w.group_size != fmt.kquant_group:
        return (f"{fmt.name} scales sub-blocks of {fmt.kquant_group} weights",
                f"drop the granularity: {fmt.name} means `group {fmt.kquant_group}`")
    if w.symmetric != (fmt is QType.Q6_K):
        return (f"{fmt.name} is {'symmetric' if fmt is QType.Q6_K else 'asymmetric (a min per sub-block)'}",
                "drop `symmetric`/`asymmetric`")
    if rounding not in (Rounding.RTN, Rounding.IMATRIX, Rounding.GPTQ):
        return (f"{fmt.name} is rounded with llama.cpp's search (`rounding rtn`, or `rounding imatrix` weighted by "
                f"the calibration inputs, or `rounding gptq` onto the imatrix search's grid), not {rounding.name}",
                "write `rounding rtn`, `rounding imatrix` or `rounding gptq`")
    if a is not None:
        return f"{fmt.name} is a weight format (GGUF): llama.cpp quantizes the inputs itself", "remove `activations`"
    return None


def _float_problem(w: WeightQuant, a: ActivationQuant | None, rounding: Rounding) -> tuple[str, str] | None:
    fmt = w.qtype
    if fmt.is_kquant:
        return _kquant_problem(w, a, rounding)
    if w.granularity is Granularity.BLOCK and fmt is not QType.FP8:
        return f"`block` tiles are for fp8 weights, not {fmt.name}", "use `group N` for integer weights"
    if fmt.is_float and not w.symmetric:
        return f"{fmt.name} weights are symmetric", "drop `asymmetric`"
    if fmt.fixed_group and (w.granularity is not Granularity.GROUP or w.group_size != fmt.fixed_group):
        return (f"{fmt.name} scales blocks of {fmt.fixed_group} weights", f"drop the granularity: {fmt.name} "
                f"means `group {fmt.fixed_group}`")
    if fmt is QType.FP8 and w.granularity is Granularity.GROUP:
        return "fp8 weights take `per_tensor`, `per_channel` or `block RxC`", "e.g. `weights fp8 block 128x128`"
    # FP4's block scales searched (mse; imatrix, weighted by the inputs), or GPTQ onto its grid
    fp4 = fmt.is_float and fmt.bits == 4
    fp4_roundings = (Rounding.GPTQ, Rounding.MSE, Rounding.IMATRIX)
    if fmt.is_float and rounding is not Rounding.RTN and not (fp4 and rounding in fp4_roundings):
        return (f"{fmt.name} weights are rounded with rtn (compressed-tensors' rounding)"
                f"{', mse, imatrix or gptq' if fp4 else ''}, not {rounding.name}",
                f"write `rounding rtn`{', `mse`, `imatrix` or `gptq`' if fp4 else ''}, or use an integer "
                f"type for `rounding {rounding.name}`")
    if a is None:
        return None
    if a.qtype.fixed_group:
        return _fp4_inputs_problem(fmt, a)
    if a.granularity is Granularity.GROUP and not (a.qtype is QType.FP8 and a.mode is ActivationMode.DYNAMIC):
        return "activations in groups are fp8 and dynamic", "write `activations fp8 group 128 dynamic`"
    if a.qtype is QType.FP8 and not a.symmetric:
        return "fp8 activations are symmetric", "drop `asymmetric`"
    if a.qtype is QType.FP8 and a.mode is ActivationMode.STATIC and a.granularity is not Granularity.PER_TENSOR:
        return "static fp8 activations have one scale per tensor", "write `per_tensor static` or `per_token dynamic`"
    if a.qtype.is_float != fmt.is_float and not _w4afp8(w, a):
        return (f"{a.qtype.name} activations with {fmt.name} weights: no runtime kernel mixes integer and floating "
                "formats this way", "use fp8 with fp8 (FP8, FP8_DYNAMIC), integers with integers (W8A8), or int4 "
                "groups with dynamic fp8 per token (W4AFP8)")
    return None


def _w4afp8(w: WeightQuant, a: ActivationQuant) -> bool:
    """compressed-tensors' W4AFP8: int4 weights in groups with dynamic FP8 inputs per token."""
    return (w.qtype is QType.INT4 and w.granularity is Granularity.GROUP and a.qtype is QType.FP8
            and a.mode is ActivationMode.DYNAMIC and a.granularity is Granularity.PER_TOKEN)


def _fp4_inputs_problem(fmt: QType, a: ActivationQuant) -> tuple[str, str] | None:
    """NVFP4 and MXFP4 inputs: the format's own blocks, dynamic, symmetric, with weights of the same format."""
    if a.qtype is not fmt:
        return (f"{a.qtype.name} activations need {a.qtype.name} weights (compressed-tensors' "
                f"{a.qtype.name.upper()} scheme)", f"use the preset {a.qtype.name.upper()}")
    if a.granularity is not Granularity.GROUP or a.group_size != a.qtype.fixed_group or \
            a.mode is not ActivationMode.DYNAMIC or not a.symmetric:
        return (f"{a.qtype.name} activations are scaled per block of {a.qtype.fixed_group} at run time",
                f"write `activations {a.qtype.name}` alone")
    return None
