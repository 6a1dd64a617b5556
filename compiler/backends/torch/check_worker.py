"""The child process of a file-to-file run's config and load check (check_process.py starts it).

    python -m compiler.backends.torch.check_worker ARCHITECTURE

It imports compressed-tensors and transformers at once and prints the base-model prefix of the class
ARCHITECTURE names (a JSON line: {"prefix": …}), which the parent's output names need. Then it reads one
request line ({"quantization_config", "needs_package", "staged", "source"}), checks the config with
compressed-tensors' schema (config_schema.check_config) and has transformers open the staged folder
(load_check.check_loads), and prints one answer line: each diagnostic by code, message, label and help
(the parent gives them the recipe's spans), which of them was raised, and this process's peak RSS.
Nothing is read from stdin but that request; an empty line or EOF ends it with nothing checked."""

from __future__ import annotations

import contextlib
import importlib
import json
import sys
from pathlib import Path

from compiler.backends import BackendError
from compiler.backends.release import collections_paused
from compiler.backends.rss import own_high_water_mark
from compiler.backends.torch.check_process import class_prefix
from compiler.diagnostics import Diagnostic


def main(argv: list[str]) -> int:
    """Report the prefix, answer one request; the exit status is 0 unless the request could not be read."""
    architecture = argv[0] if argv else ""
    _answer({"prefix": _prefix(architecture)})
    line = sys.stdin.readline()
    if not line.strip():
        return 0
    try:
        request = json.loads(line)
    except ValueError:
        return 1
    _answer(_checked(request))
    return 0


def _prefix(architecture: str) -> str:
    """The class's base-model prefix ('' for no class, as the parent's own lookup gives: loader_names)."""
    with collections_paused():  # nothing the imports make is garbage worth a collection's scan
        with contextlib.suppress(Exception):  # reported where the check needs it (Q421, Q427)
            importlib.import_module("compressed_tensors")  # first: it imports transformers (loader_names)
        try:
            import transformers
        except ImportError:
            return ""
    cls = getattr(transformers, architecture, None) if architecture else None
    return class_prefix(cls)


def _checked(request: dict) -> dict:
    """check_config, then check_loads: what each returned, or the first one's raised error."""
    from compiler.backends.torch.config_schema import check_config
    from compiler.backends.torch.load_check import check_loads

    found: dict = {"config": None, "load": None, "raised": None}
    try:
        found["config"] = _plain(check_config(request["quantization_config"], None, request["needs_package"]))
        if request.get("source"):
            found["load"] = _plain(check_loads(Path(request["staged"]), Path(request["source"]), None))
    except BackendError as exc:
        found["raised"] = _plain(exc.diagnostic)
    found["peak"] = own_high_water_mark()
    return found


def _plain(diagnostic: Diagnostic | None) -> dict | None:
    if diagnostic is None:
        return None
    return {"code": diagnostic.code, "message": diagnostic.message, "label": diagnostic.label,
            "help": diagnostic.help, "error": diagnostic.is_error}


def _answer(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
