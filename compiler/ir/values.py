"""Checked conversions of AST values (numbers, sizes) into IR values; each problem is a diagnostic."""

from __future__ import annotations

import math

from compiler.diagnostics import Diagnostics, did_you_mean, expected_help
from compiler.syntax import ast

UNIT_BYTES = {
    "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
}


def whole_number(num: ast.Number, what: str, diags: Diagnostics, minimum: int = 1) -> int | None:
    """A count such as `chunk 16`: a whole number ≥ minimum."""
    if not num.is_integer or num.value < minimum:
        at_least = "a positive whole number" if minimum == 1 else f"a whole number ≥ {minimum}"
        text = num.text if len(num.text) <= 24 else num.text[:20] + "…"
        diags.error("Q217", f"{what} must be {at_least}, not `{text}`", num.span, f"expected {at_least}",
                    help=f"write {at_least}, such as {max(minimum, 1) * 8}")
        return None
    return int(num.value)


def keyed_settings(settings: tuple[ast.Setting, ...], keys: tuple[str, ...], owner: str, diags: Diagnostics,
                   none_help: str | None = None) -> dict[str, ast.Setting]:
    """`{ key value … }` settings of `owner` (`method percentile`, `rounding autoround`) by key: a key it does not
    take is Q107 (`none_help` the help where it takes none), a key given twice Q215; neither is returned."""
    found: dict[str, ast.Setting] = {}
    for setting in settings:
        if setting.key in found:
            diags.error("Q215", f"`{setting.key}` given twice", setting.key_span, "second one",
                        help=f"keep one `{setting.key}`; the first is at line {found[setting.key].key_span.line}")
        elif setting.key not in keys:
            diags.error("Q107", f"`{setting.key}` is not a setting of `{owner}`", setting.key_span, "not valid here",
                        help=expected_help(setting.key, keys) if keys else none_help or f"`{owner}` takes no settings")
        else:
            found[setting.key] = setting
    return found


def size_bytes(size: ast.Size, what: str, diags: Diagnostics) -> int | None:
    """`4 GiB` → 4294967296."""
    unit = size.unit.value
    if unit not in UNIT_BYTES:
        diags.error("Q108", f"unknown unit `{unit}`", size.unit.span, "not a size unit",
                    help=f"{did_you_mean(unit, UNIT_BYTES)} (binary: KiB MiB GiB TiB; decimal: KB MB GB TB)")
        return None
    if not math.isfinite(size.number.value * UNIT_BYTES[unit]) or size.number.value * UNIT_BYTES[unit] > 1 << 70:
        diags.error("Q232", f"{what} `{size.number.text[:20]}…` is too large", size.span, "not a usable budget",
                    help=f"give a size such as `{what} 4 GiB`")
        return None
    if size.number.value <= 0:
        diags.error("Q232", f"{what} must be larger than zero", size.span, "not a usable budget",
                    help=f"give a positive size, e.g. `{what} 4 GiB`, or leave `{what}` out to detect it")
        return None
    return round(size.number.value * UNIT_BYTES[unit])


def format_bytes(n: int) -> str:
    """Exact recipe spelling of a byte count: the largest unit that divides it (`4 GiB`, `1.5 GiB`)."""
    for unit in ("TiB", "GiB", "MiB", "KiB", "TB", "GB", "MB", "KB"):
        scale = UNIT_BYTES[unit]
        if n % scale == 0:
            return f"{n // scale} {unit}"
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        value = n / UNIT_BYTES[unit]
        if value >= 1 and round(value * UNIT_BYTES[unit]) == n:
            return f"{format_number(value)} {unit}"
    return f"{format_number(n / 1024)} KiB"


def human_bytes(n: int) -> str:
    """Fixed human form of a byte count (two decimals, binary units): `1.63 MiB`."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def format_number(value: float) -> str:
    """Shortest text that reads back as the same float; whole numbers without `.0`."""
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))
