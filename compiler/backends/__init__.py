"""Backends execute a Plan. They are imported lazily: only `qrc compile` loads onnxruntime or torch."""

from __future__ import annotations

from compiler.diagnostics import Diagnostic, StageError


class BackendError(StageError):
    """A problem found while executing (unwritable output, failed verification); the data layer raises its
    `StageError` parent, which callers of a backend catch."""

    def __init__(self, diagnostic: Diagnostic, result=None):
        super().__init__(diagnostic)
        self.result = result  # the CompileResult when the model was written (verification failed): for the report
