"""The emitted `quantization_config`, checked with compressed-tensors' own pydantic models before any work
starts (the loaders of transformers and vLLM parse it with the same models). A config they reject is a qrc
bug, refused with Q420 instead of a folder that fails where it is served; without the package, Q421 says
the check was skipped. A file-to-file run checks it later instead, on the names it writes, in a process of its
own beside the rounding (torch/early_check.py, torch/check_process.py)."""

from __future__ import annotations

import importlib.util

from compiler.backends import BackendError
from compiler.diagnostics import Diagnostic, error, warning
from compiler.source import Span


def require_package(span: Span | None) -> None:
    """Q400 when compressed-tensors is not installed, found without importing it (its import, which imports
    transformers, takes seconds: a file-to-file run checks its config later, on the names it writes)."""
    if importlib.util.find_spec("compressed_tensors") is None:
        raise BackendError(_missing(span))


def check_config(config: dict, span: Span | None, needs_package: bool = False) -> Diagnostic | None:
    """Validate `config` with compressed-tensors' QuantizationConfig; None when it passes, Q421 (a
    warning to report) when the package is not installed. Raises Q420 when the schema rejects it, and Q400
    when the package is missing but `needs_package` (its compressors write the floating formats)."""
    try:
        from compressed_tensors.quantization import QuantizationConfig
    except ImportError:
        if needs_package:
            raise BackendError(_missing(span)) from None
        return warning("Q421", "compressed-tensors is not installed: the quantization_config was not checked against "
                       "its schema", span, "schema check skipped",
                       help="pip install 'qrc[hf]' (it brings compressed-tensors, which transformers and vLLM load "
                       "this folder with)")
    try:
        QuantizationConfig.model_validate(config)
    except Exception as exc:  # pydantic's ValidationError, or a validator's ValueError
        raise BackendError(error(
            "Q420", f"compressed-tensors rejects the quantization_config qrc would write: {_first_line(exc)}",
            span, "config not loadable",
            help="this is a qrc bug; please report it with the recipe. Meanwhile give the layers of the scheme it "
            "names another scheme")) from exc
    return None


def _missing(span: Span | None) -> Diagnostic:
    return error("Q400", "the floating formats (FP8, NVFP4, MX) are written with compressed-tensors, which is not "
                 "installed", span, "compressed-tensors missing", help="pip install -e '.[hf]'")


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return " ".join(line.strip() for line in text[:3]) if text else type(exc).__name__
