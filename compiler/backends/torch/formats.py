"""The output formats the torch backend writes (`emit … { format NAME }`), one module each, registered here by
name: compressed-tensors' safetensors folder (folder_format.py) and llama.cpp's GGUF file (gguf_format.py).

A format is light where `qrc check` and `qrc plan` ask it (what it refuses: support.py FormatChecks; what it adds to
a run's memory, how its path is written) and imports torch only where a compile asks it to write (`open`,
`finish`). The run, the
rounding, verification and the cost model ask the format instead of testing for one, so a new format is a new
module (docs/contributing.md)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from compiler.diagnostics import Diagnostic
from compiler.plan.workload import Workload
from compiler.plugins import Registry


class BlockEncoder(Protocol):
    """A format that stores rounded weights in blocks of its own (GGUF's): every rank rounds each layer to them,
    so that qrc's model computes what the format's runtime decodes."""

    def reference_blocks(self, job: Any, weight: Any) -> Any:
        """The runtime's own rounding of `weight`, when the format has one (else None: qrc's rounding is kept)."""
        ...

    def rounded_tensors(self, job: Any, q: Any) -> dict[str, Any]:
        """The bytes the file stores for a rounded layer, by the name its writer puts them under (its blocks,
        and any tensor that goes beside them)."""
        ...


@dataclass(frozen=True, slots=True)
class Opened:
    """What a format's `open` makes before any weight is rounded."""

    writer: Any  # an Emitter (compiler/backends/emitter.py); a RankCollector on torchrun's ranks but the first
    encoder: BlockEncoder | None = None
    config: dict | None = None  # the folder's config.json, checked before any work
    warning: Diagnostic | None = None  # a check that could not run (Q421)
    early: Any = None  # file to file: the final config and the load check, on a thread (early_check.py)
    unit_global: frozenset[str] = frozenset()  # NVFP4 layers whose global scale the runtime reads not: 1 for them


class TorchFormat(Protocol):
    """One output format of the torch backend."""

    name: ClassVar[str]  # the `format` of `emit`
    one_file: ClassVar[bool]  # one file where the backend writes folders
    path_help: ClassVar[str]  # how the output path of this format is written (the backend's `--help` of `-o`)
    emit_example: ClassVar[str]  # the `emit` that writes it, for a diagnostic that points a user at the format
    # a folder transformers opens: its config and load checks run beside the rounding, and verification runs the
    # folder as transformers loads it (where the model is a folder transformers can build)
    opened_by_transformers: ClassVar[bool]
    verified_on: ClassVar[str]  # what verification runs instead of the output, in words ("": the backend's own)
    planned_verified_on: ClassVar[str]  # the same, as the plan's verify op says it ("": the backend's own)
    rounded_copy_verified: ClassVar[bool]  # block by block, each block's rounded copy runs beside the float one
    encodes_whole_tensors: ClassVar[bool]  # a tensor copied into it is converted whole, not a slice of rows at a time

    def open(self, target: Any, staged: Any, resumed: bool, attention: list[str]) -> Opened:
        """The writer (every tensor's place) and what rounding needs of the format, before any work. `target`:
        where and what (run_values.Target: the destination, the plan, the ranks, the model, the jobs). `staged`,
        `resumed`: a resumable run's staged output and whether an earlier run began it; `attention`: the modules
        whose KV-cache scales the output carries."""
        ...

    def copies_beside_rounding(self, staging: Any) -> Callable[[], None] | None:
        """File to file: the copy of the tensors no layer rounds, run beside the rounding (None: at emit)."""
        ...

    def finish(self, staging: Any, checked: Any) -> list[Diagnostic]:
        """Every tensor not rounded and the metadata written (the first rank); warnings about what was not.
        `staging`: the output opened and what was rounded into it (run_values.Staging).
        `checked`: file to file, the config and load checks made beside the rounding (early_check.Checked)."""
        ...

    def check_staged(self, staging: Any, checked: Any) -> Diagnostic | None:
        """What the format's loader makes of the staged output, before it goes into place (None: nothing to say)."""
        ...

    def rounding_scratch(self, w: Workload) -> int:
        """Bytes the format's own rounding holds beyond the block's working set (0: none)."""
        ...

    def file_scratch(self, w: Workload) -> int | None:
        """File to file: what rounding the largest layer to this format holds (None: the backend's own estimate)."""
        ...


TORCH_FORMATS: Registry = Registry("torch output format")
DEFAULT = "safetensors"  # without `emit … { format }` (the spec's BackendFacts say so too)


def torch_format(fmt: Any) -> TorchFormat:
    """The registered format an `EmitFormat` (or its name) names; None, the backend's default."""
    name = DEFAULT if fmt is None else getattr(fmt, "name", fmt)
    found = TORCH_FORMATS.get(name)
    assert found is not None, f"the torch backend's spec registers its formats ({name})"
    return found
