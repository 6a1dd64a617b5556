"""Run by bench/real_quality.py with the interpreter of a venv that has AutoRound (`auto-round`; its pins are
its own): W4A16 (symmetric int4 weights in groups, every Linear but lm_head) on the token ids of an npz (the
samples qrc calibrates on), saved in compressed-tensors' layout (AutoRound's `llm_compressor` format), which
transformers' default load runs without AutoRound installed. Prints the seconds AutoRound took.

    VENV/bin/python bench/autoround_calibrated.py MODEL_FOLDER CALIBRATION.npz MODE OUT [GROUP [BITS]]

MODE: `default` (sign-SGD learned rounding, its default iterations: 200), `light` (its CLI's light preset: 50
iterations at learning rate 5e-3; the calibration rows stay ours) or `rtn` (`iters=0`, its RTN mode: a scale
search per group weighted by each input column's mean square over the calibration tokens, its imatrix).
GROUP: the group size (default 64); BITS: the integer width (default 4). MODEL_FOLDER holds the float model and its tokenizer.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

MODES: dict[str, dict] = {"default": {}, "light": {"iters": 50, "lr": 5e-3}, "rtn": {"iters": 0}}


def _flatten(out: Path) -> None:
    """AutoRound writes into a folder it names inside OUT (`<model>-w4g64`): move that folder's files to OUT."""
    if (out / "config.json").exists():
        return
    inner = next(p.parent for p in out.rglob("config.json"))
    for item in inner.iterdir():
        shutil.move(str(item), str(out / item.name))
    inner.rmdir()


def main() -> None:
    import numpy as np
    import torch
    import transformers
    from auto_round import AutoRound

    folder, calibration, mode, out = sys.argv[1:5]
    group = int(sys.argv[5]) if len(sys.argv) > 5 else 64
    bits = int(sys.argv[6]) if len(sys.argv) > 6 else 4
    if mode not in MODES:
        raise SystemExit(f"MODE is one of {', '.join(MODES)}, not {mode!r}")
    ids = np.load(calibration)["input_ids"]
    start = time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    rows = [torch.from_numpy(row[None].copy()) for row in ids]  # one [1, seqlen] tensor per sample, as given
    more = MODES[mode]
    rounder = AutoRound(model, tokenizer=tokenizer, scheme=f"W{bits}A16", bits=bits, group_size=group, sym=True,
                        dataset=rows, nsamples=len(rows), seqlen=ids.shape[1], device_map="cpu", **more)
    rounder.quantize_and_save(out, format="llm_compressor")
    _flatten(Path(out))
    print(f"autoround {mode}: {time.perf_counter() - start:.1f} s", flush=True)


if __name__ == "__main__":
    main()
