"""A file-to-file run's final config and load check, on a thread while the weights round.

Both wait only for transformers' model class (imported on a thread of its own, loader_names): the names the
config carries come from it, and the load check opens the staged folder on the meta device, which reads its
config.json and the safetensors headers, never a tensor's bytes. The writer lays out every header and the
shard index before the first weight is rounded, so the staged folder is ready for the check then; run at the
end, config and check took about 1 s after the last weight (a 5.9 GiB checkpoint: 9.5 s in all), on a core
the rounding leaves partly idle now. The outcome is the same: the config written, a Q420 or Q426 raised
where the run would have raised it (at emit, before anything goes into place), a Q421 or Q427 returned."""

from __future__ import annotations

import gc
import threading
from dataclasses import dataclass

from compiler.backends.torch.layers import Job
from compiler.backends.torch.load_check import check_loads
from compiler.backends.torch.loader_names import await_prefetch
from compiler.backends.torch.model import TorchModel
from compiler.backends.torch.output_layout import config_text, final_config
from compiler.backends.torch.writer import FolderWriter
from compiler.diagnostics import Diagnostic
from compiler.resolve.assignment import Assignment
from compiler.source import Span


@dataclass(frozen=True)
class Checked:
    """The config with its final names, its schema check's warning (Q421), the load check's (Q427)."""

    config: dict
    config_warning: Diagnostic | None
    load_warning: Diagnostic | None


class EarlyCheck:
    """final_config and check_loads of a staged file-to-file output, started now, collected by `collect`."""

    def __init__(self, model: TorchModel, jobs: list[Job], assignment: Assignment, provisional: dict,
                 writer: FolderWriter, spans: tuple[Span | None, Span | None]):
        self._outcome: Checked | BaseException | None = None
        source, (recipe_span, emit_span) = model.folder, spans

        def run() -> None:
            try:
                await_prefetch(model.config)  # its imports first, on its one thread (loader_names)
                config, config_warning = final_config(model, jobs, assignment, provisional, recipe_span)
                writer.metadata("config.json", config_text(config))
                loaded = check_loads(writer.temp, source, emit_span) if source is not None else None
                self._outcome = Checked(config, config_warning, loaded)
                gc.collect()  # the meta models' cycles (~40 MiB), here: the imports are frozen, so it is brief
            except BaseException as exc:  # noqa: BLE001  # handed to the main thread, raised there
                self._outcome = exc

        self._thread = threading.Thread(target=run, name="qrc-check", daemon=True)
        self._thread.start()

    def join(self) -> None:
        """Wait for the thread (a run stopping early: it must not write into a staged folder being removed)."""
        self._thread.join()

    def collect(self) -> Checked:
        """The outcome, once the thread is done; what it raised is raised here."""
        self.join()
        if isinstance(self._outcome, BaseException):
            raise self._outcome
        assert self._outcome is not None  # set by the thread before it ends
        return self._outcome
