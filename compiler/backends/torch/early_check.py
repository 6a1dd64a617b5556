"""A file-to-file run's final config and load check, while the weights round.

A thread here waits for the check process (check_process.py) to report the model class's base-model prefix,
makes the config's final names with it, writes config.json into the staged folder and hands the process the
config and the folder: compressed-tensors' schema check and transformers' load check run there, holding
another interpreter's lock, not this one's. The writer lays out every header and the shard index before the
first weight is rounded, so the staged folder is ready for the check then (transformers opens it on the
meta device: config.json and the safetensors headers, never a tensor's bytes). Where the process failed,
the thread makes the same checks in this process (the imports then hold this process's lock for seconds).
The outcome is the same either way: the config written, a Q420 or Q426 raised where the run would have
raised it (at emit, before anything goes into place), a Q421 or Q427 returned."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from compiler.backends import BackendError
from compiler.backends.rss import own_rss, record_child_peak
from compiler.backends.torch.check_process import CheckProcess
from compiler.backends.torch.layers import Job
from compiler.backends.torch.load_check import check_loads
from compiler.backends.torch.loader_names import record_class_prefix
from compiler.backends.torch.model import TorchModel
from compiler.backends.torch.output_layout import config_text, final_config, needs_package, renamed_config
from compiler.backends.torch.writer import FolderWriter
from compiler.diagnostics import Diagnostic, Severity
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
                 writer: FolderWriter, spans: tuple[Span | None, Span | None], process: CheckProcess):
        self._outcome: Checked | BaseException | None = None
        self._process = process
        self._stopping = threading.Event()  # the run stops early: no check in this process after the child's
        source, (recipe_span, emit_span) = model.folder, spans

        def by_process() -> Checked | None:
            prefix = process.prefix()
            if prefix is None:
                return None
            record_class_prefix(model.config, prefix)
            config = renamed_config(model, jobs, assignment, provisional)
            writer.metadata("config.json", config_text(config))
            answer = process.check({"quantization_config": config["quantization_config"],
                                    "needs_package": needs_package(jobs, config), "staged": str(writer.temp),
                                    "source": str(source) if source is not None else None})
            if answer is None:
                return None
            record_child_peak(int(answer.get("peak") or 0), own_rss())
            raised = answer["raised"]
            if raised is not None:
                raise BackendError(_located(raised, emit_span if raised["code"] == "Q426" else recipe_span))
            return Checked(config, _diagnostic(answer["config"], recipe_span), _diagnostic(answer["load"], emit_span))

        def here() -> Checked:
            config, config_warning = final_config(model, jobs, assignment, provisional, recipe_span)
            writer.metadata("config.json", config_text(config))
            loaded = check_loads(writer.temp, source, emit_span) if source is not None else None
            return Checked(config, config_warning, loaded)

        def run() -> None:
            try:
                checked = by_process()
                self._outcome = checked if checked is not None or self._stopping.is_set() else here()
            except BaseException as exc:  # noqa: BLE001  # handed to the main thread, raised there
                self._outcome = exc
            finally:
                process.stop()

        self._thread = threading.Thread(target=run, name="qrc-check", daemon=True)
        self._thread.start()

    def join(self) -> None:
        """Stop the check process and wait for the thread (a run stopping early: the thread must not write
        into a staged folder being removed)."""
        self._stopping.set()
        self._process.stop()
        self._thread.join()

    def collect(self) -> Checked:
        """The outcome, once the thread is done; what it raised is raised here."""
        self._thread.join()
        if isinstance(self._outcome, BaseException):
            raise self._outcome
        assert self._outcome is not None  # set by the thread before it ends
        return self._outcome


def _diagnostic(plain: dict | None, span: Span | None) -> Diagnostic | None:
    """A diagnostic the check process sent (check_worker.py), pointing at `span` here."""
    return _located(plain, span) if plain is not None else None


def _located(plain: dict, span: Span | None) -> Diagnostic:
    severity = Severity.ERROR if plain["error"] else Severity.WARNING
    return Diagnostic(plain["code"], severity, plain["message"], span, plain["label"], plain["help"])

