"""One diagnostic code's entry in the catalog behind `qrc explain` (compiler/codes)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CodeInfo:
    """A diagnostic code's meaning, why it matters, and an example (`qrc explain CODE`)."""
    code: str
    title: str
    why: str
    example: str
