"""`qrc plan` on the largest MoE configs people quantize, from config-only folders (no weights): Qwen3-235B-A22B
(94 blocks of 128 experts) and DeepSeek-V3 (58 MoE blocks of 256 experts, MLA), W4A16 on every Linear. Each plan
runs in its own process, as a user runs it; prints its wall time and the layers it planned.

    python bench/plan_large_moe.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from work_folder import work_folder

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    import transformers
    from test_plan import LARGE_MOE, _large_moe_configs

    work = work_folder("qrc-large-moe-")
    print("| config | quantized layers | budget | fits | seconds (each run) |\n|---|---:|---:|---|---|")
    for name, (config, _, ram) in _large_moe_configs(transformers).items():
        config.save_pretrained(work / name)
        recipe = work / f"{name}.recipe"
        recipe.write_text(LARGE_MOE.format(model=work / name, ram=ram, out=work / f"{name}-out"))
        seconds, plan = [], {}
        for _ in range(args.repeat):
            start = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "compiler", "plan", str(recipe), "--format", "json"],
                                  capture_output=True, text=True, cwd=ROOT, check=True)
            seconds.append(time.perf_counter() - start)
            plan = json.loads(done.stdout)
        print(f"| {name} | {plan['quantized_layers']:,} | ram {ram} GiB | {plan['memory']['tried'][0]['fits']} | "
              f"{', '.join(f'{s:.2f}' for s in seconds)} |")


if __name__ == "__main__":
    main()
