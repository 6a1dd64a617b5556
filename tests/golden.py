"""Golden files: canonical text checked into golden/, changed only on purpose.

`pytest --update-golden` (or UPDATE_GOLDEN=1) rewrites them; a missing golden fails; a mismatch
shows a unified diff; updating is refused when CI is set.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "golden"
_update = False


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
        if not path.exists() or path.read_text(encoding="utf-8") != actual:
            path.write_text(actual, encoding="utf-8")
        return
    if not path.exists():
        pytest.fail(f"missing golden file golden/{relative}; create it with `pytest --update-golden` "
                    "and review it with `git diff golden/`")
    expected = path.read_text(encoding="utf-8")
    if expected != actual:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), actual.splitlines(True),
                                            f"golden/{relative}", "actual"))
        pytest.fail(f"output differs from golden/{relative}:\n{diff}", pytrace=False)
