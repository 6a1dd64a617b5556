"""`--set key=value`: one setting of the recipe replaced without editing the file.

The value is parsed with the grammar's own rule for that setting (so it is validated exactly like
recipe text) and replaces the setting in the AST before elaboration.
"""

from __future__ import annotations

from dataclasses import replace

from compiler.diagnostics import Diagnostic, closest, error
from compiler.ir.blocks import setting_key
from compiler.ir.printer import quote
from compiler.source import Source
from compiler.syntax import ast, parse_setting

# key → (grammar entry point, keyword that starts the setting)
_BLOCK_KEYS = {
    "calibrate": ("data", "chunk", "method", "passthrough", "workers", "bins", "experts", "attention"),
    "mixed_precision": ("choices", "metric", "budget", "samples"),
    "memory": ("mode", "ram", "vram", "disk", "ranks"),
    "verify": ("samples", "metric", "at_least", "at_most"),
}
KEYS = ("model", "backend", *(f"{b}.{k}" for b, ks in _BLOCK_KEYS.items() for k in ks), "emit.path", "emit.format",
        "emit.runtime", "emit.device")


def apply_overrides(recipe: ast.Recipe, overrides: tuple[str, ...]) -> tuple[ast.Recipe, list[Diagnostic]]:
    """Apply `key=value` overrides in order; problems come back as diagnostics."""
    diags: list[Diagnostic] = []
    for text in overrides:
        result = _apply_one(recipe, text)
        if isinstance(result, Diagnostic):
            diags.append(result)
        else:
            recipe = result
    return recipe, diags


def _apply_one(recipe: ast.Recipe, text: str) -> ast.Recipe | Diagnostic:
    key, sep, value = text.partition("=")
    key, value = key.strip(), value.strip()
    whole = Source("--set", text)
    if not sep or not key or not value:
        return error("Q231", f"`--set {text}` is not `key=value`", whole.whole(), "expected key=value",
                     help="e.g. `--set memory.ram=2GiB` or `--set calibrate.chunk=8`")
    if key not in KEYS:
        match = closest(key, KEYS)
        hint = f"did you mean `{match}`? " if match else ""
        return error("Q230", f"unknown setting `{key}`", whole.span(0, len(key)), "not a setting",
                     help=f"{hint}settings: {', '.join(KEYS)}")
    block, _, keyword = key.rpartition(".")
    start = f"{block}_setting" if block else "recipe_setting"
    if key == "emit.path":  # parsed as a whole `emit "PATH"` item, whose path we take
        keyword, start = "emit", "recipe_setting"
    if key in ("emit.path", "model", "memory.disk") and not value.startswith('"'):
        value = quote(value)  # a path on the command line needs no quotes
    if key == "mixed_precision.budget" and value.replace(".", "", 1).isdigit():
        value += " bits"  # the only unit a budget has: a sweep can write `budget=4.5`
    source = Source(f"--set {key}", f"{keyword} {value}")
    parsed = parse_setting(source, start)
    if isinstance(parsed, Diagnostic):
        return parsed
    return _replace(recipe, key, block, parsed)


def _replace(recipe: ast.Recipe, key: str, block: str, parsed) -> ast.Recipe | Diagnostic:
    items = list(recipe.items)
    if not block:  # model / backend
        kind = type(parsed)
        items = [i for i in items if not isinstance(i, kind)] + [parsed]
    elif block == "emit":
        emit = next((i for i in items if isinstance(i, ast.EmitDecl)), None)
        if key == "emit.path":
            new = replace(emit, path=parsed.path) if emit else parsed
        elif emit is None:
            return error("Q216", "`--set emit.format` needs an `emit` in the recipe", parsed.span,
                         "nothing to change", help="also give `--set emit.path=out/model.onnx`")
        else:
            new = replace(emit, options=_without(emit.options, parsed) + (parsed,))
        items = [i for i in items if not isinstance(i, ast.EmitDecl)] + [new]
    else:
        found = next((i for i in items if isinstance(i, ast.Block) and i.kind == block), None)
        new = replace(found, items=_without(found.items, parsed) + (parsed,)) if found else \
            ast.Block(block, (parsed,), parsed.span)
        items = [new if i is found else i for i in items] + ([] if found else [new])
    return replace(recipe, items=tuple(items))


def _without(items, parsed) -> tuple:
    """The block's items minus the one the override replaces."""
    return tuple(i for i in items if setting_key(i) != setting_key(parsed))
