"""Quality against average weight bits: the mixed-precision search (snr, mse, kld) at budgets from 4.25 to
8 bits, next to uniform int4 (per channel, and in groups of 32) and uniform int8.

    python bench/mixed_precision.py [--model builtin:tiny-llama?...] [--budgets 4.25 4.5 5 6 7 8] [--svg FILE]

Every point is a `qrc compile` on the torch backend (int4/int8 per channel as the two choices, Q/K/V of a
block as one unit); the scores of each metric are computed once and reused from the cache for the other
budgets. Quality is the compile's own verification on the same 8 held-out samples: KL divergence of the
logits from float (lower is better) and their cosine. Prints one markdown table; `--svg` writes the
curve of KL against bits.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from compiler.compile_run import compile_recipe  # noqa: E402
from compiler.report.chart import Series, line_chart  # noqa: E402

BENCH_MODEL = "builtin:tiny-llama?layers=8&hidden=512&heads=8&kv_heads=2&vocab=32000&intermediate=1376"
RECIPE = """recipe bench {{
    model "{model}"
    backend torch
    scheme w4 = W4A16 {{ weights int4 per_channel symmetric }}
    scheme w4g32 = W4A16 {{ group 32 }}
    scheme w8 = W8A16
    quantize {{ "model.layers.*" -> {base}  "lm_head" -> {base} }}
    {search}
    calibrate {{ data synthetic {{ samples 16 seqlen 64 }} chunk 8 }}
    verify {{ samples 8 metric kld at_most 100 }}
    emit "out" {{ format safetensors }}
}}
"""


def run(tmp: Path, name: str, model: str, base: str, search: str = "") -> dict:
    recipe = tmp / f"{name}.recipe"
    recipe.write_text(RECIPE.format(model=model, base=base, search=search))
    start = time.perf_counter()
    result, _ = compile_recipe(recipe, (f"memory.disk={tmp / 'cache'}",), tmp / name, Console(quiet=True))
    bits = result.search.average_bits if result.search else _uniform_bits(result)
    return {"name": name, "bits": bits, "kld": result.verify["kld"], "cosine": result.verify["cosine"],
            "seconds": time.perf_counter() - start, "cached": bool(result.search and result.search.from_cache)}


def _uniform_bits(result) -> float:
    from compiler.resolve.sizes import quantized_bytes

    layers = [a for a in result.assignment.layers if not a.scheme.is_none]
    return sum(8 * quantized_bytes(a.layer, a.scheme) for a in layers) / sum(a.layer.params for a in layers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=BENCH_MODEL)
    parser.add_argument("--budgets", type=float, nargs="+", default=[4.25, 4.5, 5, 6, 7, 8])
    parser.add_argument("--metrics", nargs="+", default=["snr", "mse", "kld"])
    parser.add_argument("--svg", type=Path)
    args = parser.parse_args()
    rows, series = [], []
    with tempfile.TemporaryDirectory(prefix="qrc-bench-mp-") as tmp:
        tmp = Path(tmp)
        for base in ("w4", "w4g32", "w8"):
            rows.append(run(tmp, f"uniform {base}", args.model, base))
            print(f"  {rows[-1]['name']}: done", file=sys.stderr)
        for metric in args.metrics:
            points = []
            for budget in args.budgets:
                search = ('group "*.self_attn.{q,k,v}_proj"\n    mixed_precision { choices [w4, w8] '
                          f"metric {metric} budget {budget} bits samples 16 }}")
                row = run(tmp, f"{metric} @ {budget:g}", args.model, "w4", search)
                rows.append(row)
                points.append((row["bits"], row["kld"]))
                print(f"  {row['name']}: done", file=sys.stderr)
            series.append(Series(f"search {metric}", tuple(points)))
    for row in rows[:3]:
        series.append(Series(row["name"], ((row["bits"], row["kld"]),), markers_only=True))
    print(f"model: {args.model}\n")
    print("| model | bits per weight | KL from float | cosine | compile s |")
    print("|---|---:|---:|---:|---:|")
    for row in rows:
        cached = " (scores cached)" if row["cached"] else ""
        print(f"| {row['name']} | {row['bits']:.3f} | {row['kld']:.5f} | {row['cosine']:.4f} | {row['seconds']:.1f}{cached} |")
    if args.svg:
        args.svg.write_text(line_chart(series, "bits per weight (scales included)", "KL divergence from float",
                                       "quality against average weight bits"))
        print(f"\nwrote {args.svg}")


if __name__ == "__main__":
    main()
