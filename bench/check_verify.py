"""qrc's own verification figure and peak, checked outside qrc: compile the tiny-llama W8A8 example, then
run the float and emitted models in a default onnxruntime session on the same held-out samples, and read
the kernel's high-water mark of this process.

    python bench/check_verify.py
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import onnxruntime as ort
from rich.console import Console

from compiler.compile_run import compile_recipe
from compiler.data import verify_batches
from compiler.models import builtin


def main() -> None:
    out = Path(tempfile.mkdtemp(prefix="qrc-check-")) / "m.onnx"
    result, planned = compile_recipe(Path("recipes/tiny-llama-w8a8.recipe"), (), out, Console(quiet=True))
    hwm = int(re.search(r"VmHWM:\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) * 1024
    ir = planned.check.ir
    batches, _ = verify_batches(ir.calibration.data, planned.check.assignment.model, ir.verify.samples, 1)
    reference = ort.InferenceSession(str(builtin.onnx_path(ir.model)), providers=["CPUExecutionProvider"])
    candidate = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    names = {i.name for i in reference.get_inputs()}
    same = total = 0
    for feed in batches:
        feed = {k: v for k, v in feed.items() if k in names}
        a, b = reference.run(None, feed)[0], candidate.run(None, feed)[0]
        same += int((a.argmax(-1) == b.argmax(-1)).sum())
        total += a.shape[0] * a.shape[1]
    print(f"top-1: qrc {result.verify['top1']:.4f}, onnxruntime {same / total:.4f}")
    print(f"peak: qrc sampled {result.peak_rss / 2**20:.1f} MiB, kernel VmHWM {hwm / 2**20:.1f} MiB, "
          f"planned {planned.plan.peak_bytes / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
