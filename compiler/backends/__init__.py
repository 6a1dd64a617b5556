"""Backends execute a Plan. They are imported lazily: only `qrc compile` loads onnxruntime or torch."""

from __future__ import annotations

from compiler.diagnostics import Diagnostic


class BackendError(Exception):
    """A problem found while executing (bad data file, unwritable output, failed verification)."""

    def __init__(self, diagnostic: Diagnostic, result=None):
        super().__init__(diagnostic.message)
        self.diagnostic = diagnostic
        self.result = result  # the CompileResult when the model was written (verification failed): for the report
