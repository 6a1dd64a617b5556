"""AST → RecipeIR: presets expanded, defaults filled, units in bytes, names resolved.

Elaboration never stops at the first problem: it collects diagnostics and returns an IR built from
what was valid, so that the model-free checks (compiler/ir/checks.py) can still run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from compiler.diagnostics import Diagnostics, closest
from compiler.ir import blocks
from compiler.ir.schemes import NONE, PRESETS, elaborate_kv_cache, elaborate_scheme, presets
from compiler.ir.transforms import elaborate_transform
from compiler.ir.types import (
    AutoGroup,
    Backend,
    BackendFacts,
    Group,
    GroupPolicy,
    RecipeIR,
    Rule,
    Scheme,
    Selector,
    SelectorKind,
)
from compiler.syntax import ast

_SINGLE_ITEMS = {ast.ModelDecl: "model", ast.BackendDecl: "backend", ast.EmitDecl: "emit", ast.KvCacheDecl: "kv_cache",
                 ast.TransformDecl: "transform"}


def elaborate(recipe: ast.Recipe, diags: Diagnostics, backends: Mapping[Backend, BackendFacts]) -> RecipeIR:
    """Elaborate a parsed recipe; problems go to `diags`. `backends`: each backend's facts, in the order a
    recipe without `backend` tries them (compiler/backends/registry.py)."""
    singles = _singles(recipe, diags)
    model = singles.get("model")
    if model is None:
        diags.error("Q216", f"recipe `{recipe.name.value}` has no `model`", recipe.name.span, "no model",
                    help='add e.g. `model "builtin:tiny-llama"` (a built-in, an .onnx file or an HF folder)')
    elif not model.ref.value.strip():
        diags.error("Q216", "`model` is empty", model.ref.span, "empty", help='e.g. `model "builtin:tiny-llama"`')
    model_ref = model.ref.value if model else ""
    backend_decl = singles.get("backend")
    backend = Backend(backend_decl.kind.value) if backend_decl else backend_for_model(model_ref, backends)
    facts = backends[backend]
    schemes = _schemes(recipe, facts, diags)
    rules = _rules(recipe, schemes, diags)
    block = {kind: _block(recipe, kind, diags) for kind in ("calibrate", "mixed_precision", "memory", "verify")}
    used = _used_presets(rules, block["mixed_precision"], schemes, facts)
    return RecipeIR(
        name=recipe.name.value,
        model=model_ref,
        model_span=model.ref.span if model else None,
        backend=backend,
        backend_from_model=backend_decl is None,
        schemes=tuple(s for s in schemes.values() if s.span is not None) + used,
        rules=rules,
        groups=tuple(_group(g) for g in recipe.items if isinstance(g, ast.GroupDecl)),
        calibration=blocks.elaborate_calibration(block["calibrate"], diags),
        mixed_precision=blocks.elaborate_mixed_precision(block["mixed_precision"], diags),
        memory=blocks.elaborate_memory(block["memory"], diags),
        verify=blocks.elaborate_verify(block["verify"], diags),
        emit=blocks.elaborate_emit(singles.get("emit"), facts.default_format, diags),
        source_name=recipe.span.source.name,
        span=recipe.span,
        kv_cache=elaborate_kv_cache(singles.get("kv_cache"), diags),
        transform=elaborate_transform(singles.get("transform"), diags),
        facts=facts,
    )


def backend_for_model(model: str, backends: Mapping[Backend, BackendFacts]) -> Backend:
    """The first backend whose facts take the model (built-ins and .onnx files run on ONNX; HF-style folders on
    torch), else the last."""
    lowered = model.lower()
    for backend, facts in backends.items():
        if any(model.startswith(t) or lowered.endswith(t) for t in facts.takes_model):
            return backend
    return list(backends)[-1]


def _singles(recipe: ast.Recipe, diags: Diagnostics) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for item in recipe.items:
        key = _SINGLE_ITEMS.get(type(item))
        if key is None:
            continue
        if key in found:
            diags.error("Q215", f"`{key}` given twice", item.span, "second one",
                        help=f"a recipe has one `{key}`; the first is at line {found[key].span.line}")
            continue
        found[key] = item
    return found


def _block(recipe: ast.Recipe, kind: str, diags: Diagnostics) -> ast.Block | None:
    matches = [i for i in recipe.items if isinstance(i, ast.Block) and i.kind == kind]
    for extra in matches[1:]:
        diags.error("Q215", f"`{kind}` block given twice", extra.span, "second one",
                    help=f"merge it into the first `{kind} {{ … }}` at line {matches[0].span.line}")
    return matches[0] if matches else None


def _schemes(recipe: ast.Recipe, facts: BackendFacts, diags: Diagnostics) -> dict[str, Scheme]:
    known: dict[str, Scheme] = {NONE.name: NONE}
    for decl in (i for i in recipe.items if isinstance(i, ast.SchemeDecl)):
        name = decl.name.value
        if name in known or name in PRESETS:
            what = "a built-in name" if name in PRESETS or name == NONE.name else "already defined"
            first = known.get(name)
            where = f" at line {first.span.line}" if first is not None and first.span else ""
            diags.error("Q204", f"scheme `{name}` is {what}{where}", decl.name.span, "duplicate name",
                        help="give each scheme its own name; presets W4A16, W8A16, W8A8 and `none` are taken")
            continue
        scheme = elaborate_scheme(decl, known, facts, diags)
        if scheme is not None:
            known[name] = scheme
    return known


def _rules(recipe: ast.Recipe, schemes: dict[str, Scheme], diags: Diagnostics) -> tuple[Rule, ...]:
    rules: list[Rule] = []
    for block in (i for i in recipe.items if isinstance(i, ast.QuantizeBlock)):
        for rule in block.rules:
            name = rule.scheme.value
            if name not in schemes and name not in PRESETS:
                diags.error("Q203", f"no scheme named `{name}`", rule.scheme.span, "undefined scheme",
                            help=undefined_scheme_help(name, [*schemes, *PRESETS]))
            selectors = tuple(Selector(SelectorKind(s.kind), s.pattern, s.span) for s in rule.selectors)
            rules.append(Rule(len(rules) + 1, selectors, name, rule.span, rule.scheme.span))
    return tuple(rules)


def _used_presets(rules, mixed_precision: ast.Block | None, schemes: dict[str, Scheme],
                  facts: BackendFacts) -> tuple[Scheme, ...]:
    """Presets named directly by rules or choices (not redefined), in order of first use, as the backend writes
    them."""
    names = [r.scheme for r in rules]
    if mixed_precision is not None:
        for item in mixed_precision.items:
            if isinstance(item, ast.Setting) and item.key == "choices":
                names.extend(n.value for n in item.value)  # type: ignore[union-attr]  # `choices [a, b]`
    used = dict.fromkeys(n for n in names if n in PRESETS and n not in schemes)
    builtin = presets(facts)
    return tuple(builtin[n] for n in used)


def undefined_scheme_help(name: str, known: list[str]) -> str:
    """The help line for an undefined scheme: the closest name, or what exists."""
    match = closest(name, known)
    if match is not None:
        return f"did you mean `{match}`?"
    return f"define it with `scheme {name} {{ … }}`, or use one of: " + ", ".join(f"`{k}`" for k in known)


def _group(decl: ast.GroupDecl) -> Group:
    policy = GroupPolicy(decl.policy.value) if decl.policy else GroupPolicy.PROMOTE
    return Group(decl.pattern.value if decl.pattern else None, policy, decl.span, AutoGroup(decl.auto or "qkv"))
