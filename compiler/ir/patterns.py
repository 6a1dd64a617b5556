"""Layer-name patterns: globs (`*`, `?`, `{a,b}`) compiled to regexes; errors carry an offset."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class PatternError(Exception):
    """A pattern qrc cannot use, with the reason."""
    offset: int  # into the pattern text
    message: str


def glob_to_regex(pattern: str) -> str:
    """`*` any run of characters (dots included), `?` one character, `{a,b}` alternatives."""
    if not pattern:
        raise PatternError(0, "empty pattern")
    out, i, open_at = [], 0, -1
    while i < len(pattern):
        ch = pattern[i]
        if ch == "{":
            if open_at >= 0:
                raise PatternError(i, "`{…}` cannot be nested")
            open_at = i
            out.append("(?:")
        elif ch == "}":
            if open_at < 0:
                raise PatternError(i, "`}` without a `{`")
            open_at = -1
            out.append(")")
        elif ch == "," and open_at >= 0:
            out.append("|")
        elif ch == "*":
            if not out or out[-1] != ".*":  # a run of stars is one: `.*.*.*` backtracks exponentially
                out.append(".*")
        elif ch == "?":
            out.append(".")
        else:
            out.append(re.escape(ch))
        i += 1
    if open_at >= 0:
        raise PatternError(open_at, "`{` is never closed")
    return "".join(out)


def alternations(pattern: str) -> list[tuple[int, int, list[str]]]:
    """The `{…}` groups of a valid glob: (start, end, alternatives)."""
    return [(m.start(), m.end(), m.group(1).split(",")) for m in re.finditer(r"\{([^{}]*)\}", pattern)]


def check_regex(pattern: str) -> None:
    """Raise PatternError when `pattern` is not a valid regex."""
    try:
        re.compile(pattern)
    except re.error as exc:
        raise PatternError(exc.pos or 0, str(exc).split(" at position")[0]) from None
