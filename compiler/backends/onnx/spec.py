"""The ONNX backend's spec: light (no onnxruntime import), registered in compiler.backends.registry."""

from __future__ import annotations

from compiler.backends.onnx.cost import COSTS
from compiler.backends.onnx.exported_model import planned_assignment
from compiler.backends.onnx.lowering import LOWERING
from compiler.backends.onnx.support import check_supported
from compiler.backends.spec import BackendSpec, OutputKind
from compiler.ir.types import Backend, EmitFormat

SPEC = BackendSpec(
    backend=Backend.ONNX,
    formats=(EmitFormat.QDQ, EmitFormat.MATMUL_NBITS),
    output=OutputKind.FILE,
    output_help="a file path ending in .onnx",
    costs=COSTS,
    lowering=LOWERING,
    check=check_supported,
    executor="compiler.backends.onnx.execute:execute",
    planned=planned_assignment,
)
