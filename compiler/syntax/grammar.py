"""Loads grammar/recipe.lark (from the wheel, or from the source tree) and builds the LALR parser once."""

from __future__ import annotations

from functools import cache
from importlib import resources
from pathlib import Path

from lark import Lark

# Entry points: a whole recipe, and one setting of a block for `--set block.key=value`.
SETTING_STARTS = ("recipe_setting", "calibrate_setting", "mixed_precision_setting", "memory_setting",
                  "verify_setting", "emit_setting")


def grammar_path() -> Path:
    """The grammar shipped inside the package (wheel), else the one at the top of the source tree."""
    shipped = resources.files("compiler").joinpath("grammar").joinpath("recipe.lark")
    if shipped.is_file():
        return Path(str(shipped))
    return Path(__file__).resolve().parents[2] / "grammar" / "recipe.lark"


@cache
def parser() -> Lark:
    """The recipe parser (built once)."""
    return Lark(
        grammar_path().read_text(encoding="utf-8"),
        parser="lalr",
        lexer="contextual",
        propagate_positions=True,
        maybe_placeholders=False,
        start=["start", *SETTING_STARTS],
        cache=True,  # lark keys the cached tables by the grammar's hash: a changed grammar rebuilds
    )
