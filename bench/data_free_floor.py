"""Data-free rounding against the copy floor: how close qrc's file-to-file path (no calibration, no model
built) comes to only reading a checkpoint and writing as many bytes as qrc wrote.

    python bench/data_free_floor.py [--hidden 2048] [--layers 16] [--shard 2GB]
                                    [--schemes W4A16 W8A16 FP8_DYNAMIC FP8_BLOCK NVFP4A16 MXFP4A16 W4A16+mse
                                               W8A16+mse] [--repeat 3]

The checkpoint is transformers' seeded random init of a Llama in bfloat16, saved once (sharded at `--shard`)
under $QRC_CACHE/bench/. For each scheme, qrc compiles it (`type Linear -> SCHEME`, lm_head float, no
calibration, no verification; `NAME+mse`: the scheme with `rounding mse`, the clipping search) and the floor
runs: read every tensor of every shard with safetensors, then write the bytes qrc's output holds with
safetensors, shard by shard. Each runs in its own process, `--repeat` times alternating (qrc, floor, qrc,
...), with the page cache hot (an untimed read first) and no dirty pages left by the run before (an untimed
sync); the best of each is reported with its peak RSS, the ratio and qrc's rate in GB/s of checkpoint read.
qrc's peak is given twice: its compile process's (GNU time), and what the compile itself measured with its
check process (torch/check_process.py) beside that plan's estimate.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCHEMES = ("W4A16", "W8A16", "FP8_DYNAMIC", "FP8_BLOCK", "NVFP4A16", "MXFP4A16")
SEARCHED = ("W4A16+mse", "W8A16+mse")  # the integer schemes with the mse clipping search (not run by default)
RECIPE = """recipe bench {{
    model "{model}"
    backend torch
    scheme chosen = {scheme} {{ rounding {rounding} }}
    quantize {{ type Linear -> chosen  "lm_head" -> none }}
    emit "{out}"
}}
"""
FLOOR = """
import sys, torch
from pathlib import Path
from safetensors import safe_open
from safetensors.torch import save_file
source, out, ratio = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])
out.mkdir(parents=True, exist_ok=True)
for number, shard in enumerate(sorted(source.glob("*.safetensors"))):
    with safe_open(str(shard), "pt") as handle:
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}
    flat = torch.cat([t.reshape(-1).view(torch.uint8) for t in tensors.values()])
    del tensors
    save_file({"bytes": flat[:int(flat.numel() * ratio)].clone()}, str(out / f"floor-{number}.safetensors"))
"""


def checkpoint(hidden: int, layers: int, shard: str) -> Path:
    """A bfloat16 Llama (heads of 64, grouped-query at half the heads, vocab 32000) saved once, sharded."""
    import torch
    import transformers

    from compiler.models.builtin import cache_dir

    folder = cache_dir() / "bench" / f"hf-llama-bf16-h{hidden}-l{layers}-s{shard}"
    if not (folder / "config.json").exists():
        config = transformers.LlamaConfig(hidden_size=hidden, intermediate_size=hidden * 11 // 4,
                                          num_hidden_layers=layers, num_attention_heads=hidden // 64,
                                          num_key_value_heads=hidden // 128, vocab_size=32000,
                                          max_position_embeddings=512, tie_word_embeddings=False)
        torch.manual_seed(0)
        torch.set_default_dtype(torch.bfloat16)  # initialised in bfloat16: a float32 copy of a 6 GiB model is 12 GiB
        try:
            model = transformers.LlamaForCausalLM(config).eval()
        finally:
            torch.set_default_dtype(torch.float32)
        model.save_pretrained(folder, max_shard_size=shard)
    return folder


def run(argv: list[str]) -> tuple[float, int, str]:
    """A child process: (wall seconds, peak RSS bytes from GNU time's max resident set, its output). Every run
    starts with no dirty pages (os.sync, untimed): otherwise the kernel writes the last run's output back to
    disk while this one runs, and the two cores it takes from made the floor vary 6-11 s between runs of one
    checkpoint."""
    os.sync()
    start = time.perf_counter()
    done = subprocess.run(["/usr/bin/time", "-f", "MAXRSS %M", *argv], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "COLUMNS": "200"})
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{argv[:3]} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return seconds, int(re.search(r"MAXRSS (\d+)", done.stderr).group(1)) * 1024, done.stdout


def reported_peaks(summary: str) -> tuple[float, float]:
    """The compile's own peak (its process and its check process together) and its plan's, in MiB."""
    found = re.search(r"peak RSS\W+([\d.]+) (MiB|GiB) measured vs ([\d.]+) (MiB|GiB) planned", summary)
    if found is None:
        return float("nan"), float("nan")
    scale = {"MiB": 1.0, "GiB": 1024.0}
    return float(found.group(1)) * scale[found.group(2)], float(found.group(3)) * scale[found.group(4)]


def size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--shard", default="2GB", help="max_shard_size of the checkpoint")
    parser.add_argument("--schemes", nargs="+", default=list(SCHEMES), choices=SCHEMES + SEARCHED)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    folder = checkpoint(args.hidden, args.layers, args.shard)
    read = size(folder)
    for shard in folder.glob("*.safetensors"):  # a hot page cache for every run, the first included
        with open(shard, "rb") as handle:
            while handle.read(64 << 20):
                pass
    shards = len(list(folder.glob("*.safetensors")))
    print(f"checkpoint {folder.name}: {read / 2**30:.2f} GiB bfloat16 in {shards} shard(s)\n")
    print("| scheme | qrc s | floor s | qrc / floor | qrc GB/s | qrc peak MiB | with its check process MiB | planned MiB "
          "| floor peak MiB | output GiB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory(dir=folder.parent) as tmp_dir:
        tmp = Path(tmp_dir)
        for scheme in args.schemes:
            out, floor_out = tmp / f"qrc-{scheme}", tmp / "floor"
            recipe = tmp / f"{scheme}.recipe"
            name, _, searched = scheme.partition("+")
            recipe.write_text(RECIPE.format(model=folder, scheme=name, rounding=searched or "rtn", out=out))
            qrc_runs, floor_runs = [], []
            for _ in range(args.repeat):
                shutil.rmtree(out, ignore_errors=True)
                qrc_runs.append(run([sys.executable, "-m", "compiler", "compile", str(recipe)]))
                written = size(out)
                shutil.rmtree(floor_out, ignore_errors=True)
                floor_runs.append(run([sys.executable, "-c", FLOOR, str(folder), str(floor_out), str(written / read)]))
            (qrc_s, qrc_peak, summary), (floor_s, floor_peak, _) = min(qrc_runs), min(floor_runs)
            together, planned = reported_peaks(summary)
            print(f"| {scheme} | {qrc_s:.1f} | {floor_s:.1f} | {qrc_s / floor_s:.2f}× | {read / qrc_s / 1e9:.2f} | "
                  f"{qrc_peak / 2**20:.0f} | {together:.0f} | {planned:.0f} | {floor_peak / 2**20:.0f} | "
                  f"{written / 2**30:.2f} |", flush=True)


if __name__ == "__main__":
    main()
