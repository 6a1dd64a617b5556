"""Q418, said once for all layers by either backend: GPTQ Hessians that needed more dampening than the
default, or that no dampening made definite (those layers are rounded with rtn)."""

from __future__ import annotations

import math

from compiler.diagnostics import Diagnostic, warning
from compiler.models import names
from compiler.source import Span


def dampened_warning(span: Span | None, dampened: dict[str, float]) -> Diagnostic:
    """Q418 for the GPTQ layers whose Hessian needed more dampening (∞: none helped, rounded with rtn)."""
    by_value: dict[float, list[str]] = {}
    for layer, used in dampened.items():
        by_value.setdefault(used, []).append(layer)
    parts = [f"{', '.join(names.compress(layers)[:2])}: " + ("rtn (no dampening made H definite)"
             if math.isinf(used) else f"dampening {used:g}") for used, layers in sorted(by_value.items())]
    return warning(
        "Q418", f"GPTQ raised its dampening for {len(dampened)} layers ({'; '.join(parts)})",
        span, "Hessian not definite",
        help="their inputs were (nearly) degenerate during calibration: more or more varied calibration samples "
        "give them a well-conditioned Hessian")
