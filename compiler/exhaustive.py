"""Exhaustive matches over enums: a type checker flags the `case _` arm when a member is left out, and
at run time an unhandled member fails loudly instead of falling through to a default."""

from __future__ import annotations

from typing import NoReturn


def assert_never(value: NoReturn) -> NoReturn:
    """Mark the arm no member should reach (typing.assert_never is Python 3.11+; we support 3.10)."""
    raise AssertionError(f"unhandled case: {value!r}")
