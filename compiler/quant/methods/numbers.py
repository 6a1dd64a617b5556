"""What the built-in calibration methods share in reading their settings."""

from __future__ import annotations

from compiler.diagnostics import Diagnostics
from compiler.syntax import ast


def percentile_of(num: ast.Number, diags: Diagnostics) -> float | None:
    """A percentile as written, or None (Q209) outside (0, 100]."""
    if not 0 < num.value <= 100:
        diags.error("Q209", f"percentile `{num.text}` is outside (0, 100]", num.span, "not a percentile",
                    help="percentiles are in (0, 100]; typical: 99.99, 99.999")
        return None
    return num.value
