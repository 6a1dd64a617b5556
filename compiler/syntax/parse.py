"""parse_recipe: text → AST, or one located diagnostic."""

from __future__ import annotations

import math

from lark.exceptions import UnexpectedInput

from compiler.diagnostics import Diagnostic, error
from compiler.source import Source
from compiler.syntax import ast
from compiler.syntax.build_ast import AstBuilder
from compiler.syntax.grammar import parser
from compiler.syntax.parse_errors import translate


def parse_recipe(source: Source) -> ast.Recipe | Diagnostic:
    """Parse a whole recipe. Returns the AST, or the diagnostic for the first syntax error."""
    return _parse(source, "start")


def parse_setting(source: Source, start: str) -> ast.RecipeItem | ast.Setting | Diagnostic:
    """Parse one setting of a block (`start` is one of grammar.SETTING_STARTS), for `--set`."""
    return _parse(source, start)


def _parse(source: Source, start: str):
    try:
        tree = parser().parse(source.text, start=start)
    except UnexpectedInput as exc:
        return translate(exc, source, start)
    huge = next((t for t in tree.scan_values(lambda v: getattr(v, "type", None) == "NUMBER")
                 if not math.isfinite(float(t))), None)
    if huge is not None:  # 1e400 reads as infinity: no bound, size or count means that
        span = source.span(huge.start_pos or 0, huge.end_pos or 0)
        shown = str(huge) if len(huge) <= 24 else f"{huge[:20]}…"
        return error("Q113", f"the number `{shown}` is too large", span, "beyond any float",
                     help="numbers must be finite (below about 1.8e308)")
    return AstBuilder(source).transform(tree)
