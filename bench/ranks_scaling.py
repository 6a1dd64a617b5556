"""Weak scaling of a compile shared by torchrun's ranks: GPTQ W4A16 (group 128) with calibration on the 168M
bench Llama, one process against N ranks, each process held to the same threads (OMP_NUM_THREADS), so N ranks
have N times the resources of one: their throughput should be close to N times one process's.

    python bench/ranks_scaling.py [--ranks 2] [--threads 1] [--rounds 2] [--hidden 1024] [--layers 8]
                                  [--samples 32] [--seqlen 256] [--mode offload]

Each run is a child process (torchrun for N ranks), runs alternate, the best wall time of `--rounds` counts.
Then the same-bytes check: qrc's static W8A8 (observers, minmax) on the same model and ids, one process
against N ranks, every file compared; and GPTQ's quality both ways, measured outside qrc (transformers loads
each folder: KL against float on held-out ids). Prints markdown tables."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))  # qrc itself, also where the repository is not installed (the children get PYTHONPATH)
from float_formats import independent, model_folder  # noqa: E402  (the bench Llama and the outside measurement)
from gptq_llmc import calibration_ids  # noqa: E402  (the same ids as the llm-compressor comparison)

GPTQ = """recipe gptq {{
    model "{model}"
    backend torch
    quantize {{ type Linear -> s  "lm_head" -> none }}
    scheme s = W4A16 {{ rounding gptq }}
    calibrate {{ data npz "{npz}"  chunk 8 }}
    memory {{ mode {mode}  disk "{disk}" }}
    emit "{out}"
}}
"""

W8A8 = """recipe w8a8 {{
    model "{model}"
    backend torch
    quantize {{ type Linear -> W8A8  "lm_head" -> none }}
    calibrate {{ data npz "{npz}"  chunk 8  method minmax }}
    memory {{ mode {mode}  disk "{disk}" }}
    emit "{out}"
}}
"""


def compile_run(recipe: Path, out: Path, ranks: int, threads: int) -> tuple[float, float]:
    """(wall s, qrc's own total s from its summary) of one compile."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"] \
        if ranks > 1 else [sys.executable]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    child = subprocess.Popen([*launcher, "-m", "compiler", "compile", str(recipe), "-o", str(out)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = child.communicate()
    wall = time.perf_counter() - start
    if child.returncode != 0:
        raise SystemExit(f"compile on {ranks} rank(s) failed:\n{stderr[-3000:]}")
    found = re.search(r"\(total ([0-9.]+) s\)", stdout)
    return wall, float(found.group(1)) if found else float("nan")


def same_files(one: Path, two: Path) -> str:
    """'identical' or what differs."""
    names = sorted(p.name for p in one.iterdir())
    if names != sorted(p.name for p in two.iterdir()):
        return f"different files: {names} vs {sorted(p.name for p in two.iterdir())}"
    differ = [n for n in names if (one / n).read_bytes() != (two / n).read_bytes()]
    return "identical" if not differ else "differ: " + ", ".join(differ)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of every process")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--seqlen", type=int, default=256)
    parser.add_argument("--mode", default="offload", choices=["offload", "low_memory", "full"])
    args = parser.parse_args()

    folder = model_folder(args.hidden, args.layers, vocab=32000)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        npz = calibration_ids(work, args.samples, args.seqlen)
        recipes = {}
        for name, text in (("gptq", GPTQ), ("w8a8", W8A8)):
            recipes[name] = work / f"{name}.recipe"
            recipes[name].write_text(text.format(model=folder, npz=npz, mode=args.mode, disk=work / "disk",
                                                 out=work / "unused"))
        print(f"random Llama {args.layers} blocks, hidden {args.hidden}, GPTQ W4A16 g128, {args.samples} × "
              f"{args.seqlen} tokens, mode {args.mode}; {args.threads} thread(s) per process, best of "
              f"{args.rounds} alternating runs\n")
        best: dict[int, tuple[float, float]] = {}
        for _ in range(args.rounds):
            for ranks in (1, args.ranks):
                measured = compile_run(recipes["gptq"], work / f"gptq-{ranks}", ranks, args.threads)
                if ranks not in best or measured[0] < best[ranks][0]:
                    best[ranks] = measured
                print(f"  {ranks} rank(s): {measured[0]:.1f} s wall, qrc total {measured[1]:.1f} s", flush=True)
        base = best[1][0]
        # wall: from the launch to the last process's exit (torchrun's own start and rendezvous included);
        # qrc total: the compile's own time, from its summary (the first rank's)
        print("\n| GPTQ | wall s | qrc total s | speedup (wall) | speedup (qrc total) | goal |")
        print("|---|---:|---:|---:|---:|---:|")
        for ranks, (wall, total) in sorted(best.items()):
            goal = f"≥ {0.8 * ranks:.1f}×" if ranks > 1 else ""
            print(f"| {ranks} rank(s) × {args.threads} thread(s) | {wall:.1f} | {total:.1f} | {base / wall:.2f}× | "
                  f"{best[1][1] / total:.2f}× | {goal} |")
        print("\n| output | KL vs float (transformers, held-out) | cosine | top-1 |")
        print("|---|---:|---:|---:|")
        for ranks in sorted(best):
            f = independent(folder, work / f"gptq-{ranks}", vocab=32000, seqlen=args.seqlen)
            print(f"| GPTQ, {ranks} rank(s) | {f['kl']:.5f} | {f['cosine']:.5f} | {f['top1']:.4f} |")
        for ranks in (1, args.ranks):
            compile_run(recipes["w8a8"], work / f"w8a8-{ranks}", ranks, args.threads)
        print(f"\nW8A8 static (minmax observers), 1 process against {args.ranks} ranks: "
              f"{same_files(work / 'w8a8-1', work / f'w8a8-{args.ranks}')}")


if __name__ == "__main__":
    main()
