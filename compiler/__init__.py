"""qrc, the quantization recipe compiler: a small public API over the pipeline stages.

Importing this package stays cheap: no torch, no onnxruntime (backends import them lazily).
"""

import compiler.plugins
import compiler.quant.hqq  # noqa: F401  (registers `rounding hqq`)
import compiler.quant.methods  # noqa: F401  (registers the built-in calibration methods: compiler/plugins.py)
from compiler.diagnostics import Diagnostic, DiagnosticError, Severity
from compiler.frontend import CheckResult, PlanResult, check_file, check_source, load_recipe, plan_file
from compiler.ir.printer import print_ir
from compiler.ir.types import RecipeIR
from compiler.source import Source

compiler.plugins.load_installed()  # after the built-ins: a plug-in may build on them

__all__ = ["CheckResult", "Diagnostic", "DiagnosticError", "PlanResult", "RecipeIR", "Severity", "Source",
           "check_file", "check_source", "load_recipe", "plan_file", "print_ir"]
