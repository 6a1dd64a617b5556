"""The torch backend's spec: light (no torch import), registered in compiler.backends.registry."""

from __future__ import annotations

from compiler.backends.spec import BackendSpec, OutputKind
from compiler.backends.torch import folder_format, gguf_format  # noqa: F401  (they register their formats)
from compiler.backends.torch.check_process import prepared
from compiler.backends.torch.cost import COSTS
from compiler.backends.torch.formats import TORCH_FORMATS
from compiler.backends.torch.lowering import LOWERING
from compiler.backends.torch.support import check_recipe, check_supported, runtime_table
from compiler.ir.types import Backend, BackendFacts, EmitFormat, QType
from compiler.plugins import EMIT_FORMATS

# compressed-tensors' int8 activations, static or dynamic per token; any model a recipe without `backend` names
# that no other backend takes (HF-style folders, GGUF files) runs here
FACTS = BackendFacts(default_format=EmitFormat.SAFETENSORS, activation_qtype=QType.INT8,
                     static_activations_only=False, takes_model=(), smooths_into_norms_only=False)



def _formats() -> list:
    """The registered formats (a plug-in's too), the default first: Q220's help lists them in this order."""
    return sorted(TORCH_FORMATS, key=lambda f: (f.name != FACTS.default_format.name, f.name))


SPEC = BackendSpec(
    backend=Backend.TORCH,
    facts=FACTS,
    formats=lambda: tuple(EMIT_FORMATS.lookup(f.name) for f in _formats()),
    output=OutputKind.FOLDER,
    output_help=f"a folder path ({'; '.join(f.path_help for f in _formats())})",  # the built-ins'
    file_formats=lambda: tuple(EMIT_FORMATS.lookup(f.name) for f in _formats() if f.one_file),
    costs=COSTS,
    lowering=LOWERING,
    check=check_supported,
    check_recipe=check_recipe,
    executor="compiler.backends.torch.execute:execute",
    prepare=prepared,
    runtimes=runtime_table,
)
