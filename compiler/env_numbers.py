"""Numbers qrc reads from environment variables, checked: junk, NaN, infinity or a value out of range is a coded
error (Q443) naming the variable and what it takes, never a traceback deep in the run nor a silent default."""

from __future__ import annotations

import math
import os

from compiler.diagnostics import StageError, error


def env_number(name: str, default: float, low: float, high: float, integer: bool = False) -> float:
    """The value of environment variable `name` (its `default` when unset or empty), within [low, high]."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    kind = "a whole number" if integer else "a number"
    try:
        value = float(int(raw)) if integer else float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not low <= value <= high:
        shown = raw if len(raw) <= 40 else raw[:40] + "…"
        raise StageError(error("Q443", f"environment variable {name}={shown!r} is not {kind} from {low:g} to "
                               f"{high:g}", None, "out of range",
                               help=f"set {name} to {kind} from {low:g} to {high:g}, or unset it for the default "
                               f"({default:g})"))
    return value


def env_index(name: str, default: int) -> int:
    """A non-negative whole number from the environment (a rank's index or count): `default` when unset."""
    return int(env_number(name, default, 0, 1 << 20, integer=True))
