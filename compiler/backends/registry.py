"""The registry of backends: the recipe's `backend` → its spec. The one place that names every backend."""

from __future__ import annotations

from compiler.backends.spec import BackendSpec
from compiler.exhaustive import assert_never
from compiler.ir.types import Backend, BackendFacts


def spec_for(backend: Backend) -> BackendSpec:
    """The spec of `backend` (light: importing it imports no backend runtime)."""
    match backend:
        case Backend.ONNX:
            from compiler.backends.onnx.spec import SPEC
            return SPEC
        case Backend.TORCH:
            from compiler.backends.torch.spec import SPEC
            return SPEC
        case _:
            assert_never(backend)


def backend_facts() -> dict[Backend, BackendFacts]:
    """Every backend's facts, in the order a recipe without `backend` tries them for its model."""
    return {backend: spec_for(backend).facts for backend in Backend}
