"""GPTQ's group-scale variants side by side: where a group's scale is taken, `static_groups` (every group's
from the float weight) or `updated_groups` (each group's from its columns as the loop reaches them, the
reference GPTQ), and how it is chosen there, `mse_scales` (the shrink of the range with the least squared
error, weighted by the Hessian's diagonal) or `minmax_scales` (the range); on the bench-size decoder of
bench/onnx_decoder.py and on a synthetic layer.

    python bench/gptq_group_scales.py [--scales mse_scales minmax_scales]

Decoder: the random Qwen2 (4 layers, hidden 512) exported by onnxruntime-genai's builder, W4A16 with GPTQ
on 32 samples of 128 random token ids, groups of 32 and 128; fidelity measured outside qrc (onnxruntime
on 8 held-out samples of 128 tokens against the float graph: cosine, top-1, KL). Layer: 4 random layers
(512 inputs with correlated, unevenly scaled features, 384 outputs), 4096 calibration and 2048 held-out
rows; the mean squared output error on the held-out rows.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_ort import run_qrc  # noqa: E402
from onnx_decoder import builder, decoder_folder, fidelity  # noqa: E402

VARIANTS = ("static_groups", "updated_groups")
SCALES = ("mse_scales", "minmax_scales")


def qrc(model: Path, out: Path, group: int, variant: str, scales: str, tmp: Path) -> str:
    recipe = tmp / f"{variant}-{scales}-{group}.recipe"
    recipe.write_text(f'recipe bench {{ model "{model}"  backend onnx\n'
                      f"  scheme s = W4A16 {{ group {group}  rounding gptq {variant} {scales} }}\n"
                      '  quantize { type Linear -> s  "model.embed_tokens" -> none }\n'
                      "  calibrate { data synthetic { samples 32  seqlen 128 }  chunk 8 }\n"
                      f'  emit "{out}" {{ format matmul_nbits }} }}\n')
    _, _, err = run_qrc(recipe)
    return err


def synthetic_layers(scale_choices: list[str]) -> dict[tuple[int, str, str], float]:
    from compiler.ir.types import Granularity, QType, WeightQuant
    from compiler.quant.gptq import HessianObserver, gptq

    rng = np.random.default_rng(0)
    errors: dict[tuple[int, str, str], list[float]] = {}
    for _ in range(4):
        features, outputs = 512, 384
        mixing = rng.normal(size=(features, features)) / np.sqrt(features) + 0.5 * np.eye(features)
        spread = np.exp(rng.normal(size=features) * 0.7)

        def rows(n: int, mixing=mixing, spread=spread) -> np.ndarray:
            return ((rng.normal(size=(n, len(spread))) @ mixing) * spread).astype(np.float32)

        calibration, held_out = rows(4096), rows(2048)
        w = (rng.normal(size=(outputs, features)) * 0.05).astype(np.float32)
        observer = HessianObserver(features)
        observer.update(calibration)
        for group in (32, 128):
            spec = WeightQuant(QType.INT4, Granularity.GROUP, group, True)
            for variant in VARIANTS:
                for scales in scale_choices:
                    q = gptq(w, observer.hessian(), spec, static_groups=variant == "static_groups",
                             mse_scales=scales == "mse_scales")
                    error = float(np.mean((held_out @ (w - q.dequantize()).T) ** 2))
                    errors.setdefault((group, variant, scales), []).append(error)
    return {key: float(np.mean(values)) for key, values in errors.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scales", nargs="+", default=list(SCALES), choices=SCALES)
    scale_choices = parser.parse_args().scales
    tmp = Path(tempfile.mkdtemp(prefix="qrc-bench-groups-"))
    folder = decoder_folder(tmp, 4, 512, 8192)
    _, _, err = builder(folder, tmp / "fp32", "fp32")
    assert not err, err
    float_model = tmp / "fp32" / "model.onnx"
    layers = synthetic_layers(scale_choices)
    print("| GPTQ int4 | decoder cosine | top-1 | KL | synthetic layers: held-out output MSE |")
    print("|---|---:|---:|---:|---:|")
    for group in (32, 128):
        for variant in VARIANTS:
            for scales in scale_choices:
                out = tmp / f"{variant}-{scales}-{group}" / "model.onnx"
                err = qrc(float_model, out, group, variant, scales, tmp)
                name = f"group {group}, {variant}, {scales}"
                if err:
                    print(f"| {name} | {err} | | | |")
                    continue
                cosine, top1, kl = fidelity(float_model, out, 8192)
                print(f"| {name} | {cosine:.4f} | {top1:.4f} | {kl:.5f} | {layers[(group, variant, scales)]:.5f} |",
                      flush=True)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
