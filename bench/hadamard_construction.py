"""Which Hadamard construction `transform quarot` turns the residual stream with, chosen on the real SmolLM2-135M
without looking at the held-out text. 576 = 2^k × Paley orders in several ways (8 × 72, qrc's first choice: the
largest Paley order; 16 × 36; 12 × 48; 24 × 24), and compressed-tensors' (llm-compressor's) is another again (a
stored 144 × 2^2), so the two tools' rotations differ though both are "random Hadamard". Each construction and
sign seed compiles `SCHEME` with `transform quarot` (qrc's own compile, in this process, its construction and
signs patched) and is measured in transformers on bench/real_validation.py's validation windows.

    python bench/hadamard_construction.py [--orders 8x72 16x36 12x48 24x24] [--seeds 0 1 2] [--scheme NVFP4A16]
                                          [--signs-after]

With `--signs-after` (the random signs after the Hadamard, as qrc had them) every seed gave the same figures, and
the constructions differed (KL 0.768 for 8 × 72, 0.676, 0.597, 0.645 for 16 × 36, 12 × 48, 24 × 24; R2's signs
after its Hadamard too, as then); with the signs before it (now, R1's and R2's) seeds 0-2 of 8 × 72 gave 0.654,
0.669, 0.674 (2026-12-05): compiler/quant/rotations.py.

Prints one line per construction and seed, then each construction's mean over the seeds: perplexity and KL
against float."""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from work_folder import work_folder

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import real_quality  # noqa: E402
import real_validation  # noqa: E402

RECIPE = """recipe construction {{
    model "{model}"
    backend torch
    transform quarot
    quantize {{ type Linear -> {scheme}  "lm_head" -> none }}
    emit "{out}"
}}
"""


def _signs_after(self, rows):
    """rows · F·diag(s)/√n: the signs on the output side of F, as qrc had them until 2026-12-05 (a sign flip of each
    rotated column, which symmetric formats round alike for every seed)."""
    return self.right_plain(rows) * self.signs.to(rows.device)


def compiled(scheme: str, orders: tuple[int, ...], seed: int, out: Path, signs_after: bool = False) -> None:
    """qrc's compile with the residual stream's Hadamard built from `orders` and its signs from `seed` (after the
    Hadamard with `signs_after`)."""
    from rich.console import Console

    import compiler.backends.torch.rotation as rotation
    import compiler.quant.rotations as rotations
    from compiler.compile_run import compile_recipe

    width = 576
    original_order, original_signs = rotations.hadamard_order, rotations.random_signs
    power = width // __import__("math").prod(orders)
    chosen = (power, *orders) if power > 1 else (1, *orders)
    rotations.hadamard_order = lambda n: chosen if n == width else original_order(n)
    rotation.random_signs = lambda n, s: original_signs(n, s + seed)
    original_right = rotation.Kronecker.right
    if signs_after:
        rotation.Kronecker.right_plain = lambda self, rows: original_right(
            rotation.Kronecker(self.factors, self.signs.new_ones(self.signs.shape)), rows)
        rotation.Kronecker.right = _signs_after
    try:
        recipe = out.parent / f"{out.name}.recipe"
        recipe.write_text(RECIPE.format(model=real_quality.MODEL, scheme=scheme, out=out))
        compile_recipe(recipe, (), out, Console(quiet=True))
    finally:
        rotations.hadamard_order, rotation.random_signs = original_order, original_signs
        rotation.Kronecker.right = original_right


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--orders", nargs="*", default=["8x72", "16x36", "12x48", "24x24"])
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--scheme", default="NVFP4A16")
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--signs-after", action="store_true",
                        help="put R1's random signs after the Hadamard (x·H·diag(s)), as qrc did until 2026-12-05 "
                        "(R2's stay before it)")
    args = parser.parse_args()

    import transformers

    _, logits, windows = real_validation.float_on_validation(args.windows)
    work = work_folder("qrc-hadamard-")
    summary = {}
    for text in args.orders:
        orders = tuple(int(x) for x in text.split("x"))
        found = []
        for seed in args.seeds:
            out = work / f"{text}-{seed}"
            compiled(args.scheme, orders, seed, out, args.signs_after)
            model = transformers.AutoModelForCausalLM.from_pretrained(str(out)).eval()
            figures = real_quality.measure(model, logits, windows)
            found.append(figures)
            print(f"{text} seed {seed}: {figures}", flush=True)
        summary[text] = (statistics.mean(f["ppl"] for f in found), statistics.mean(f["kl"] for f in found))
    for text, (ppl, kl) in summary.items():
        print(f"{text}: mean perplexity {ppl:.2f}, mean KL {kl:.4f} over seeds {args.seeds}", flush=True)


if __name__ == "__main__":
    main()
