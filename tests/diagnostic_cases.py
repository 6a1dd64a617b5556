"""Data-file diagnostic cases: many cases per file, split by `# -----`, with inline expectations.

    # expect-error@+1: Q203        the next line has error Q203
    # expect-warning@-2: Q240      two lines above has warning Q240
    "x" -> w4  # expect-error: Q203     (no offset: this line)

Text before the first separator is the file's header, not a case. Line numbers are those of the
whole file, so a rendered diagnostic points at the file as it is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

SEPARATOR = re.compile(r"^# -{5,}\s*$", re.MULTILINE)
EXPECT = re.compile(r"#\s*expect-(error|warning)(?:@([+-]\d+))?:\s*((?:Q\d{3}[\s,]*)+)")


@dataclass(frozen=True)
class Case:
    file: Path
    index: int
    first_line: int  # 1-based line of the case's first line in the file
    text: str  # padded with newlines so that line numbers match the file
    expected: frozenset[tuple[int, str, str]]  # (line, severity, code)

    @property
    def id(self) -> str:
        return f"{self.file.stem}#{self.index}@{self.first_line}"


def load_cases(path: Path) -> list[Case]:
    text = path.read_text(encoding="utf-8")
    separators = [m.start() for m in SEPARATOR.finditer(text)]
    cases, start = [], (text.find("\n", separators[0]) + 1 if separators else 0)
    for index, end in enumerate(separators[1:] + [len(text)], start=1):
        chunk = text[start:end]
        first_line = text.count("\n", 0, start) + 1
        cases.append(Case(path, index, first_line, "\n" * (first_line - 1) + chunk,
                          frozenset(_expectations(chunk, first_line))))
        next_line = text.find("\n", end)
        start = len(text) if next_line < 0 else next_line + 1
    return [c for c in cases if c.text.strip()]


def _expectations(chunk: str, first_line: int):
    for offset, line in enumerate(chunk.splitlines()):
        for match in EXPECT.finditer(line):
            severity, delta, codes = match.groups()
            target = first_line + offset + int(delta or 0)
            for code in re.findall(r"Q\d{3}", codes):
                yield (target, severity, code)
