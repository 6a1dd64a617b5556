"""The canonical number format of golden dumps, shared by every backend's model dump (docs/development.md,
"Golden files")."""

from __future__ import annotations

TINY = 8  # elements: tensors this small are written out in full


def fmt(x: float) -> str:
    """The one float format of the goldens."""
    return f"{float(x):.6g}"
