"""The emitter seam: what an output format implements, so that a new format is a new emitter and not a
change to the executors. The executor runs the plan's ops and hands each emitter what they produced; the
emitter alone knows the layout on disk.

- `specs()`: every tensor it will write (name, dtype, shape), known before the first is written;
- `put(name, value)`: a quantized tensor (a rounded weight, or an activation's scale and zero point);
- `copy_raw(name, …)`: a tensor that stays as it was, copied without passing through a float copy;
- `metadata(key, value)`: provenance and configuration (the recipe, its hash, config.json);
- `finish()`: everything written and staged beside the destination (verification reads it there);
- `commit()`: the staged output into place atomically, returning its files; `abort()`: nothing left.
  So an interrupted or failed run never leaves a model at the destination that was not verified.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

DType = TypeVar("DType")


@dataclass(frozen=True, slots=True)
class Spec(Generic[DType]):
    """A tensor an emitter writes: its name, dtype (as the format names it: ONNX's type names, torch's dtypes
    for safetensors) and shape."""

    name: str
    dtype: DType
    shape: tuple[int, ...]


class Emitter(Protocol):
    """An output format (see the module docstring). Each emitter class names it as its base, so mypy checks
    it implements every method."""

    def specs(self) -> Sequence[Spec[Any]]:
        """Every tensor it will write, before the first is written."""
        ...

    def put(self, name: str, value: Any) -> None:
        """A quantized tensor, by name."""
        ...

    def copy_raw(self, name: str, *args: Any, **kwargs: Any) -> None:
        """A tensor kept as it was."""
        ...

    def metadata(self, key: str, value: str) -> None:
        """Provenance or configuration."""
        ...

    def finish(self) -> list[Path]:
        """Write everything, staged beside the destination; the staged files."""
        ...

    def commit(self) -> list[Path]:
        """Move the staged output into place atomically; the files at the destination."""
        ...

    def abort(self) -> None:
        """Leave nothing at the destination."""
        ...
