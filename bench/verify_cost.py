"""What `verify` costs on the torch backend, for two source trees side by side (e.g. before and after a
change): each recipe compiled without and with `verify`, every compile in its own process, alternating
trees, best of `--repeats`; verify's cost is the difference. Also prints what each run's verify measured.

    git worktree add /tmp/qrc-before <commit>
    python bench/verify_cost.py --trees /tmp/qrc-before . [--layers 8] [--hidden 1024] [--modes full offload]

The checkpoint is bench/torch_modes.py's random Llama (float32, written once to $QRC_CACHE/bench/).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from torch_modes import checkpoint  # noqa: E402

RECIPE = """recipe cost {{
    model "{model}"
    backend torch
    scheme s = {scheme}
    quantize {{ "model.layers.*" -> s }}
    calibrate {{ data synthetic {{ samples {samples}  seqlen {seqlen} }}  chunk {chunk} }}
    memory {{ mode {mode}{ram} }}
    {verify}
    emit "{out}"
}}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", nargs=2, required=True, help="two source trees: before, after")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--modes", nargs="+", default=["full", "offload"])
    parser.add_argument("--scheme", default="W8A8")
    parser.add_argument("--samples", type=int, default=16, help="verify samples (calibration uses as many)")
    parser.add_argument("--seqlen", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--ram", default="", help='a `ram` budget for every recipe, e.g. "4 GiB" (qrc then keeps '
                        "large blocks mapped, so freed memory leaves the process: the plan is a promise, Q302)")
    args = parser.parse_args()
    model = checkpoint(args.layers, args.hidden)
    print(f"random Llama, {args.layers} layers, hidden {args.hidden}, {args.scheme}, {args.samples} × {args.seqlen} "
          f"samples, best of {args.repeats}" + (f", ram {args.ram}" if args.ram else "") + "\n")
    print("| mode | tree | compile without verify (s) | with verify (s) | verify costs (s) | verify measured on | cosine "
          "| peak RSS with verify: measured / planned |")
    print("|---|---|---:|---:|---:|---|---:|---|")
    for mode in args.modes:
        costs = []
        for tree in args.trees:
            plain = min(_compile(tree, model, mode, args, False)[0] for _ in range(args.repeats))
            runs = [_compile(tree, model, mode, args, True) for _ in range(args.repeats)]
            best = min(runs, key=lambda r: r[0])
            costs.append(best[0] - plain)
            print(f"| {mode} | {tree} | {plain:.1f} | {best[0]:.1f} | {best[0] - plain:.1f} | {best[1]} | {best[2]:.5f} "
                  f"| {best[3]} |", flush=True)
        print(f"| {mode} | ratio after / before | | | {costs[1] / max(costs[0], 1e-9):.2f}× | | | |", flush=True)


def _compile(tree: str, model: Path, mode: str, args, verify: bool) -> tuple[float, str, float, str]:
    """One compile in its own process: (wall seconds, what verify measured, cosine, peak RSS against plan)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        clause = f"verify {{ samples {args.samples}  metric cosine  at_least 0 }}" if verify else ""
        recipe = Path(tmp) / "r.recipe"
        recipe.write_text(RECIPE.format(model=model, scheme=args.scheme, samples=args.samples, seqlen=args.seqlen,
                                        chunk=4, mode=mode, verify=clause, out=out,
                                        ram=f"  ram {args.ram}" if args.ram else ""))
        env = dict(os.environ, PYTHONPATH=str(Path(tree).resolve()), COLUMNS="400")
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "compiler", "compile", str(recipe)],
                              env=env, capture_output=True, text=True, cwd=tree)
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            raise SystemExit(f"{tree} {mode}: {done.stdout[-2000:]}{done.stderr[-2000:]}")
        text = " ".join((done.stdout + done.stderr).split())
        measured = "the emitted folder" if "measured on the emitted folder" in text else ("qrc's model" if verify else "")
        found = re.search(r"passed: cosine ([0-9.]+)", text)
        peak = re.search(r"peak RSS (.+?) measured vs (.+?) planned \(([0-9.]+)×\)", text)
        rss = f"{peak.group(1).strip('│ ')} / {peak.group(2)} ({peak.group(3)}×)" if peak else "?"
        return seconds, measured, float(found.group(1)) if found else float("nan"), rss


if __name__ == "__main__":
    main()
