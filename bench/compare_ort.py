"""qrc vs onnxruntime's own quantization tools, side by side on one model and the same samples.

    python bench/compare_ort.py [--samples 8 32 128] [--model builtin:tiny-llama?...]

Every method runs in its own process (wall time and peak RSS of that process, read from VmHWM);
fidelity is measured afterwards in this process on the same 8 held-out samples for every output
(logits cosine and top-1 agreement with the float model). Prints one markdown table.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH_MODEL = "builtin:tiny-llama?layers=8&hidden=512&heads=8&kv_heads=2&vocab=32000&intermediate=1376"
SEQLEN, CHUNK = 128, 8


def compile_bytecode() -> None:
    """qrc's modules compiled to bytecode before any tool is timed. An installed qrc has its bytecode compiled
    (pip compiles at install; the anchors' packages are), and PYTHONDONTWRITEBYTECODE would otherwise make every
    child compile qrc's modules again (0.1-0.2 s a process on the 2-core machine)."""
    compileall.compile_dir(str(ROOT / "compiler"), quiet=1)


def child(code: str, python: str = sys.executable) -> tuple[float, int, str]:
    """Run `code` in a fresh interpreter (`python`): (seconds, peak RSS bytes, its last stdout line)."""
    # atexit also runs after an uncaught exception: a crash still reports the peak it reached
    wrapped = ("import atexit, re\natexit.register(lambda: print('HWM', re.search(r'VmHWM:\\s+(\\d+)', "
               "open('/proc/self/status').read()).group(1)))\n" + code)
    # the page cache's dirty pages written back first: on this VM a 175 MB write took 0.05 s alone and 1.0-1.2 s
    # when the tool before had just written as much (the kernel throttles a writer past its share), so each
    # tool's seconds would carry the last one's writes
    os.sync()
    start = time.perf_counter()
    out = subprocess.run([python, "-c", wrapped], cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    found = re.search(r"HWM (\d+)", out.stdout)
    hwm = int(found.group(1)) * 1024 if found else 0
    if out.returncode != 0:
        return seconds, hwm, "crash: " + (out.stderr.strip().splitlines() or ["?"])[-1][:80]
    return seconds, hwm, ""


def feeds_code(model: str, samples: int, seed_offset: int = 0) -> str:
    return (f"from compiler.models import index_model\nfrom compiler.data import Batches\n"
            f"from compiler.ir.types import DataSource, DataKind\n"
            f"index = index_model({model!r})\n"
            f"src = DataSource(spans=(), kind=DataKind.SYNTHETIC, path=None, samples={samples}, seqlen={SEQLEN}, "
            f"seed=0, tokenizer=None)\nbatches = Batches(src, index, {samples}, {CHUNK}, seed_offset={seed_offset})\n")


def qrc_recipe(model: str, samples: int, scheme: str, method: str, fmt: str, out: Path, tmp: Path,
               memory: str = "") -> Path:
    schemes = {"w8a8": "scheme s = W8A8 { activations uint8 }", "w4_rtn": "scheme s = W4A16 { group 32 }",
               "w4_mse": "scheme s = W4A16 { group 32  rounding mse }"}[scheme]
    text = (f'recipe bench {{ model "{model}" {schemes}\n quantize {{ "*" -> s  "model.embed_tokens" -> none }}\n'
            f" calibrate {{ data synthetic {{ samples {samples} seqlen {SEQLEN} seed 0 }} chunk {CHUNK} method {method} }}\n"
            f" {memory}\n"
            f' emit "{out}" {{ format {fmt} }} }}\n')
    path = tmp / f"{scheme}-{method.split()[0]}-{samples}-{len(memory)}.recipe"
    path.write_text(text)
    return path


def run_qrc(recipe: Path) -> tuple[float, int, str]:
    return child(f"import sys\nsys.argv = ['qrc', 'compile', {str(recipe)!r}]\nfrom compiler.cli import main\n"
                 "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code")


def planned_peak(recipe: Path) -> int:
    from compiler import plan_file

    result = plan_file(recipe, detected_free=16 << 30)
    return result.plan.peak_bytes if result.plan else 0


def extra_parts(args, model_path: Path, nodes: list[str], tmp: Path) -> list[tuple]:
    """methods: every qrc method vs onnxruntime's at one N; modes: planned vs measured peak per memory mode;
    scale: qrc's peak RSS from 8 to 512 samples."""
    rows, n = [], 32
    if "methods" in args.parts:
        for method in ("minmax", "percentile 99.999", "entropy", "mse", "layerwise_percentile"):
            out = tmp / f"m-{method.split()[0]}.onnx"
            result = run_qrc(qrc_recipe(args.model, n, "w8a8", method, "qdq", out, tmp))
            rows.append((f"qrc {method}", "W8A8", n, *result, *(fidelity(args.model, model_path, out) if not result[2] else (None, None))))
        for method in ("MinMax", "Percentile", "Entropy", "Distribution"):
            out = tmp / f"ort-{method}.onnx"
            result = run_ort_static(model_path, args.model, n, method, out, nodes)
            rows.append((f"onnxruntime quantize_static {method}", "W8A8", n, *result,
                         *(fidelity(args.model, model_path, out) if not result[2] else (None, None))))
    if "modes" in args.parts:
        for mode in ("full", "low_memory", "offload"):
            memory = f'memory {{ mode {mode}  disk "{tmp / "disk"}" }}'
            out = tmp / f"mode-{mode}.onnx"
            recipe = qrc_recipe(args.model, n, "w8a8", "percentile 99.999", "qdq", out, tmp, memory)
            result = run_qrc(recipe)
            note = f"planned {planned_peak(recipe) / 2**20:.0f} MiB"
            rows.append((f"qrc mode {mode}", "W8A8", n, result[0], result[1], result[2] or note,
                         *(fidelity(args.model, model_path, out) if not result[2] else (None, None))))
    if "scale" in args.parts:
        for samples in (8, 32, 128, 512):
            out = tmp / f"scale-{samples}.onnx"
            result = run_qrc(qrc_recipe(args.model, samples, "w8a8", "percentile 99.999", "qdq", out, tmp))
            rows.append(("qrc percentile 99.999", "W8A8", samples, *result, None, None))
    return rows


def int4_rows(args, model_path: Path, nodes: list[str], tmp: Path) -> list[tuple]:
    """int4 g32: qrc's rtn and mse and onnxruntime's MatMulNBitsQuantizer, each run `--repeat` times
    alternating (qrc, onnxruntime, qrc, ...) and reported at its best time (its peak from that run)."""
    n = args.samples[0]
    runs: dict[str, list[tuple]] = {}
    for _ in range(args.repeat):
        for scheme in ("w4_rtn", "w4_mse"):
            out = tmp / f"qrc-{scheme}.onnx"
            result = run_qrc(qrc_recipe(args.model, n, scheme, "minmax", "matmul_nbits", out, tmp))
            runs.setdefault(f"qrc matmul_nbits {scheme[3:]}", []).append((result, out))
        out = tmp / "ort-nbits.onnx"
        runs.setdefault("onnxruntime MatMulNBitsQuantizer", []).append((run_ort_nbits(model_path, out, nodes), out))
    rows = []
    for name, results in runs.items():
        result, out = min(results, key=lambda r: r[0][0])
        rows.append((name, "int4 g32", "-", *result,
                     *(fidelity(args.model, model_path, out) if not result[2] else (None, None))))
    best = {name: min(r[0][0] for r in results) for name, results in runs.items()}
    print(f"int4 rtn: qrc {best['qrc matmul_nbits rtn']:.2f} s, onnxruntime {best['onnxruntime MatMulNBitsQuantizer']:.2f} s, "
          f"{best['qrc matmul_nbits rtn'] / best['onnxruntime MatMulNBitsQuantizer']:.2f}x (best of {args.repeat} "
          "alternating)", file=sys.stderr)
    return rows


def run_floor(model_path: Path, model: str, samples: int) -> tuple[float, int, str]:
    return child(feeds_code(model, samples) + f"import onnxruntime as ort\ns = ort.InferenceSession({str(model_path)!r})\n"
                 "for f in batches:\n    s.run(None, f)")


def run_ort_static(model_path: Path, model: str, samples: int, method: str, out: Path, nodes: list[str]) -> tuple:
    return child(feeds_code(model, samples) + f"""
from onnxruntime.quantization import quantize_static, CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType
class Reader(CalibrationDataReader):
    def __init__(self): self.it = iter(batches)
    def get_next(self): return next(self.it, None)
quantize_static({str(model_path)!r}, {str(out)!r}, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, nodes_to_quantize={nodes!r},
                calibrate_method=CalibrationMethod.{method}, use_external_data_format=False,
                extra_options={{"ActivationSymmetric": False, "WeightSymmetric": True}})
""")


def run_ort_nbits(model_path: Path, out: Path, nodes: list[str]) -> tuple:
    return child(f"""
import onnx
from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer, DefaultWeightOnlyQuantConfig
model = onnx.load({str(model_path)!r})
q = MatMulNBitsQuantizer(model, block_size=32, is_symmetric=True, nodes_to_exclude=[n.name for n in model.graph.node
    if n.op_type == 'MatMul' and n.name not in {nodes!r}], algo_config=DefaultWeightOnlyQuantConfig(block_size=32, is_symmetric=True))
q.process()
onnx.save(q.model.model, {str(out)!r})
""")


def fidelity(model: str, float_path: Path, quant_path: Path) -> tuple[float | None, float | None]:
    try:
        return _fidelity(model, float_path, quant_path)
    except Exception as exc:  # the other tool's output may not load; the table says so
        print(f"{quant_path.name}: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)
        return None, None


def _fidelity(model: str, float_path: Path, quant_path: Path) -> tuple[float, float]:
    import onnxruntime as ort

    from compiler.backends.agreement import Agreement
    from compiler.data import Batches
    from compiler.ir.types import DataKind, DataSource, VerifyMetric
    from compiler.models import index_model

    index = index_model(model)
    src = DataSource(spans=(), kind=DataKind.SYNTHETIC, path=None, samples=8, seqlen=SEQLEN, seed=0, tokenizer=None)
    ref, cand = ort.InferenceSession(str(float_path)), ort.InferenceSession(str(quant_path))
    agreement = Agreement()
    for feed in Batches(src, index, 8, CHUNK, seed_offset=1_000_003):
        agreement.update(ref.run(["logits"], feed)[0], cand.run(["logits"], feed)[0])
    return agreement.value(VerifyMetric.COSINE), agreement.value(VerifyMetric.TOP1)


def linear_matmuls(model: str) -> tuple[Path, list[str]]:
    """The built-in's ONNX file and the names of its MatMul nodes that multiply by a Linear's weight (what
    onnxruntime's quantizer is told to quantize, the same layers qrc's recipes quantize)."""
    import onnx

    from compiler.models import builtin, index_model
    from compiler.models.index import LayerKind

    path = builtin.onnx_path(model)
    weights = {x.weight for x in index_model(model).layers if x.kind is LayerKind.LINEAR}
    light = onnx.load(str(path), load_external_data=False)
    return path, [n.name for n in light.graph.node if n.op_type == "MatMul" and len(n.input) > 1 and n.input[1] in weights]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--model", default=BENCH_MODEL)
    parser.add_argument("--json", type=Path, help="also write the rows as JSON")
    parser.add_argument("--repeat", type=int, default=5, help="int4: runs of each tool, alternating; the best is reported")
    parser.add_argument("--parts", nargs="+", default=["w8a8", "int4"], choices=["w8a8", "int4", "methods", "modes", "scale"])
    args = parser.parse_args()
    compile_bytecode()
    model_path, nodes = linear_matmuls(args.model)
    rows = []
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        for n in args.samples if "w8a8" in args.parts else []:
            floor = run_floor(model_path, args.model, n)
            rows.append(("floor: onnxruntime inference", "-", n, *floor, None, None))
            for method in ("minmax", "percentile 99.999"):
                out = tmp / f"qrc-{method.split()[0]}-{n}.onnx"
                result = run_qrc(qrc_recipe(args.model, n, "w8a8", method, "qdq", out, tmp))
                rows.append((f"qrc {method}", "W8A8", n, *result, *(fidelity(args.model, model_path, out) if not result[2] else (None, None))))
            for method in ("MinMax", "Percentile"):
                out = tmp / f"ort-{method}-{n}.onnx"
                result = run_ort_static(model_path, args.model, n, method, out, nodes)
                rows.append((f"onnxruntime quantize_static {method}", "W8A8", n, *result,
                             *(fidelity(args.model, model_path, out) if not result[2] else (None, None))))
        if "int4" in args.parts:
            rows += int4_rows(args, model_path, nodes, tmp)
        rows += extra_parts(args, model_path, nodes, tmp)
    print(f"model {args.model}, seqlen {SEQLEN}, chunk {CHUNK}; W8A8 = int8 per-channel symmetric weights, uint8 per-tensor asymmetric activations on every Linear but the embedding; fidelity on 8 held-out samples\n")
    print("| method | scheme | N | wall s | peak RSS MiB | logits cosine | top-1 | note |")
    print("|---|---|---|---|---|---|---|---|")
    for name, scheme, n, sec, rss, note, cos, top1 in rows:
        c = f"{cos:.4f}" if cos is not None else "-"
        t = f"{top1:.3f}" if top1 is not None else "-"
        print(f"| {name} | {scheme} | {n} | {sec:.1f} | {rss / 2**20:.0f} | {c} | {t} | {note} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
