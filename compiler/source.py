"""Recipe text and spans into it: what every diagnostic points at."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property


@dataclass(frozen=True, eq=False)  # identity: two reads of one file are two sources
class Source:
    """A piece of recipe text and the name it is shown under (a path as given, or `--set …`)."""

    name: str
    text: str

    @cached_property
    def line_starts(self) -> tuple[int, ...]:
        """Offsets where each line starts."""
        starts = [0]
        starts.extend(i + 1 for i, ch in enumerate(self.text) if ch == "\n")
        return tuple(starts)

    def line_col(self, offset: int) -> tuple[int, int]:
        """1-based line and column of a character offset."""
        offset = max(0, min(offset, len(self.text)))
        lo, hi = 0, len(self.line_starts) - 1
        while lo < hi:  # last line start <= offset
            mid = (lo + hi + 1) // 2
            if self.line_starts[mid] <= offset:
                lo = mid
            else:
                hi = mid - 1
        return lo + 1, offset - self.line_starts[lo] + 1

    def line_text(self, line: int) -> str:
        """The text of line `line` (1-based)."""
        start = self.line_starts[line - 1]
        end = self.text.find("\n", start)
        return self.text[start : end if end >= 0 else len(self.text)].rstrip("\r")

    def span(self, start: int, end: int) -> Span:
        """A span of this source."""
        return Span(self, start, max(start, end))

    def whole(self) -> Span:
        """A span covering the whole text."""
        return Span(self, 0, len(self.text))


@dataclass(frozen=True)
class Span:
    """Half-open character range [start, end) in a Source."""

    source: Source
    start: int
    end: int

    @property
    def line(self) -> int:
        """1-based line of the start."""
        return self.source.line_col(self.start)[0]

    @property
    def column(self) -> int:
        """1-based column of the start."""
        return self.source.line_col(self.start)[1]

    @property
    def text(self) -> str:
        """The spanned text."""
        return self.source.text[self.start : self.end]

    def location(self) -> str:
        """`file:line:column`."""
        return f"{self.source.name}:{self.line}:{self.column}"

    def to(self, other: Span) -> Span:
        """The span from the start of this one to the end of `other`."""
        return Span(self.source, min(self.start, other.start), max(self.end, other.end))

    def __repr__(self) -> str:  # keeps dataclass reprs of AST nodes short and free of the text
        return f"Span({self.location()})"
