"""parse_recipe: text → AST, or one located diagnostic."""

from __future__ import annotations

from lark.exceptions import UnexpectedInput

from compiler.diagnostics import Diagnostic
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
    return AstBuilder(source).transform(tree)
