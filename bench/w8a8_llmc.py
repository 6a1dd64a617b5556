"""Static W8A8 (int8 weights per channel, int8 inputs per tensor, static) side by side: qrc (in `--mode`) with
its default and each named calibration method, and llm-compressor's QuantizationModifier with its moving-average `minmax`
observer (bench/llmc_calibrated.py w8a8-static), on one random-weight Llama, the same calibration token ids, the same CPU.

    python bench/w8a8_llmc.py --llmcompressor VENV/bin/python [--hidden 1024] [--layers 8] [--samples 32]
                              [--seqlen 256] [--methods default minmax percentile mse] [--mode full]
                              [--repeat 2] [--heldout 4]

Each tool runs in its own process: wall time and peak RSS include loading and saving. Quality is measured
outside both, with activations really quantized: transformers loads each folder (compressed-tensors
dequantizes the weights) and the bench's hooks quantize every Linear's input with the folder's own
input_scale and input_zero_point (bench/transforms.py activation_hooks); KL(float ‖ quantized), cosine and
top-1 agreement on 16 held-out samples of the same length. Prints one markdown table.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from float_formats import independent, model_folder, perplexity_cell  # noqa: E402
from gptq_llmc import calibration_ids, run  # noqa: E402
from transforms import activation_hooks  # noqa: E402

RECIPE = """recipe w8a8 {{
    model "{model}"
    quantize {{ type Linear -> W8A8_STATIC  "lm_head" -> none }}
    calibrate {{ data npz "{npz}"  chunk 8  {method} }}
    memory {{ mode {mode}  disk "{disk}" }}
    emit "{out}"
}}
"""


def main() -> None:

    parser = argparse.ArgumentParser()
    parser.add_argument("--llmcompressor", help="python of a venv with llm-compressor installed")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--seqlen", type=int, default=256)
    parser.add_argument("--methods", nargs="+", default=["default", "minmax", "percentile", "mse"],
                        help="qrc's calibration methods (`default`: no `method` written, qrc's default)")
    parser.add_argument("--mode", default="offload")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each tool, alternating; the best time is reported")
    parser.add_argument("--heldout", type=int, default=1,
                        help="sets of 16 held-out samples (other seeds): KL as mean ± standard deviation over them")
    args = parser.parse_args()
    folder = model_folder(args.hidden, args.layers, vocab=32000, kv_heads=args.hidden // 64, positions=2048)
    print(f"random Llama {args.layers} blocks, hidden {args.hidden}, static W8A8, {args.samples} × {args.seqlen} "
          "tokens\n")
    print("| tool | wall s | peak RSS MiB | KL | cosine | top-1 | perplexity on the shipped text (vs float) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        npz = calibration_ids(Path(tmp), args.samples, args.seqlen)
        jobs = []
        for method in args.methods:
            out = Path(tmp) / f"qrc-{method}"
            recipe = Path(tmp) / f"{method}.recipe"
            recipe.write_text(RECIPE.format(model=folder, npz=npz, mode=args.mode, disk=Path(tmp) / "disk", out=out,
                                            method="" if method == "default" else f"method {method}"))
            jobs.append((f"qrc {args.mode}, " + ("the default method" if method == "default" else f"method {method}"),
                         [sys.executable, "-m", "compiler", "compile", str(recipe)], out))
        if args.llmcompressor:
            theirs = Path(tmp) / "llmc"
            jobs.append(("llm-compressor QuantizationModifier (minmax: moving average)",
                         [args.llmcompressor, str(ROOT / "bench" / "llmc_calibrated.py"), str(folder), str(npz),
                          "w8a8-static", str(theirs)], theirs))
        timings: dict[str, list[tuple[float, float]]] = {name: [] for name, _, _ in jobs}
        for _ in range(args.repeat):  # alternating: a slow spell of the machine falls on every tool
            for name, command, _ in jobs:
                timings[name].append(run(command))
        for name, _, out in jobs:
            sets = [independent(folder, out, vocab=32000, seqlen=args.seqlen, seed=99 + i,
                                prepare=lambda model, out=out: activation_hooks(model, out)) for i in range(args.heldout)]
            kl = np.array([f["kl"] for f in sets])
            spread = f" ± {kl.std(ddof=1):.5f}" if len(kl) > 1 else ""
            f, seconds, peak = sets[0], min(s for s, _ in timings[name]), max(p for _, p in timings[name])
            print(f"| {name} | {seconds:.1f} | {peak:,.0f} | {kl.mean():.5f}{spread} | {f['cosine']:.5f} | "
                  f"{f['top1']:.4f} | {perplexity_cell(f)} |", flush=True)
        print()
        for name, _, _ in jobs:
            print(f"{name}: runs of {', '.join(f'{s:.1f}' for s, _ in timings[name])} s")


if __name__ == "__main__":
    main()
