"""Elaboration of `transform awq|smoothquant|quarot|spinquant { … }`: settings checked against the method, maps kept as
selectors (they are resolved against the model in compiler/resolve/smoothing.py)."""

from __future__ import annotations

import math

from compiler.diagnostics import Diagnostics, expected_help
from compiler.ir.blocks import settings_by_key, spans_of
from compiler.ir.kinds import TransformKind
from compiler.ir.types import (
    Mapping,
    OnlineRotation,
    RotationLearning,
    RotationStart,
    Selector,
    SelectorKind,
    Transform,
)
from compiler.ir.values import whole_number
from compiler.plugins import TRANSFORMS
from compiler.syntax import ast

DEFAULT_ALPHA = 0.5  # SmoothQuant's published default (and llm-compressor's smoothing_strength)
DEFAULT_GRID = 20  # AWQ's published grid (AutoAWQ, llm-compressor)
# SmoothQuant's `alpha search`: strengths 0, 0.1, …, 1 (the fixed strengths people pick are tenths; 10 keeps the
# search's cost at half of AWQ's)
DEFAULT_ALPHA_GRID = 10
MAX_GRID = 1000


def elaborate_transform(decl: ast.TransformDecl | None, diags: Diagnostics) -> Transform | None:
    """A `transform` declaration → Transform; settings of the other method and values out of range are Q259."""
    if decl is None:
        return None
    kind = TRANSFORMS.get(decl.kind.value)
    if kind is None:
        diags.error("Q107", f"unknown keyword `{decl.kind.value}`", decl.kind.span, "not a keyword here",
                    help=expected_help(decl.kind.value, TRANSFORMS.names()))
        return None
    found = settings_by_key(decl.settings, diags)
    for key, setting in found.items():  # a setting of another transform is an error, not silently ignored
        if key not in kind.settings:
            other = next((k for k in TRANSFORMS if key in k.settings), None)
            whose = f"of `transform {other.name}`, " if other is not None else ""
            diags.error("Q259", f"`{key}` is a setting {whose}not of `{kind.name}`",
                        setting.key_span, "not for this transform",
                        help=f"`transform {kind.name}` takes: {', '.join(kind.settings) or 'no settings'}")
    alpha, searched = _alpha(found.get("alpha"), diags)
    grid = _grid(found.get("grid"), DEFAULT_ALPHA_GRID if searched else DEFAULT_GRID, diags)
    if kind is TransformKind.SMOOTHQUANT and "grid" in found and not searched:
        diags.error("Q259", "`grid` counts the strengths `alpha search` tries", found["grid"].key_span,
                    "no search here", help="write `alpha search  grid N`, or drop `grid` for a fixed `alpha`")
    if kind is TransformKind.SMOOTHQUANT and "online" in found and searched:
        diags.error("Q259", "`alpha search` estimates each strength's error on unrotated inputs; `online r4` rotates "
                    "them", found["alpha"].key_span, "not with `online r4`",
                    help="give a fixed strength with `online r4` (e.g. `alpha 0.7`), or drop `online r4`")
    duo = found.get("duo_scaling")
    mappings = tuple(Mapping(_selector(m.source), tuple(_selector(t) for t in m.targets), m.span) for m in decl.maps)
    block = found.get("block")
    return Transform(spans_of(found), kind, alpha, grid, duo is None or duo.value.value == "on", mappings, decl.span,
                     _online(found.get("online"), diags),
                     _block(block, diags), _learning(found, diags) if kind.learns else None, searched)


def _selector(sel: ast.Selector) -> Selector:
    return Selector(SelectorKind(sel.kind), sel.pattern, sel.span)


def _online(setting: ast.Setting | None, diags: Diagnostics) -> tuple[OnlineRotation, ...]:
    """`online r4`: the rotations the runtime applies as it runs. R3 (queries and keys after RoPE) needs the
    runtime to hook its attention, which the compressed-tensors form vLLM reads does not carry (llm-compressor
    issue 2067): Q259 with that reason."""
    if setting is None:
        return ()
    name = setting.value
    assert isinstance(name, ast.Name)
    known = {r.value: r for r in OnlineRotation}
    if name.value.lower() in known:
        return (known[name.value.lower()],)
    why = ("R3 (queries and keys after RoPE) needs the runtime to rotate inside its attention, which vLLM does "
           "not load from a compressed-tensors folder" if name.value.lower() == "r3" else "no such rotation")
    diags.error("Q259", f"`online {name.value}`: {why}", name.span, "not an online rotation here",
                help="`online r4` (the down projections' inputs, rotated as the runtime runs)")
    return ()


def _block(setting: ast.Setting | None, diags: Diagnostics) -> int | None:
    """`block N`: the order of a block-diagonal rotation's blocks (checked against the widths by the backend)."""
    if setting is None:
        return None
    number = setting.value
    assert isinstance(number, ast.Number)
    return whole_number(number, "`block`", diags)


def _learning(found: dict[str, ast.Setting], diags: Diagnostics) -> RotationLearning:
    """`iters N  lr X  batch B` of a learned rotation (the defaults where absent or invalid)."""
    default = RotationLearning()
    counts = {}
    for key in ("iters", "batch"):
        setting = found.get(key)
        value = setting.value if setting is not None else None
        if setting is not None and not isinstance(value, ast.Number):
            diags.error("Q217", f"`{key}` must be a positive whole number", setting.span, "expected a number",
                        help=f"write e.g. `{key} {getattr(default, key)}`")
        elif isinstance(value, ast.Number):
            counts[key] = whole_number(value, f"`{key}`", diags)
    rate = default.lr
    lr = found.get("lr")
    if lr is not None:
        value = lr.value
        if not isinstance(value, ast.Number) or not math.isfinite(value.value) or value.value <= 0:
            diags.error("Q259", "`lr` must be a positive number", lr.span, "not a learning rate",
                        help=f"write e.g. `lr {default.lr:g}` (SpinQuant's; each step is at most 1/‖A‖ anyway)")
        else:
            rate = float(value.value)
    return RotationLearning(counts.get("iters") or default.iters, rate, counts.get("batch") or default.batch,
                            _start(found.get("init"), diags))


def _start(setting: ast.Setting | None, diags: Diagnostics) -> RotationStart:
    """`init hadamard|identity`: where a learned rotation starts."""
    if setting is None:
        return RotationStart.HADAMARD
    known = {s.value: s for s in RotationStart}
    value = setting.value
    if isinstance(value, ast.Name) and value.value.lower() in known:
        return known[value.value.lower()]
    diags.error("Q259", "`init` must be `hadamard` or `identity`", setting.span, "no such start",
                help="`init hadamard` (QuaRot's random Hadamards, SpinQuant's start) or `init identity` (no rotation)")
    return RotationStart.HADAMARD


def _alpha(setting: ast.Setting | None, diags: Diagnostics) -> tuple[float, bool]:
    """`alpha X` (a fixed strength) or `alpha search` (searched per mapping) → (the strength, searched)."""
    if setting is None:
        return DEFAULT_ALPHA, False
    number = setting.value
    if isinstance(number, ast.Name):
        if number.value.lower() == "search":
            return DEFAULT_ALPHA, True
        diags.error("Q259", f"`alpha {number.value}` is not a strength", number.span, "a number or `search`",
                    help="write a strength in [0, 1] (e.g. `alpha 0.8`) or `alpha search` (each mapping's own)")
        return DEFAULT_ALPHA, False
    assert isinstance(number, ast.Number)
    if not 0.0 <= number.value <= 1.0:
        diags.error("Q259", f"`alpha {number.text}` is outside [0, 1]", number.span, "migration strength",
                    help="0 leaves the activations alone, 1 moves all their range into the weights; 0.5 is the "
                    "published default, 0.75-0.85 suits models with strong outliers; `alpha search` picks "
                    "each mapping's")
        return DEFAULT_ALPHA, False
    return float(number.value), False


def _grid(setting: ast.Setting | None, default: int, diags: Diagnostics) -> int:
    if setting is None:
        return default
    number = setting.value
    assert isinstance(number, ast.Number)
    grid = whole_number(number, "`grid`", diags)
    if grid is not None and grid > MAX_GRID:
        diags.error("Q259", f"`grid {grid}` searches {grid} scale ratios per mapping", number.span, "too many",
                    help=f"at most {MAX_GRID}; AWQ's published grid is {DEFAULT_GRID}")
        return default
    return grid or default
