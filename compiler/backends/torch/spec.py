"""The torch backend's spec: light (no torch import), registered in compiler.backends.registry."""

from __future__ import annotations

from compiler.backends.spec import BackendSpec, OutputKind
from compiler.backends.torch.check_process import prepared
from compiler.backends.torch.cost import COSTS
from compiler.backends.torch.lowering import LOWERING
from compiler.backends.torch.support import check_supported
from compiler.ir.types import Backend, EmitFormat

SPEC = BackendSpec(
    backend=Backend.TORCH,
    formats=(EmitFormat.SAFETENSORS, EmitFormat.GGUF),
    output=OutputKind.FOLDER,
    output_help="a folder path (safetensors output; a .gguf file path with `format gguf`)",
    file_formats=(EmitFormat.GGUF,),
    costs=COSTS,
    lowering=LOWERING,
    check=check_supported,
    executor="compiler.backends.torch.execute:execute",
    prepare=prepared,
)
