"""Golden files: canonical text checked into golden/, changed only on purpose.

`pytest --update-golden` (or UPDATE_GOLDEN=1) rewrites them; a missing golden fails; a mismatch
shows a unified diff; updating is refused when CI is set.

Everything the code decides (names, dtypes, shapes, plan lines, hashes of data-free tensors) compares
exactly. A number written `~x` is one that calibration computes through an unpinned dependency
(transformers' forward, onnxruntime's kernels, a tokenizer): it compares within CALIBRATED, so a new
release that moves the last digits does not turn CI red, while a real change of the value still does.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "golden"
_update = False
# `~x`: a calibrated figure (docs/development.md, "Golden files"); floats within 2% relative, integers within 1
CALIBRATED_REL, CALIBRATED_INT = 0.02, 1
_NUMBER = re.compile(r"~(-?(?:\d+\.?\d*(?:e[-+]?\d+)?|inf|nan))")


def enable_update(flag: bool) -> None:
    global _update
    _update = flag or os.environ.get("UPDATE_GOLDEN") == "1"
    if _update and os.environ.get("CI"):
        raise pytest.UsageError("refusing to update golden files with CI set: goldens change only on purpose")


def assert_golden(actual: str, relative: str) -> None:
    """Compare `actual` with golden/<relative>; with updating on, write it instead."""
    path = GOLDEN / relative
    if _update:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or not _agree(path.read_text(encoding="utf-8"), actual):  # no churn within tolerance
            path.write_text(actual, encoding="utf-8")
        return
    if not path.exists():
        pytest.fail(f"missing golden file golden/{relative}; create it with `pytest --update-golden` "
                    "and review it with `git diff golden/`")
    expected = path.read_text(encoding="utf-8")
    if not _agree(expected, actual):
        diff = "".join(difflib.unified_diff(expected.splitlines(True), actual.splitlines(True),
                                            f"golden/{relative}", "actual"))
        pytest.fail(f"output differs from golden/{relative}:\n{diff}", pytrace=False)


def assert_file(actual: str, path: Path) -> None:
    """A generated file kept in the repository (docs/diagnostics.md): equal to `actual`, or rewritten with
    updating on, exactly like a golden."""
    if _update:
        if not path.exists() or path.read_text(encoding="utf-8") != actual:
            path.write_text(actual, encoding="utf-8")
        return
    if not path.exists():
        pytest.fail(f"missing {path.name}; create it with `pytest --update-golden`")
    expected = path.read_text(encoding="utf-8")
    if expected != actual:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), actual.splitlines(True), str(path), "generated"))
        pytest.fail(f"{path} differs from what the code generates:\n{diff}", pytrace=False)


def _agree(expected: str, actual: str) -> bool:
    """Equal text, but for `~x` numbers, which agree within the calibrated tolerance."""
    if expected == actual:
        return True
    a, b = _NUMBER.split(expected), _NUMBER.split(actual)
    if len(a) != len(b):
        return False
    # split() alternates text and captured numbers: text at even positions, numbers at odd ones
    return all(x == y if i % 2 == 0 else _close(x, y) for i, (x, y) in enumerate(zip(a, b, strict=True)))


def _close(x: str, y: str) -> bool:
    if x == y:
        return True
    if re.fullmatch(r"-?\d+", x) and re.fullmatch(r"-?\d+", y):
        return abs(int(x) - int(y)) <= CALIBRATED_INT
    try:
        u, v = float(x), float(y)
    except ValueError:
        return False
    return abs(u - v) <= CALIBRATED_REL * max(abs(u), abs(v))
