"""GPTQ W4A16 (group 128) side by side: qrc (offload and full) and llm-compressor's GPTQModifier, on one
random-weight Llama, the same calibration token ids, the same CPU.

    python bench/gptq_llmc.py --llmcompressor VENV/bin/python [--hidden 1024] [--layers 8] [--samples 32]
                              [--seqlen 256] [--groups updated_groups static_groups] [--act-order] [--heldout N]
                              [--modes auto offload full] [--repeat N]
                              [--scales mse_scales minmax_scales] [--llmc-observers minmax mse]

Each tool runs in its own process (llm-compressor in its own venv, bench/llmc_calibrated.py gptq): wall time and peak
RSS (the child's ru_maxrss) include loading and saving. Quality is measured outside both: transformers loads
each folder (compressed-tensors dequantizes it) and compares its logits with float's on 16 held-out samples
of the same length: KL(float ‖ quantized), cosine and top-1 agreement. Prints one markdown table.
"""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from float_formats import independent, model_folder, perplexity_cell  # noqa: E402  (the same model builder and measurement)

RECIPE = """recipe gptq {{
    model "{model}"
    quantize {{ type Linear -> s  "lm_head" -> none }}
    scheme s = W4A16 {{ rounding gptq {groups} }}
    calibrate {{ data npz "{npz}"  chunk 8 }}
    memory {{ mode {mode}  disk "{disk}" }}
    emit "{out}"
}}
"""


def run(command: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of a child process."""
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    if status != 0:
        raise SystemExit(f"{command[:3]} failed:\n{child.stderr.read()[-3000:]}")
    return seconds, usage.ru_maxrss / 1024


def calibration_ids(folder: Path, samples: int, seqlen: int, vocab: int = 32000) -> Path:
    """`folder/calibration.npz`: seeded random token ids (and a mask of ones), what both tools calibrate on."""
    import numpy as np

    npz = folder / "calibration.npz"
    ids = np.random.default_rng(7).integers(0, vocab, (samples, seqlen), dtype=np.int64)
    np.savez(npz, input_ids=ids, attention_mask=np.ones_like(ids))
    return npz


def main() -> None:
    import numpy as np

    parser = argparse.ArgumentParser()
    parser.add_argument("--llmcompressor", help="python of a venv with llm-compressor installed (else qrc only)")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--seqlen", type=int, default=256)
    parser.add_argument("--modes", nargs="*", default=["offload", "full"], help="qrc's memory modes (none: qrc not run)")
    parser.add_argument("--groups", nargs="+", default=["updated_groups"], choices=["updated_groups", "static_groups"],
                        help="qrc's group-scale variants to run (llm-compressor 0.14 fixes them from the float weight)")
    parser.add_argument("--scales", nargs="+", default=["mse_scales"], choices=["mse_scales", "minmax_scales"],
                        help="how qrc chooses GPTQ's scales: the Hessian-weighted least-squares shrink of the "
                             "range (its default), or the min/max range (what llm-compressor's default observer does)")
    parser.add_argument("--llmc-observers", nargs="+", default=["minmax"], choices=["minmax", "mse"],
                        help="llm-compressor's weight observers to run: its default min/max, and memoryless_mse")
    parser.add_argument("--act-order", action="store_true",
                        help="both tools take columns by decreasing Hessian diagonal (qrc `act_order`, which needs "
                             "static_groups; llm-compressor's default actorder=static)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs of every tool, alternating (qrc, llm-compressor, qrc, ...): the best wall time "
                             "of each is reported, with the largest peak")
    parser.add_argument("--heldout", type=int, default=1,
                        help="sets of 16 held-out samples (other seeds): KL as mean ± standard deviation over them")
    args = parser.parse_args()
    folder = model_folder(args.hidden, args.layers, vocab=32000, kv_heads=args.hidden // 64, positions=2048)
    print(f"random Llama {args.layers} blocks, hidden {args.hidden}, GPTQ W4A16 g128, "
          f"{args.samples} × {args.seqlen} tokens\n")
    print("| tool | wall s | peak RSS MiB | KL | cosine | top-1 | perplexity on the shipped text (vs float) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        npz = calibration_ids(Path(tmp), args.samples, args.seqlen)
        jobs = []
        for groups, scales, mode in itertools.product(args.groups, args.scales, args.modes):
            out = Path(tmp) / f"qrc-{mode}-{groups}-{scales}"
            recipe = Path(tmp) / f"{mode}-{groups}-{scales}.recipe"
            options = f"{groups} {scales}" + (" act_order" if args.act_order else "")
            recipe.write_text(RECIPE.format(model=folder, npz=npz, mode=mode, disk=Path(tmp) / "disk", out=out,
                                            groups=options))
            jobs.append((f"qrc {mode}, {options.replace(' ', ', ')}",
                         [sys.executable, "-m", "compiler", "compile", str(recipe)], out))
        for observer in args.llmc_observers if args.llmcompressor else []:
            theirs = Path(tmp) / f"llmc-{observer}"
            method = "gptq-actorder" if args.act_order else {"minmax": "gptq", "mse": "gptq-mse"}[observer]
            name = "llm-compressor GPTQModifier" + (", actorder static" if args.act_order else "") + \
                (", memoryless_mse observer" if observer == "mse" else "")
            jobs.append((name, [args.llmcompressor, str(ROOT / "bench" / "llmc_calibrated.py"), str(folder),
                                str(npz), method, str(theirs)], theirs))
        timings: dict[str, list[tuple[float, float]]] = {name: [] for name, _, _ in jobs}
        for _ in range(args.repeat):  # alternating: a slow spell of the machine falls on every tool
            for name, command, _ in jobs:
                timings[name].append(run(command))
        rows = [(name, min(s for s, _ in timings[name]), max(p for _, p in timings[name]), out)
                for name, _, out in jobs]
        for name, seconds, peak, out in rows:
            sets = [independent(folder, out, vocab=32000, seqlen=args.seqlen, seed=99 + i) for i in range(args.heldout)]
            kl = np.array([f["kl"] for f in sets])
            spread = f" ± {kl.std(ddof=1):.5f}" if len(kl) > 1 else ""
            f = sets[0]
            print(f"| {name} | {seconds:.1f} | {peak:,.0f} | {kl.mean():.5f}{spread} | {f['cosine']:.5f} | "
                  f"{f['top1']:.4f} | {perplexity_cell(f)} |", flush=True)
        print()
        for name, _, _ in jobs:
            print(f"{name}: runs of {', '.join(f'{s:.1f}' for s, _ in timings[name])} s")
        theirs = next((seconds for name, seconds, _, _ in rows if name.startswith("llm-compressor")), None)
        for name, seconds, _, _ in rows if theirs else []:
            if name.startswith("qrc"):
                print(f"{name}: {seconds / theirs:.2f}× the wall time of {jobs[-len(args.llmc_observers)][0]} "
                      f"(best of {args.repeat} each)")


if __name__ == "__main__":
    main()
