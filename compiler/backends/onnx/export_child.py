"""The child process of an ONNX export (`python -m compiler.backends.onnx.export_child FOLDER OUT`): it runs the
export and prints one report line that compiler/backends/onnx/export_process.py reads."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from compiler.backends import BackendError
from compiler.backends.onnx.export import export_now
from compiler.backends.onnx.export_process import MARK
from compiler.backends.rss import own_high_water_mark


def _child(folder: Path, out: Path) -> int:
    """The child's work: the export, then one report line (its high-water mark, or a diagnostic)."""
    try:
        export_now(folder, out)
    except BackendError as exc:
        d = exc.diagnostic
        print(MARK + json.dumps({"code": d.code, "message": d.message, "label": d.label, "help": d.help}), flush=True)
        return 3
    print(MARK + json.dumps({"high_water": own_high_water_mark()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_child(Path(sys.argv[1]), Path(sys.argv[2])))
