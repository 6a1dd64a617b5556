"""The export runs in a child process. torch, transformers and the exporter's state (half a GiB and more,
which the allocator does not hand back) then leave with it, so the compile that follows holds only what
its own plan counts; and a crash inside the exporter becomes a diagnostic instead of ending the compile.
The child's memory is measured as the compile's: sampled while it runs, and its high-water mark on top
of the parent's RSS at the end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from compiler.backends import BackendError
from compiler.diagnostics import error

MARK = "QRC-EXPORT "  # the child's one report line on stdout (libraries may print too)


def export_in_child(folder: Path, out: Path, span) -> None:
    """Export `folder` to `out` in a child process; its diagnostics are raised here as BackendError."""
    from compiler.backends.rss import following, own_rss, record_child_peak

    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[3])  # `compiler` importable without an install
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    command = [sys.executable, "-m", "compiler.backends.onnx.export_child", str(folder), str(out)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as child:
        try:
            with following(child.pid):
                stdout, stderr = child.communicate()
        except BaseException:  # Ctrl-C or SIGTERM: the child must not outlive the compile
            child.kill()
            raise
    report = _report(stdout)
    if "code" in report:
        raise BackendError(error(report["code"], report["message"], span, report["label"], help=report["help"]))
    if child.returncode != 0 or not out.exists():
        last = (stderr.strip().splitlines() or [f"the exporter ended with status {child.returncode}"])[-1][:300]
        log = Path(tempfile.gettempdir()) / f"qrc-export-{folder.name}.log"
        log.write_text(stderr)
        raise BackendError(error("Q424", f"the ONNX export of `{folder}` failed: {last}", span, "export failed",
                                 help=f"the exporter's messages are in {log}; compile the folder with `backend "
                                      "torch`, or export it yourself and compile the .onnx file"))
    record_child_peak(int(report.get("high_water", 0)), own_rss())


def _report(stdout: str) -> dict:
    lines = [line[len(MARK):] for line in stdout.splitlines() if line.startswith(MARK)]
    try:
        return json.loads(lines[-1]) if lines else {}
    except json.JSONDecodeError:
        return {}
