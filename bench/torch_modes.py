"""The torch backend's memory modes side by side on a random-initialised Llama-style checkpoint.

    python bench/torch_modes.py [--layers 24] [--hidden 1024] [--rounding rtn gptq] [--modes full low_memory offload]
                                [--ram "2 GiB"]

`--ram` puts that budget in every recipe; with `--modes auto` the plan chooses the mode (and Q301 names a
chunk that fits when none does).

The checkpoint (transformers LlamaConfig, random float32 weights, about 1.5 GB at the defaults) is written
once to $QRC_CACHE/bench/ with qrc's streaming safetensors writer. Every compile runs in its own process:
wall time, peak RSS (VmHWM) and the plan's estimate for the mode it ran. Prints one markdown table, then
the largest RSS sampled in each tenth of each compile (a drift from block to block shows there).
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

ROOT = Path(__file__).resolve().parents[1]
SAMPLES, SEQLEN, CHUNK = 32, 256, 8


def checkpoint(layers: int, hidden: int) -> Path:
    """config.json + model.safetensors of a Llama with random weights (seeded), written tensor by tensor."""
    import numpy as np
    import torch
    from transformers import LlamaConfig

    from compiler.backends.emitter import Spec
    from compiler.backends.torch.writer import FolderWriter
    from compiler.models.builtin import cache_dir

    folder = cache_dir() / "bench" / f"llama-l{layers}-h{hidden}"
    if (folder / "model.safetensors").exists():
        return folder
    inter = int(hidden * 2.75)
    config = LlamaConfig(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                         num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64, vocab_size=32000,
                         max_position_embeddings=2048, tie_word_embeddings=False, torch_dtype="float32")
    config.architectures = ["LlamaForCausalLM"]
    shapes = {"model.embed_tokens.weight": (32000, hidden), "model.norm.weight": (hidden,), "lm_head.weight": (32000, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (hidden,), p + "post_attention_layernorm.weight": (hidden,),
                       **{p + f"self_attn.{n}_proj.weight": (hidden, hidden) for n in "qkvo"},
                       p + "mlp.gate_proj.weight": (inter, hidden), p + "mlp.up_proj.weight": (inter, hidden),
                       p + "mlp.down_proj.weight": (hidden, inter)})
    writer = FolderWriter(folder, [Spec(n, torch.float32, s) for n, s in shapes.items()])
    rng = np.random.default_rng(0)
    for name, shape in shapes.items():
        values = np.ones(shape, np.float32) if len(shape) == 1 else (rng.standard_normal(shape, np.float32) * 0.02)
        writer.put(name, torch.from_numpy(values))
    writer.metadata("config.json", config.to_json_string())
    writer.finish()
    writer.commit()
    return folder


def recipe(folder: Path, rounding: str, mode: str, tmp: Path, ram: str | None = None) -> Path:
    calibrate = f"calibrate {{ data synthetic {{ samples {SAMPLES} seqlen {SEQLEN} }} chunk {CHUNK} }}"
    text = (f'recipe bench {{\n model "{folder}"\n backend torch\n scheme w4 = W4A16 {{ group 128  rounding {rounding} }}\n'
            f' quantize {{ "model.layers.*" -> w4 }}\n group auto qkv\n {calibrate}\n'
            f' memory {{ mode {mode}  {f"ram {ram}  " if ram else ""}disk "{tmp / "cache"}" }}\n emit "{tmp / (rounding + "-" + mode)}" {{ format safetensors }}\n}}\n')
    path = tmp / f"{rounding}-{mode}.recipe"
    path.write_text(text)
    return path


CHILD = """
import atexit, json, re, sys
from pathlib import Path
from rich.console import Console
from compiler.compile_run import CompileFailed, compile_recipe
from compiler.diagnostics import render_all
atexit.register(lambda: print('HWM', re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)))
try:
    result, planned = compile_recipe(Path(sys.argv[1]), (), None, Console(file=open('/dev/null', 'w')))
except CompileFailed as failed:
    errors = [d for d in failed.diagnostics if d.severity.value == 'error']
    sys.exit(render_all(tuple(errors)).replace(chr(10), ' ')[:400])
n = len(result.rss_samples)
tenths = [max((r for _, r, _ in result.rss_samples[k * n // 10:(k + 1) * n // 10]), default=0) for k in range(10)]
print('RESULT', json.dumps({'planned': planned.plan.peak_bytes, 'mode': planned.plan.decision.mode.value,
                            'sampled': result.peak_rss, 'quantize_s': result.calibration_seconds, 'tenths': tenths}))
"""


def run(path: Path) -> dict:
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", CHILD, str(path)], cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["?"])[-1][:400], "seconds": seconds}
    found = json.loads(re.search(r"RESULT (.*)", out.stdout).group(1))
    found["hwm"] = int(re.search(r"HWM (\d+)", out.stdout).group(1)) * 1024
    found["seconds"] = seconds
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--rounding", nargs="+", default=["rtn", "gptq"])
    parser.add_argument("--modes", nargs="+", default=["full", "low_memory", "offload"],
                        help="full, low_memory, offload, or auto (the plan chooses under --ram)")
    parser.add_argument("--ram", help='a RAM budget for every recipe, e.g. "2 GiB"')
    args = parser.parse_args()
    folder = checkpoint(args.layers, args.hidden)
    size = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    print(f"checkpoint {folder} ({size / 2**30:.2f} GiB float32, {args.layers} blocks, hidden {args.hidden}); "
          f"{SAMPLES} samples × {SEQLEN} tokens, chunk {CHUNK}\n")
    print("| rounding | mode | wall s | peak RSS (VmHWM) | planned | measured / planned | peak vs full |")
    print("|---|---|---:|---:|---:|---:|---:|")
    mib = 2**20
    drift: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for rounding in args.rounding:
            full = None
            for mode in args.modes:
                r = run(recipe(folder, rounding, mode, Path(tmp), args.ram))
                if "error" in r:
                    print(f"| {rounding} | {mode} | {r['seconds']:.1f} | failed: {r['error']} | | | |")
                    continue
                full = r["hwm"] if r["mode"] == "full" else full
                versus = f"{r['hwm'] / full:.2f}×" if full else "–"
                ran = mode if mode == r["mode"] else f"{mode} → {r['mode']}"
                print(f"| {rounding} | {ran} | {r['seconds']:.1f} | {r['hwm'] / mib:,.0f} MiB | {r['planned'] / mib:,.0f} MiB "
                      f"| {r['hwm'] / r['planned']:.2f}× | {versus} |", flush=True)
                drift.append(f"{rounding} {ran}: " + ", ".join(f"{t / mib:,.0f}" for t in r["tenths"]))
    print("\nlargest RSS sampled in each tenth of each compile (MiB):\n" + "\n".join(drift))


if __name__ == "__main__":
    main()
