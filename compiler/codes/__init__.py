"""Every diagnostic code qrc emits: what it means, why it matters, an example. Used by `qrc explain` and
rendered into docs/diagnostics.md. One module per stage, in the order the catalog lists them."""

from __future__ import annotations

from compiler.codes.execution import EXECUTION
from compiler.codes.info import CodeInfo
from compiler.codes.meaning import MEANING
from compiler.codes.syntax import SYNTAX
from compiler.codes.verification import VERIFICATION
from compiler.codes.warning_codes import WARNINGS

CODES: tuple[CodeInfo, ...] = (*SYNTAX, *MEANING, *EXECUTION, *VERIFICATION, *WARNINGS)

BY_CODE = {info.code: info for info in CODES}

__all__ = ["BY_CODE", "CODES", "CodeInfo"]
