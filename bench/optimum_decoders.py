"""optimum-exported decoders through qrc: tiny random Llama and Qwen2 folders exported by
`optimum-cli export onnx --task text-generation-with-past`, compiled W8A8 (QDQ) and W4A16 (MatMulNBits),
then run in onnxruntime with an empty cache (whole sequence) and a filled one (the last 4 tokens decoded
one at a time), each compared with transformers' float logits (minimum per-sample cosine).

    python bench/optimum_decoders.py --optimum-cli /path/to/venv/bin/optimum-cli

optimum-onnx pins transformers < 4.58, so it lives in its own venv (`python -m venv V && V/bin/pip install
torch==2.13.0 'optimum-onnx[onnxruntime]'`); only its command line is called from here.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from work_folder import work_folder

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))



def main() -> None:
    import numpy as np
    import test_onnx_decoders as decoders
    from zoo import build

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--optimum-cli", required=True)
    args = parser.parse_args()
    tmp = work_folder("qrc-optimum-")
    ids = np.random.RandomState(0).randint(0, 320, (1, 12)).astype(np.int64)
    print("| export | scheme | qrc compile | cosine, empty cache | cosine, filled cache |")
    print("|---|---|---|---:|---:|")
    for family in ("llama", "qwen2"):
        folder = build(family, tmp / family)
        exported = tmp / f"optimum-{family}"
        subprocess.run([args.optimum_cli, "export", "onnx", "--model", str(folder), "--task", "text-generation-with-past",
                        str(exported)], check=True, capture_output=True)
        reference = decoders._float_logits(folder, ids)
        for scheme, (name, fmt) in decoders.SCHEMES.items():
            out = tmp / f"{family}-{scheme}" / "model.onnx"
            recipe = tmp / f"{family}-{scheme}.recipe"
            recipe.write_text(decoders.RECIPE.format(model=exported / "model.onnx", scheme=name, fmt=fmt, out=out))
            done = subprocess.run([sys.executable, "-m", "compiler", "compile", str(recipe)], capture_output=True, text=True)
            if done.returncode:
                print(f"| optimum {family} | {scheme} | exit {done.returncode} | | |")
                continue
            whole, cached = decoders._logits_with_cache(out, ids)
            print(f"| optimum {family} | {scheme} | exit 0 | {decoders._cosine(whole, reference):.4f} | "
                  f"{decoders._cosine(cached, reference[:, -4:]):.4f} |")
    plan_at_bench_size(args.optimum_cli, tmp)


def plan_at_bench_size(optimum_cli: str, tmp: Path) -> None:
    """The plan of an optimum (unfused attention) decoder of bench size against the compile's VmHWM: the
    random Qwen2 of bench/onnx_decoder.py, W8A8 with 32 × 128-token samples, chunk 8, verify 8."""
    sys.path.insert(0, str(ROOT / "bench"))
    from onnx_decoder import decoder_folder, plan_vs_measured

    folder = decoder_folder(tmp / "bench", 4, 512, 8192)
    exported = tmp / "optimum-bench"
    subprocess.run([optimum_cli, "export", "onnx", "--model", str(folder), "--task", "text-generation-with-past",
                    str(exported)], check=True, capture_output=True)
    print(f"\noptimum Qwen2 (4 layers, hidden 512, vocab 8192): {plan_vs_measured(exported / 'model.onnx', tmp)}")


if __name__ == "__main__":
    main()
