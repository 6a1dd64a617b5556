"""A bench's scratch folder: made under the system's temporary folder, removed when the bench's process ends
(normally or by an exception), so a sitting does not leave its models behind (the real SmolLM2's benches wrote
0.8-1.4 GB each). QRC_BENCH_KEEP=1 keeps it and says where, to look at the outputs afterwards."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path


def work_folder(prefix: str) -> Path:
    """A new empty folder named with `prefix`, removed at the process's exit unless QRC_BENCH_KEEP is set."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    if os.environ.get("QRC_BENCH_KEEP", "") not in ("", "0"):
        atexit.register(lambda: print(f"kept {folder} (QRC_BENCH_KEEP)", file=sys.stderr))
    else:
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder
