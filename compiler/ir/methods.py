"""Calibration methods as plug-ins: how a tensor's observations become the range its inputs are quantized with.

A method is one module (the built-ins are in compiler/quant/methods/) holding a frozen dataclass registered in
`CALIBRATION_METHODS` under the name a recipe writes after `method`. The class says what its observers keep (a
running min/max, or a histogram as well), reads its own settings from `method NAME [NUMBER] { key value … }` and
computes the range from an observer; the language, the plan and both backends ask it instead of matching a
closed list. docs/contributing.md says what a new one provides."""

from __future__ import annotations

from typing import ClassVar

from compiler.diagnostics import Diagnostics, expected_help
from compiler.ir.kinds import CalibrationMethod
from compiler.ir.values import keyed_settings
from compiler.plugins import CALIBRATION_METHODS
from compiler.syntax import ast

DEFAULT_METHOD = "minmax"


def configure_method(decl: ast.MethodDecl | None, diags: Diagnostics) -> CalibrationMethod:
    """The `method` of a calibrate block, by its registered name; an unknown name is Q107 and falls back to the
    default, so that the rest of the recipe is still checked."""
    name = decl.kind.value if decl is not None else DEFAULT_METHOD
    method = CALIBRATION_METHODS.get(name)
    if method is None and decl is not None:
        diags.error("Q107", f"unknown keyword `{name}`", decl.kind.span, "not a keyword here",
                    help=expected_help(name, CALIBRATION_METHODS.names()))
        method, decl = CALIBRATION_METHODS.get(DEFAULT_METHOD), None
    assert method is not None, "the default method registers with the package (compiler/quant/methods/)"
    return method.configure(decl, diags)


def method_options(decl: ast.MethodDecl | None, keys: tuple[str, ...], diags: Diagnostics,
                   takes_number: bool = False) -> dict[str, ast.Setting]:
    """The `{ key value }` settings of `decl`, by key. A key the method does not take is Q107 and a number after
    the name of a method that takes none is Q104, a key given twice Q215; none is in what is returned."""
    if decl is None:
        return {}
    if decl.argument is not None and not takes_number:
        diags.error("Q104", f"`method {decl.kind.value}` takes no number, found `{decl.argument.text}`",
                    decl.argument.span, "unexpected here", help=f"write `method {decl.kind.value}`")
    return keyed_settings(decl.options, keys, f"method {decl.kind.value}", diags)


class WithoutSettings:
    """What a method that takes no settings shares (minmax, entropy, mse): `method NAME` and nothing after it."""

    __slots__ = ()
    name: ClassVar[str]

    @classmethod
    def configure(cls, decl: ast.MethodDecl | None, diags: Diagnostics):
        """`method NAME` alone (a number or a setting after it is reported)."""
        method_options(decl, (), diags)
        return cls()

    def text(self) -> str:
        """`method NAME`."""
        return f"method {self.name}"

    def detail(self) -> str:
        """The name."""
        return self.name
