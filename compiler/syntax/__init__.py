"""Recipe text → AST: grammar loading, parsing, and translation of parser errors into diagnostics."""

from compiler.syntax.parse import parse_recipe, parse_setting

__all__ = ["parse_recipe", "parse_setting"]
