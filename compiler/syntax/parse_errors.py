"""Turns lark's parse errors into diagnostics a user can act on.

lark reports the failing token and the set of terminal names the parser would have accepted. We
replay the tokens up to the failure to know what came before (the previous token, the blocks still
open) and say what was expected in the recipe's own words.
"""

from __future__ import annotations

import difflib
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

from lark import Token
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken
from lark.lexer import PatternStr

from compiler.diagnostics import Diagnostic, error
from compiler.plugins import CALIBRATION_METHODS
from compiler.source import Source, Span
from compiler.syntax.grammar import parser

UNITS = ("KiB", "MiB", "GiB", "TiB", "KB", "MB", "GB", "TB")

_TERMINAL_WORDS = {
    "NAME": "a name",
    "STRING": 'a quoted string ("…")',
    "REGEX_STRING": 'a regex (re"…")',
    "NUMBER": "a number",
    "ARROW": "`->`",
    "LBRACE": "`{`",
    "RBRACE": "`}`",
    "LSQB": "`[`",
    "RSQB": "`]`",
    "COMMA": "`,`",
    "EQUAL": "`=`",
    "$END": "the end of the file",
    "<END-OF-FILE>": "the end of the file",
}
_END = {"$END", "<END-OF-FILE>"}
# What a NAME is, by the token before it.
_NAME_AFTER: dict[str, str | Callable[[], str]] = {
    "RECIPE": "a recipe name",
    "SCHEME": "a scheme name",
    "EQUAL": "a preset (W4A16, W8A16, W8A8) or a scheme name",
    "ARROW": "a scheme name or `none`",
    "TYPE": "a layer type (Linear, MatMul, Gemm, Conv, Embedding)",
    "METHOD": lambda: f"a calibration method ({', '.join(CALIBRATION_METHODS.names())})",
    "NUMBER": f"a unit ({', '.join(UNITS)})",
}
# Where a setting keyword belongs, for "`chunk` is not allowed here" help.
KEYWORD_HOME = {
    **dict.fromkeys(("data", "chunk", "method", "passthrough", "workers", "bins"), "calibrate { … }"),
    **dict.fromkeys(("mode", "ram", "vram", "disk", "ranks"), "memory { … }"),
    **dict.fromkeys(("choices", "budget"), "mixed_precision { … }"),
    **dict.fromkeys(("at_least", "at_most"), "verify { … }"),
    **dict.fromkeys(("weights", "activations", "rounding"), "scheme NAME { … }"),
    **dict.fromkeys(("alpha", "grid", "duo_scaling", "map"), "transform awq|smoothquant { … }"),
    "online": "transform quarot { … }",
    "format": 'emit "PATH" { … }',
}
_ITEM_KEYWORDS = ("model", "backend", "scheme", "quantize", "group", "calibrate", "mixed_precision",
                  "memory", "verify", "emit", "kv_cache", "transform")
_SPEC_KEYWORDS = {"group", "int8", "uint8", "int4", "uint4", "per_tensor", "per_channel", "per_token",
                  "symmetric", "asymmetric", "static", "dynamic"}
_BLOCK_OPENERS = {"RECIPE", "SCHEME", "QUANTIZE", "CALIBRATE", "MIXED_PRECISION", "MEMORY", "VERIFY",
                  "EMIT", "SYNTHETIC", "NPZ", "TEXT", "LAYERWISE_PERCENTILE", "AWQ", "SMOOTHQUANT"}


@dataclass(frozen=True)
class _OpenBracket:
    token: Token
    opener: str  # the block keyword before it, e.g. "calibrate"


def translate(exc: UnexpectedInput, source: Source, start: str) -> Diagnostic:
    """One diagnostic for a lark parse error."""
    consumed = _replay(source.text, start)
    if isinstance(exc, UnexpectedCharacters):
        return _unexpected_character(exc, source, consumed)
    assert isinstance(exc, UnexpectedToken)
    return _unexpected_token(exc, source, consumed)


def _replay(text: str, start: str) -> list[Token]:
    """The tokens the parser accepted before it failed."""
    interactive = parser().parse_interactive(text, start=start)
    seen: list[Token] = []
    try:
        for tok in interactive.iter_parse():  # yields each token before feeding it
            seen.append(tok)
    except UnexpectedToken as exc:
        # A token the parser refused was yielded first; one the contextual lexer refused was not.
        if seen and seen[-1].start_pos == exc.token.start_pos and seen[-1].type == exc.token.type:
            return seen[:-1]
        return seen
    except UnexpectedInput:
        return seen
    return seen


def _open_brackets(tokens: list[Token]) -> list[_OpenBracket]:
    stack: list[_OpenBracket] = []
    opener = ""
    for tok in tokens:
        if tok.type in _BLOCK_OPENERS:
            opener = str(tok)
        if tok.type in ("LBRACE", "LSQB"):
            stack.append(_OpenBracket(tok, opener if tok.type == "LBRACE" else ""))
        elif tok.type in ("RBRACE", "RSQB") and stack:
            stack.pop()
    return stack


def _tok_span(source: Source, tok: Token) -> Span:
    assert tok.start_pos is not None and tok.end_pos is not None  # the lexer positions every token
    return source.span(tok.start_pos, tok.end_pos)


def _keyword_of(terminal: str) -> str | None:
    """The literal word of a keyword terminal (`CALIBRATE` → `calibrate`), else None."""
    try:
        pattern = parser().get_terminal(terminal).pattern
    except KeyError:
        return None
    if isinstance(pattern, PatternStr) and pattern.value.replace("_", "").isalnum():
        return pattern.value
    return None


def _name_after(token_type: str) -> str:
    """What a name after this token is, in words (a plug-in kind lists the names registered now)."""
    words = _NAME_AFTER[token_type]
    return words if isinstance(words, str) else words()


def describe_expected(expected: set[str], previous: Token | None) -> str:
    """What the parser expected, in words."""
    words, others = [], []
    for terminal in expected:
        keyword = _keyword_of(terminal)
        if keyword:
            words.append(f"`{keyword}`")
        elif terminal == "NAME" and previous is not None and previous.type in _NAME_AFTER:
            others.append(_name_after(previous.type))
        else:
            others.append(_TERMINAL_WORDS.get(terminal, terminal))
    items = sorted(words) + sorted(others)
    if len(items) == 1:
        return items[0]
    if len(items) > 14:
        items = items[:14] + [f"{len(items) - 14} more"]
    return "one of " + ", ".join(items[:-1]) + " or " + items[-1]


def _describe_token(tok: Token) -> str:
    if tok.type in _END:
        return "the end of the file"
    text = str(tok)
    return f"`{text[:40]}…`" if len(text) > 40 else f"`{text}`"


def _after(previous: Token | None) -> str:
    return f" after `{previous}`" if previous is not None else ""


def _unexpected_token(exc: UnexpectedToken, source: Source, consumed: list[Token]) -> Diagnostic:
    tok = exc.token
    expected = set(exc.expected) if exc.expected else set()
    previous = consumed[-1] if consumed else None
    open_ = _open_brackets(consumed)

    if tok.type in _END:
        return _end_of_file(source, consumed, open_, expected, previous)
    span = _tok_span(source, tok)
    if str(tok) == "re" and source.text.startswith('"', tok.end_pos):  # `re"…` whose quote never closes
        return _unterminated(source, tok.start_pos)
    if "ARROW" in expected and tok.type not in ("COMMA", "RBRACE"):
        return error("Q106", "missing `->` in a quantize rule", span, "expected `->` before this",
                     help='a rule reads `"pattern" -> scheme`; several patterns are separated by `,`')
    if expected == {"NAME"} and previous is not None and previous.type == "NUMBER":
        return _missing_unit(source, tok, previous)
    if tok.type == "RBRACE" and not open_:
        return error("Q110", "unmatched `}`", span, "no block is open here",
                     help="remove this `}` or the `{` you meant it to close is missing")
    if expected and expected <= _END:
        return error("Q111", "text after the end of the recipe", span, "the recipe ended before this",
                     help="a file holds one `recipe NAME { … }`; move this inside its braces")
    keyword = _keyword_of(tok.type)
    if keyword is not None or tok.type == "NAME":
        return _unexpected_word(source, tok, expected, previous, open_, keyword)
    return error("Q104", f"expected {describe_expected(expected, previous)}{_after(previous)}, "
                 f"found {_describe_token(tok)}", span, "unexpected here", help=_q104_help(expected, previous))


def _unexpected_word(source, tok, expected, previous, open_, keyword) -> Diagnostic:
    span = _tok_span(source, tok)
    word = str(tok)
    expected_words = sorted(w for w in (_keyword_of(t) for t in expected) if w)
    expected_text = describe_expected(expected, previous)
    inside = open_[-1].opener if open_ else ""
    if keyword is not None:  # a real keyword, in the wrong place
        where = f" inside `{inside} {{ … }}`" if inside and inside != "recipe" else " here"
        help_ = f"expected {expected_text}"
        if inside == "scheme" and keyword in _SPEC_KEYWORDS:
            help_ = (f"bare items such as `{keyword} …` come first in a scheme body; after `weights`, "
                     f"`activations` or `rounding`, put it on the `weights`/`activations` line")
        elif keyword in _ITEM_KEYWORDS and len(open_) >= 2:
            line = open_[-1].token.line
            help_ = f"did you forget the `}}` that closes `{inside} {{` (line {line})?"
        elif keyword in KEYWORD_HOME and expected_words:
            help_ = f"`{keyword}` belongs in `{KEYWORD_HOME[keyword]}`; here: {expected_text}"
        return error("Q107", f"`{keyword}` is not allowed{where}", span, "not valid here", help=help_)
    if not expected_words or "NAME" in expected:
        return error("Q104", f"expected {expected_text}{_after(previous)}, found {_describe_token(tok)}",
                     span, "unexpected here", help=_q104_help(expected, previous))
    close = difflib.get_close_matches(word, expected_words, n=1, cutoff=0.6)
    help_ = f"did you mean `{close[0]}`?" if close else f"expected {expected_text}"
    return error("Q107", f"unknown keyword `{word}`", span, "not a keyword here", help=help_)


def _missing_unit(source: Source, tok: Token, number: Token) -> Diagnostic:
    span = _tok_span(source, number)
    return error("Q108", f"the size `{number}` has no unit", span, "needs a unit",
                 help=f"write e.g. `{number} GiB`; units: {', '.join(UNITS)}")


def _end_of_file(source, consumed, open_, expected, previous) -> Diagnostic:
    if not consumed:
        first = len(source.text) - len(source.text.lstrip())  # point at the comments, if any
        return error("Q102", "the recipe is empty", source.span(first, first), "no recipe here",
                     help="a recipe file holds `recipe NAME { … }`; see `recipes/` for examples")
    if open_:
        bracket = open_[-1]
        what = f"`{bracket.opener} {{`" if bracket.opener else f"`{bracket.token}`"
        close = "}" if bracket.token.type == "LBRACE" else "]"
        return error("Q105", f"unclosed {what}: the file ends before its `{close}`",
                     _tok_span(source, bracket.token), "opened here",
                     help=f"add `{close}` where this block ends")
    span = _tok_span(source, previous)
    return error("Q104", f"the recipe ends too early: expected {describe_expected(expected, previous)}"
                 f"{_after(previous)}", span, "file ends after this",
                 help="finish the statement and close every `{` with `}`; see `recipes/` for complete recipes")


def _q104_help(expected, previous) -> str:
    """What to write instead, and where to look for the language's forms."""
    return (f"write {describe_expected(expected, previous)} here (or check the line before for a missing value or "
            "`}`); `qrc explain Q104` and `recipes/` show the forms")


def _unterminated(source: Source, pos: int) -> Diagnostic:
    line_end = source.text.find("\n", pos)
    line_end = len(source.text) if line_end < 0 else line_end
    return error("Q109", "unterminated string", source.span(pos, line_end), "no closing `\"`",
                 help='close the string with `"` on the same line (write `\\"` for a quote inside)')


def _unexpected_character(exc: UnexpectedCharacters, source: Source, consumed: list[Token]) -> Diagnostic:
    pos = exc.pos_in_stream
    assert pos is not None  # the lexer knows where it stopped
    char = source.text[pos]
    is_regex_start = char == "r" and source.text.startswith('re"', pos)
    if char == '"' or is_regex_start:
        return _unterminated(source, pos)
    previous = consumed[-1] if consumed else None
    expected = describe_expected(set(exc.allowed or ()), previous)
    if not char.isprintable() or ord(char) > 127:
        name = unicodedata.name(char, "control character")
        shown = f"U+{ord(char):04X} ({name.lower()})"
    else:
        shown = f"`{char}`"
    return error("Q103", f"unexpected character {shown}", source.span(pos, pos + 1), "not part of the language",
                 help=f"expected {expected}{_after(previous)}")
