"""qrc's GGUF beside llama.cpp's own conversion + `llama-quantize`, on one random-weight Llama with the shipped
512-token BPE tokenizer (recipes/data/tokenizer), both files run by llama.cpp (llama-cpp-python):

    python bench/gguf_llama_cpp.py --llama-cpp LLAMA_CPP_SOURCE [--hidden 512] [--layers 4]

llama.cpp's path: `convert_hf_to_gguf.py --outtype f32` (from LLAMA_CPP_SOURCE, e.g. llama-cpp-python's sdist's
vendor/llama.cpp) then llama.cpp's quantizer, `llama_model_quantize` (what the `llama-quantize` tool calls), to
Q4_0 with the head in Q8_0 and the embedding in F32 (the tool's `--output-tensor-type q8_0 --token-embedding-type
f32`), through llama-cpp-python's binding of the same library that runs the files; the types qrc's recipe gives: every
Linear `int4 group 32 symmetric` (Q4_0), lm_head `int8 group 32 symmetric` (Q8_0). The converter's check of the
pre-tokenizer is told "gpt-2" (it knows tokenizers by a hash of their output on a fixed text; this one is the
repo's own, byte-level with GPT-2's split). Quality: KL of llama.cpp's next-token distribution against the float
model's in transformers, and perplexity, on the shipped text (windows of 128 tokens); decode: tokens per second of
a 64-token greedy generation in llama.cpp (best of 3, alternating); size: the file's bytes; time: the whole
conversion (qrc: one compile, no verification; llama.cpp: convert + quantize). Prints one markdown table.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))
from float_formats import text_windows  # noqa: E402

RECIPE = """recipe bench_gguf {{
    model "{model}"
    backend torch
    scheme q4 {{ weights int4 group 32 symmetric  rounding {rounding} }}
    scheme q8 {{ weights int8 group 32 symmetric }}
    quantize {{ type Linear -> q4  "lm_head" -> q8 }}
    calibrate {{ data synthetic {{ samples 32  seqlen 128 }}  chunk 8 }}
    emit "{out}" {{ format gguf }}
}}
"""
CONVERT = """import sys
sys.path.insert(0, {source!r})
import convert_hf_to_gguf
from conversion import base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
sys.argv = ["convert_hf_to_gguf.py", {folder!r}, "--outtype", "f32", "--outfile", {out!r}]
convert_hf_to_gguf.main()
"""


def build(folder: Path, hidden: int, layers: int) -> Path:
    """The random Llama (seeded), saved with the shipped tokenizer; bos/eos its `<s>`/`</s>`."""
    import torch
    import transformers

    tokenizer = ROOT / "recipes" / "data" / "tokenizer"
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=hidden, intermediate_size=hidden * 11 // 4,
                                      num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=2,
                                      max_position_embeddings=512, tie_word_embeddings=False, bos_token_id=1,
                                      eos_token_id=2)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).eval().save_pretrained(folder)
    for f in tokenizer.iterdir():
        shutil.copy(f, folder / f.name)
    return folder


def llama_cpp_file(source: Path, folder: Path, out: Path) -> float:
    """llama.cpp's converter to F32, then its quantizer to Q4_0 (head Q8_0, embedding F32); seconds."""
    import llama_cpp

    start = time.perf_counter()
    f32 = out.with_suffix(".f32.gguf")
    subprocess.run([sys.executable, "-c", CONVERT.format(source=str(source), folder=str(folder), out=str(f32))],
                   check=True, capture_output=True)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0
    params.output_tensor_type = llama_cpp.GGML_TYPE_Q8_0
    params.token_embedding_type = llama_cpp.GGML_TYPE_F32
    params.nthread = 2
    if llama_cpp.llama_model_quantize(str(f32).encode(), str(out).encode(), params) != 0:
        raise RuntimeError("llama_model_quantize failed")
    seconds = time.perf_counter() - start
    f32.unlink()
    return seconds


def qrc_file(folder: Path, out: Path, rounding: str, work: Path) -> float:
    """qrc's compile of the recipe above; seconds."""
    recipe = work / f"{rounding}.recipe"
    recipe.write_text(RECIPE.format(model=folder, out=out, rounding=rounding))
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "compiler", "compile", str(recipe)], check=True, capture_output=True)
    return time.perf_counter() - start


def quality(path: Path, windows, reference) -> tuple[float, float]:
    """(KL against float, perplexity) of llama.cpp's logits on the windows."""
    import torch
    from llama_cpp_run import logits

    kls, nll, count = [], 0.0, 0
    for ids, ref in zip(windows, reference, strict=True):
        ran = torch.from_numpy(logits(path, ids.tolist())).double().log_softmax(-1)
        p = ref.double().log_softmax(-1)
        kls.append(float((p.exp() * (p - ran)).sum(-1).mean()))
        nll -= float(ran[:-1].gather(1, ids[1:, None]).sum())
        count += len(ids) - 1
    return sum(kls) / len(kls), float(torch.exp(torch.tensor(nll / count)))


def decode_speed(path: Path, tokens: int = 64) -> float:
    """Tokens per second of a greedy generation in llama.cpp (2 threads)."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(path), n_ctx=256, n_threads=2, verbose=False, seed=0)
    try:
        start = time.perf_counter()
        out = llm("The", max_tokens=tokens, temperature=0.0, stop=[])
        return out["usage"]["completion_tokens"] / (time.perf_counter() - start)
    finally:
        llm.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-cpp", type=Path, required=True, help="llama.cpp's source (convert_hf_to_gguf.py)")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()

    import torch
    import transformers

    work = Path(tempfile.mkdtemp(prefix="qrc-gguf-bench-"))
    folder = build(work / "model", args.hidden, args.layers)
    files = {"llama.cpp convert + llama-quantize Q4_0": work / "llama-cpp.gguf", "qrc rtn": work / "qrc-rtn.gguf",
             "qrc gptq": work / "qrc-gptq.gguf"}
    seconds = {name: (llama_cpp_file(args.llama_cpp, folder, path) if name.startswith("llama.cpp")
                      else qrc_file(folder, path, name.split()[-1], work)) for name, path in files.items()}
    windows = text_windows(128, 6)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        reference = [model(w[None]).logits[0].float() for w in windows]
    float_ppl = float(torch.exp(torch.stack([torch.nn.functional.cross_entropy(r[:-1], w[1:], reduction="sum")
                                             for r, w in zip(reference, windows, strict=True)]).sum()
                                / sum(len(w) - 1 for w in windows)))
    speeds: dict[str, list[float]] = {name: [] for name in files}
    for _ in range(3):
        for name, path in files.items():
            speeds[name].append(decode_speed(path))
    print(f"Llama {args.layers} layers, hidden {args.hidden}, vocab 512 (random weights); float perplexity "
          f"{float_ppl:.2f} on {len(windows)} × 128 tokens of the shipped text\n")
    print("| file | KL vs float | perplexity | size (bytes) | decode tok/s | conversion s |")
    print("|---|---|---|---|---|---|")
    for name, path in files.items():
        kl, ppl = quality(path, windows, reference)
        print(f"| {name} | {kl:.5f} | {ppl:.2f} ({100 * (ppl / float_ppl - 1):+.2f}%) | {path.stat().st_size:,} | "
              f"{max(speeds[name]):.0f} | {seconds[name]:.1f} |")
    print(json.dumps({"work": str(work)}))


if __name__ == "__main__":
    main()
