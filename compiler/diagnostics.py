"""One diagnostic type for every stage, and its rendering (`error[Q201]: …`, `--> file:line:col`, carets)."""

from __future__ import annotations

import difflib
import enum
from collections.abc import Iterable
from dataclasses import dataclass, field

from compiler.source import Span

MAX_SHOWN = 20  # diagnostics rendered before "… and N more"


class Severity(enum.Enum):
    """How bad a diagnostic is."""
    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True, slots=True)
class Diagnostic:
    """A located problem: stable code, what is wrong (message), what to do (help).

    `label` is the short text printed after the carets; `span` is None only for problems that have
    no text to point at (a file that cannot be read).
    """

    code: str
    severity: Severity
    message: str
    span: Span | None = None
    label: str = ""
    help: str = ""

    @property
    def is_error(self) -> bool:
        """Whether it is an error."""
        return self.severity is Severity.ERROR

    def sort_key(self) -> tuple:
        """Source order: file, position, code."""
        where = (self.span.source.name, self.span.start) if self.span else ("", -1)
        return (*where, self.code, self.message)


class StageError(Exception):
    """A stage stopped on one located problem (a data file that cannot be read, a step of a run that failed).

    Raised where a problem ends the work at once instead of being collected; the caller prints the diagnostic.
    """

    def __init__(self, diagnostic: Diagnostic):
        super().__init__(diagnostic.message)
        self.diagnostic = diagnostic


def error(code: str, message: str, span: Span | None, label: str = "", help: str = "") -> Diagnostic:
    """An error diagnostic."""
    return Diagnostic(code, Severity.ERROR, message, span, label, help)


def warning(code: str, message: str, span: Span | None, label: str = "", help: str = "") -> Diagnostic:
    """A warning diagnostic."""
    return Diagnostic(code, Severity.WARNING, message, span, label, help)


class DiagnosticError(Exception):
    """Raised by the public API when a recipe, model or data file has errors; carries all of them."""

    def __init__(self, diagnostics: Iterable[Diagnostic]):
        self.diagnostics = tuple(diagnostics)
        super().__init__(render_all(self.diagnostics))


def has_errors(diagnostics: Iterable[Diagnostic]) -> bool:
    """Whether any of them is an error."""
    return any(d.is_error for d in diagnostics)


def render(diagnostic: Diagnostic) -> str:
    """The canonical plain-text form (also what goldens hold)."""
    head = f"{diagnostic.severity.value}[{diagnostic.code}]: {diagnostic.message}"
    if diagnostic.span is None:
        lines = [head]
        if diagnostic.help:
            lines.append(f"  = help: {diagnostic.help}")
        return printable("\n".join(lines))
    span = diagnostic.span
    line_no, col = span.source.line_col(span.start)
    text = span.source.line_text(line_no) if span.source.text else ""
    gutter = " " * len(str(line_no))
    carets = _carets(text, col, span)
    lines = [
        head,
        f"{gutter}--> {span.source.name}:{line_no}:{col}",
        f"{gutter} |",
        f"{line_no} | {text}".rstrip(),
        f"{gutter} | {carets} {diagnostic.label}".rstrip(),
    ]
    if diagnostic.help:
        lines += [f"{gutter} |", f"{gutter} = help: {diagnostic.help}"]
    return printable("\n".join(lines))


_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x00, 0x09), *range(0x0b, 0x20), 0x7f, *range(0x80, 0xa0))}


def printable(text: str) -> str:
    """`text` with control characters (a terminal's escape sequences among them) written as `\\xNN`: a path, a
    tensor name or a file's content shown to the user can never retitle, recolour or rewrite the terminal.
    Newlines and tabs stay."""
    return text.translate(_CONTROL)


def _carets(line_text: str, col: int, span: Span) -> str:
    # Reuse the line's own whitespace before the span so tabs line up, and stop at the line's end.
    prefix = "".join(ch if ch == "\t" else " " for ch in line_text[: col - 1])
    width = min(max(span.end - span.start, 1), max(len(line_text) - (col - 1), 1))
    return prefix + "^" * width


def render_all(diagnostics: Iterable[Diagnostic], limit: int = MAX_SHOWN) -> str:
    """Render in source order, errors and warnings together, capped at `limit`."""
    ordered = sorted(diagnostics, key=Diagnostic.sort_key)
    parts = [render(d) for d in ordered[:limit]]
    if len(ordered) > limit:
        parts.append(f"… and {len(ordered) - limit} more")
    return "\n\n".join(parts)


def summary(diagnostics: Iterable[Diagnostic]) -> str:
    """`N errors, M warnings`."""
    diagnostics = tuple(diagnostics)
    errors = sum(d.is_error for d in diagnostics)
    warnings = len(diagnostics) - errors
    return f"{_plural(errors, 'error')}, {_plural(warnings, 'warning')}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


@dataclass
class Diagnostics:
    """Collects diagnostics during elaboration (never raised one by one)."""

    items: list[Diagnostic] = field(default_factory=list)

    def error(self, code: str, message: str, span: Span | None, label: str = "", help: str = "") -> None:
        """Add an error."""
        self.items.append(error(code, message, span, label, help))

    def warning(self, code: str, message: str, span: Span | None, label: str = "", help: str = "") -> None:
        """Add a warning."""
        self.items.append(warning(code, message, span, label, help))


def closest(word: str, choices, cutoff: float = 0.6) -> str | None:
    """The choice `word` most likely meant (case-insensitive equality first), or None."""
    choices = list(choices)
    lowered = {c.lower(): c for c in choices}
    if word.lower() in lowered:
        return lowered[word.lower()]
    close = difflib.get_close_matches(word, choices, n=1, cutoff=cutoff)
    return close[0] if close else None


def expected_help(word: str, names) -> str:
    """Help for an unknown name, worded as the parser's for an unknown keyword: "did you mean `x`?" (a close one),
    else "expected one of `a`, `b` or `c`"."""
    names = sorted(names)
    close = difflib.get_close_matches(word, names, n=1, cutoff=0.6)
    if close:
        return f"did you mean `{close[0]}`?"
    quoted = [f"`{n}`" for n in names]
    return "expected " + (quoted[0] if len(quoted) == 1 else "one of " + ", ".join(quoted[:-1]) + " or " + quoted[-1])


def did_you_mean(word: str, choices) -> str:
    """Help text: "did you mean `x`?", or the list of valid choices when nothing is close."""
    choices = list(choices)
    match = closest(word, choices)
    if match is not None:
        return f"did you mean `{match}`?"
    return "valid: " + ", ".join(f"`{c}`" for c in choices)
