"""The code catalog, the code that emits diagnostics, and the documentation agree."""

from __future__ import annotations

import re
from pathlib import Path

from compiler.codes import BY_CODE, CODES

ROOT = Path(__file__).resolve().parents[1]


def _emitted_codes() -> set[str]:
    found = set()
    for path in (ROOT / "compiler").rglob("*.py"):
        if path.parent.name != "codes":  # the catalog itself
            found.update(re.findall(r'"(Q\d{3})"', path.read_text(encoding="utf-8")))
    return found


def test_every_emitted_code_is_explained_and_every_explained_code_is_emitted():
    assert _emitted_codes() == set(BY_CODE)


def test_codes_are_unique_and_sorted_within_severity_ranges():
    assert len(BY_CODE) == len(CODES)


def test_the_docs_list_every_code():
    catalogue = (ROOT / "docs" / "diagnostics.md").read_text(encoding="utf-8")
    missing = [c.code for c in CODES if f"`{c.code}`" not in catalogue]
    assert not missing, f"docs/diagnostics.md does not list {missing}"
