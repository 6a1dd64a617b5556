"""A bench-size MoE in offload: qrc's GPTQ W4A16 beside llm-compressor's `oneshot`, same model, same data.

    python bench/moe_offload.py [--blocks 8] [--experts 16] [--hidden 512] [--llmcompressor PYTHON]

The model is a Qwen3-MoE built by transformers from a config with seeded random weights and saved with
`save_pretrained` (per-expert tensors, as on the Hub) to $QRC_CACHE/bench/. Calibration is 32 samples of
256 token ids drawn once by qrc's synthetic source and saved as an npz, which both tools read. Each tool
runs in its own process: wall time and peak RSS (the kernel's VmHWM). Quality is measured outside both
tools: transformers loads the float folder and each output (compressed-tensors dequantizes it) and the
KL divergence of the next-token distributions is taken on 8 held-out samples. qrc's own figures (its
plan's peak, its sampled peak, its verify KL) are printed beside the independent ones.

llm-compressor pins transformers ≤ 5.17 and compressed-tensors 0.19, so it lives in its own venv:
`python -m venv V && V/bin/pip install torch==2.13.0 llmcompressor`, then `--llmcompressor V/bin/python`.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SAMPLES, SEQLEN, CHUNK, HELD_OUT = 32, 256, 8, 8


def checkpoint(blocks: int, experts: int, hidden: int) -> Path:
    """A Qwen3-MoE folder with seeded random weights (transformers builds and saves it)."""
    import torch
    import transformers

    from compiler.models.builtin import cache_dir

    folder = cache_dir() / "bench" / f"qwen3moe-b{blocks}-e{experts}-h{hidden}"
    if (folder / "model.safetensors").exists():
        return folder
    config = transformers.Qwen3MoeConfig(
        vocab_size=8192, hidden_size=hidden, intermediate_size=hidden * 2, moe_intermediate_size=hidden // 2,
        num_hidden_layers=blocks, num_attention_heads=hidden // 64, num_key_value_heads=hidden // 128, head_dim=64,
        num_experts=experts, num_experts_per_tok=2, max_position_embeddings=1024, tie_word_embeddings=False)
    torch.manual_seed(0)
    transformers.Qwen3MoeForCausalLM(config).eval().save_pretrained(folder)
    return folder


def token_data(folder: Path, tmp: Path) -> tuple[Path, Path, Path]:
    """Token ids from qrc's synthetic source, saved as npz: all of them (qrc calibrates on the first
    SAMPLES and verifies on the rest), the calibration ones (llm-compressor), the held-out ones."""
    from compiler import check_file

    probe = tmp / "probe.recipe"
    probe.write_text(f'recipe probe {{\n model "{folder}"\n backend torch\n quantize {{ type Linear -> W4A16 }}\n'
                     f' calibrate {{ data synthetic {{ samples {SAMPLES + HELD_OUT} seqlen {SEQLEN} }} }}\n}}\n')
    checked = check_file(probe, with_model=True)
    from compiler.data import calibration_batches

    feeds = list(calibration_batches(checked.ir.calibration.data, checked.assignment.model, SAMPLES + HELD_OUT))
    ids = np.concatenate([f["input_ids"] for f in feeds])
    every, calibration, held_out = tmp / "all.npz", tmp / "calibration.npz", tmp / "held_out.npz"
    for path, part in ((every, ids), (calibration, ids[:SAMPLES]), (held_out, ids[SAMPLES:])):
        np.savez(path, input_ids=part, attention_mask=np.ones_like(part))
    return every, calibration, held_out


QRC_CHILD = """
import atexit, json, re, sys
from pathlib import Path
from rich.console import Console
from compiler.compile_run import compile_recipe
atexit.register(lambda: print('HWM', re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)))
result, planned = compile_recipe(Path(sys.argv[1]), (), None, Console(file=open('/dev/null', 'w')))
print('RESULT', json.dumps({'planned': planned.plan.peak_bytes, 'sampled': result.peak_rss,
                            'kld': (result.verify or {}).get('kld')}))
"""

# llm-compressor in its own process; an optional argv[6] `routed` turns its all-experts calibration (its default) off
LLMC_CHILD = """
import atexit, re, sys
import numpy as np
atexit.register(lambda: print('HWM', re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)))
from datasets import Dataset
from transformers import AutoModelForCausalLM
from llmcompressor import oneshot
from llmcompressor.modifiers.quantization import GPTQModifier
folder, data, out = sys.argv[1:4]
arrays = np.load(data)
dataset = Dataset.from_dict({k: arrays[k].tolist() for k in ('input_ids', 'attention_mask')})
model = AutoModelForCausalLM.from_pretrained(folder, dtype='float32')
recipe = GPTQModifier(targets='Linear', scheme='W4A16', ignore=['lm_head', 're:.*mlp.gate$'])
oneshot(model=model, dataset=dataset, recipe=recipe, max_seq_length=int(sys.argv[4]), num_calibration_samples=int(sys.argv[5]),
        moe_calibrate_all_experts=sys.argv[6:7] != ['routed'], output_dir=out)
"""


def run(command: list[str]) -> dict:
    """Run one tool in its own process: wall seconds, VmHWM, and the RESULT line it prints (if any)."""
    start = time.perf_counter()
    out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    found: dict = {"seconds": time.perf_counter() - start}
    if out.returncode != 0:
        found["error"] = (out.stderr.strip().splitlines() or ["?"])[-1][:160]
        return found
    result = re.search(r"RESULT (.*)", out.stdout)
    if result:
        found.update(json.loads(result.group(1)))
    found["hwm"] = int(re.search(r"HWM (\d+)", out.stdout).group(1)) * 1024
    return found


def recipe(folder: Path, data: Path, tmp: Path) -> Path:
    path = tmp / "qrc.recipe"
    path.write_text(
        f'recipe bench_moe {{\n model "{folder}"\n backend torch\n scheme w4 = W4A16 {{ group 128  rounding gptq }}\n'
        ' quantize {\n  type Linear -> w4\n  "lm_head" -> none\n  re".*\\.mlp\\.gate" -> none\n }\n'
        f' calibrate {{ data npz "{data}" {{ samples {SAMPLES} }}  chunk {CHUNK} }}\n'
        f' memory {{ mode offload  disk "{tmp / "cache"}" }}\n verify {{ samples {HELD_OUT}  metric kld  at_most 1 }}\n'
        f' emit "{tmp / "qrc-out"}"\n}}\n')
    return path


def kl_divergence(float_folder: Path, output: Path, held_out: Path) -> float:
    """Mean KL(float ‖ quantized) of the next-token distributions, measured in transformers."""
    import torch
    import transformers

    arrays = np.load(held_out)
    reference = transformers.AutoModelForCausalLM.from_pretrained(str(float_folder)).eval()
    quantized = transformers.AutoModelForCausalLM.from_pretrained(
        str(output), quantization_config=transformers.CompressedTensorsConfig(dequantize=True)).eval()
    total = 0.0
    with torch.no_grad():
        for row in range(arrays["input_ids"].shape[0]):
            feed = {k: torch.from_numpy(arrays[k][row:row + 1]) for k in ("input_ids", "attention_mask")}
            p = torch.log_softmax(reference(**feed).logits.float(), -1)
            q = torch.log_softmax(quantized(**feed).logits.float(), -1)
            total += float((p.exp() * (p - q)).sum(-1).mean())
    return total / arrays["input_ids"].shape[0]


def packed_experts(output: Path) -> int:
    """How many expert projections the output stores as packed int4 (compressed-tensors `weight_packed`)."""
    from safetensors import safe_open

    count = 0
    for path in output.glob("*.safetensors"):
        with safe_open(str(path), "np") as handle:
            count += sum(1 for k in handle.keys() if ".experts." in k and k.endswith(".weight_packed"))
    return count


def model_arguments(description: str) -> argparse.Namespace:
    """The MoE benches' command line: the model's size (checkpoint()) and llm-compressor's interpreter."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--experts", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--llmcompressor", help="a python with llmcompressor installed (its own venv)")
    return parser.parse_args()


def main() -> None:
    args = model_arguments(__doc__.splitlines()[0])
    folder = checkpoint(args.blocks, args.experts, args.hidden)
    size = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    mib = 2**20
    print(f"checkpoint {folder} ({size / mib:,.0f} MiB float32, {args.blocks} blocks × {args.experts} experts, "
          f"hidden {args.hidden}); GPTQ W4A16 g128, {SAMPLES} samples × {SEQLEN} tokens; KL on {HELD_OUT} held out\n")
    print("| tool | wall s | peak RSS (VmHWM) | tool's own figures | int4 experts | KL (transformers) |")
    print("|---|---:|---:|---|---:|---:|")
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        every, calibration, held_out = token_data(folder, tmp)
        r = run([sys.executable, "-c", QRC_CHILD, str(recipe(folder, every, tmp))])
        if "error" in r:
            print(f"| qrc offload | {r['seconds']:.1f} | failed: {r['error']} | | | |")
        else:
            own = (f"plan {r['planned'] / mib:,.0f} MiB (VmHWM/plan {r['hwm'] / r['planned']:.2f}×), "
                   f"sampled {r['sampled'] / mib:,.0f} MiB, verify KL {r['kld']:.4g}")
            print(f"| qrc offload | {r['seconds']:.1f} | {r['hwm'] / mib:,.0f} MiB | {own} "
                  f"| {packed_experts(tmp / 'qrc-out')} | {kl_divergence(folder, tmp / 'qrc-out', held_out):.4g} |",
                  flush=True)
        if args.llmcompressor:
            r = run([args.llmcompressor, "-c", LLMC_CHILD, str(folder), str(calibration), str(tmp / "llmc-out"),
                     str(SEQLEN), str(SAMPLES)])
            if "error" in r:
                print(f"| llm-compressor oneshot | {r['seconds']:.1f} | failed: {r['error']} | | | |")
            else:
                print(f"| llm-compressor oneshot | {r['seconds']:.1f} | {r['hwm'] / mib:,.0f} MiB | | "
                      f"{packed_experts(tmp / 'llmc-out')} | {kl_divergence(folder, tmp / 'llmc-out', held_out):.4g} |")


if __name__ == "__main__":
    main()
