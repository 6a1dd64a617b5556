"""ONNX W8A8 speed: does the quantized model run faster than float in onnxruntime, against onnxruntime's own
`quantize_static` outputs on the same model and calibration samples.

    python bench/onnx_w8a8_speed.py [--model builtin:tiny-llama?...] [--tokens 32] [--json out.json]

Rows: the float model; qrc's W8A8 preset (on ONNX: uint8 activations); qrc's W8A8 with `activations int8`;
onnxruntime's QDQ `quantize_static` with uint8 activations (U8S8) and with int8 ones (S8S8), both MinMax,
per-channel int8 weights, the same Linear layers (all but the embedding) and the same 32 samples × 128 tokens.
Speed is one forward of `--tokens` tokens (batch 1) on the CPU provider, the median over interleaved rounds;
`fused` counts the integer kernels in the graph onnxruntime optimizes (MatMulIntegerToFloat, QLinearMatMul,
MatMulNBits); quality is the logits of 8 held-out samples against float (compare_ort.fidelity).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
from compare_ort import BENCH_MODEL, SEQLEN, feeds_code, fidelity, linear_matmuls

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = 32
FUSED = ("MatMulIntegerToFloat", "QLinearMatMul", "MatMulNBits", "QGemm", "QLinearConv")


def qrc_output(model: str, scheme: str, out: Path, tmp: Path) -> None:
    recipe = tmp / f"{out.stem}.recipe"
    recipe.write_text(f'recipe speed {{ model "{model}" scheme s = {scheme}\n'
                      ' quantize { "*" -> s  "model.embed_tokens" -> none }\n'
                      f" calibrate {{ data synthetic {{ samples {SAMPLES} seqlen {SEQLEN} seed 0 }} chunk 8 method minmax }}\n"
                      f' emit "{out}" {{ format qdq }} }}\n')
    subprocess.run([sys.executable, "-m", "compiler", "compile", str(recipe)], cwd=ROOT, check=True,
                   capture_output=True)


def ort_output(model: str, float_path: Path, activation: str, out: Path, nodes: list[str]) -> None:
    code = feeds_code(model, SAMPLES) + f"""
from onnxruntime.quantization import quantize_static, CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType
class Reader(CalibrationDataReader):
    def __init__(self): self.it = iter(batches)
    def get_next(self): return next(self.it, None)
quantize_static({str(float_path)!r}, {str(out)!r}, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                activation_type=QuantType.{activation}, weight_type=QuantType.QInt8, nodes_to_quantize={nodes!r},
                calibrate_method=CalibrationMethod.MinMax, extra_options={{"ActivationSymmetric": False}})
"""
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True)


def session(path: Path, tmp: Path):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp / f"{path.stem}.optimized.onnx")
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]), options.optimized_model_filepath


def fused_kernels(optimized: str) -> int:
    import onnx

    ops = Counter(n.op_type for n in onnx.load(optimized, load_external_data=False).graph.node)
    return sum(ops[k] for k in FUSED)


def feed(session, tokens: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    out = {}
    for spec in session.get_inputs():
        if "mask" in spec.name:
            out[spec.name] = np.ones((1, tokens), np.int64)
        elif "position" in spec.name:
            out[spec.name] = np.arange(tokens, dtype=np.int64)[None]
        else:
            out[spec.name] = rng.integers(0, 256, (1, tokens), dtype=np.int64)  # within any built-in vocabulary
    return out


def timings(sessions: dict[str, object], tokens: int, rounds: int, per_round: int) -> dict[str, float]:
    """Median ms per forward, rounds interleaved across the models so drift in the machine hits all alike."""
    feeds = {name: feed(s, tokens) for name, s in sessions.items()}
    for name, s in sessions.items():
        for _ in range(3):
            s.run(None, feeds[name])
    times: dict[str, list[float]] = {name: [] for name in sessions}
    for _ in range(rounds):
        for name, s in sessions.items():
            for _ in range(per_round):
                start = time.perf_counter()
                s.run(None, feeds[name])
                times[name].append(time.perf_counter() - start)
    return {name: 1000 * statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=BENCH_MODEL)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    float_path, nodes = linear_matmuls(args.model)
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        outputs = {"float": float_path}
        for name, scheme in (("qrc W8A8 (default: uint8 activations)", "W8A8"),
                             ("qrc W8A8 { activations int8 }", "W8A8 { activations int8 }")):
            outputs[name] = tmp / f"qrc-{len(outputs)}.onnx"
            qrc_output(args.model, scheme, outputs[name], tmp)
        for name, activation in (("onnxruntime quantize_static U8S8", "QUInt8"),
                                 ("onnxruntime quantize_static S8S8", "QInt8")):
            outputs[name] = tmp / f"ort-{activation}.onnx"
            ort_output(args.model, float_path, activation, outputs[name], nodes)
        opened, failed = {}, {}
        for name, path in outputs.items():
            try:
                opened[name] = session(path, tmp)
            except Exception as exc:  # the other tool's output may not load: the table says so
                failed[name] = str(exc).splitlines()[0][-120:]
        ms = timings({name: s for name, (s, _) in opened.items()}, args.tokens, args.rounds, 20)
        rows = []
        for name, path in outputs.items():
            if name in failed:
                rows.append({"output": name, "error": failed[name]})
                continue
            cosine, top1 = fidelity(args.model, float_path, path) if name != "float" else (None, None)
            rows.append({"output": name, "ms": ms[name], "vs_float": ms[name] / ms["float"],
                         "fused": fused_kernels(opened[name][1]), "cosine": cosine, "top1": top1})
    u8s8 = ms.get("onnxruntime quantize_static U8S8", float("nan"))
    print(f"model {args.model}; one forward of {args.tokens} tokens, batch 1, onnxruntime CPU; "
          f"quality: logits of 8 held-out samples × {SEQLEN} tokens against float\n")
    print("| output | ms per forward | × float | × ORT U8S8 | fused integer kernels | logits cosine | top-1 |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['output']} | does not load: {r['error']} | | | | | |")
            continue
        quality = (f"{r['cosine']:.4f} | {r['top1']:.3f}" if r["cosine"] is not None else "- | -")
        print(f"| {r['output']} | {r['ms']:.2f} | {r['vs_float']:.2f} | {r['ms'] / u8s8:.2f} | {r['fused']} | {quality} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
