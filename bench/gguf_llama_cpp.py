"""qrc's GGUF beside llama.cpp's own conversion and quantizer, on one random-weight Llama with the shipped
512-token BPE tokenizer (recipes/data/tokenizer), every file run by llama.cpp (llama-cpp-python):

    pip install -e ".[llama]"   # llama-cpp-python, and sentencepiece for llama.cpp's converter
    python bench/gguf_llama_cpp.py [--llama-cpp LLAMA_CPP_SOURCE] [--quantize BUILD/bin/llama-quantize]
                                   [--no-k-quants] [--hidden 512] [--layers 4]

Without `--llama-cpp` and `--quantize`, bench/llama_cpp_tools.py finds or makes both once (the installed
llama-cpp-python's sdist from pip, `llama-quantize` built from it with cmake).

The shipped text in windows of 64 tokens: the first 64 windows calibrate (qrc's `data npz`, and the importance
matrix llama.cpp's quantizer reads), the last 32 are held out (KL of llama.cpp's next-token distribution against
the float model's in transformers, and perplexity).

- Q4_0: `convert_hf_to_gguf.py --outtype f32` (from LLAMA_CPP_SOURCE, e.g. llama-cpp-python's sdist's
  vendor/llama.cpp), then llama.cpp's quantizer `llama_model_quantize` (what the `llama-quantize` tool calls,
  through llama-cpp-python's binding) to Q4_0 with the head in Q8_0 and the embedding in F32 (the tool's
  `--output-tensor-type q8_0 --token-embedding-type f32`); qrc: every Linear `int4 group 32 symmetric`, lm_head
  `int8 group 32 symmetric`, rtn and GPTQ.
- Q4_K_M (with `--quantize`): the `llama-quantize` tool (its C API takes no importance matrix from Python) with
  `--imatrix` and `--token-embedding-type f32`, and without the imatrix; the importance matrix is each Linear's
  input mean squares over the calibration windows, taken in transformers by this script and written in
  llama.cpp's imatrix GGUF format. qrc's recipe gives every tensor the type llama.cpp's file has (read back from
  it: Q6_K for the head and the v_proj/down_proj llama.cpp picks, Q4_K for the rest), `rounding imatrix`
  (qrc's own statistics from the same windows), `rounding rtn`, or `rounding gptq` (the imatrix search's grid,
  then GPTQ's rounding onto it, from the same windows).

The converter's check of the pre-tokenizer is told "gpt-2" (it knows tokenizers by a hash of their output on a
fixed text; this one is the repo's own, byte-level with GPT-2's split). Decode: tokens per second of a 200-token
greedy generation in llama.cpp (best of 3, alternating); size: the file's bytes; time: the whole conversion
(qrc: one compile, no verification; llama.cpp: convert + quantize). Prints one markdown table.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from work_folder import work_folder

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))
import llama_cpp_tools  # noqa: E402
from float_formats import text_windows  # noqa: E402

RECIPE = """recipe bench_gguf {{
    model "{model}"
    backend torch
    scheme q4 {{ weights int4 group 32 symmetric  rounding {rounding} }}
    scheme q8 {{ weights int8 group 32 symmetric }}
    quantize {{ type Linear -> q4  "lm_head" -> q8 }}
    calibrate {{ data npz "{data}" {{ samples 64 }}  chunk 8 }}
    emit "{out}" {{ format gguf }}
}}
"""
K_RECIPE = """recipe bench_gguf_k {{
    model "{model}"
    backend torch
    scheme q4k {{ weights q4_k  rounding {rounding} }}
    scheme q6k {{ weights q6_k  rounding {rounding} }}
    quantize {{ type Linear -> q4k  {q6k} -> q6k }}
    calibrate {{ data npz "{data}" {{ samples 64 }}  chunk 8 }}
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
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=hidden, intermediate_size=hidden * 3,
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


def qrc_file(recipe_text: str, out: Path, work: Path) -> float:
    """qrc's compile of a recipe; seconds."""
    recipe = work / (out.stem + ".recipe")
    recipe.write_text(recipe_text)
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


def decode_speed(path: Path, tokens: int = 200) -> float:
    """Tokens per second of a greedy generation in llama.cpp (2 threads), `tokens` tokens counted as they are
    decoded: llama-cpp-python's text completion keeps decoding past `max_tokens` while its text ends inside a
    UTF-8 character, which a random model's repeated byte token can do until the context is full."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(path), n_ctx=256, n_threads=2, verbose=False, seed=0)
    try:
        start = time.perf_counter()
        made = 0
        for _ in llm.generate(llm.tokenize(b"The"), temp=0.0):
            made += 1
            if made == tokens:
                break
        return made / (time.perf_counter() - start)
    finally:
        llm.close()


def imatrix_file(folder: Path, windows, out: Path) -> None:
    """Each Linear's input mean squares over `windows` (float model, transformers), as llama.cpp's imatrix GGUF:
    `NAME.in_sum2` (Σ x² per input column) and `NAME.counts` (tokens) under the file's tensor names."""
    import gguf
    import numpy as np
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, model.config.num_hidden_layers)
    sums: dict[str, torch.Tensor] = {}
    counts: dict[str, int] = {}

    def hook(name):
        def record(_, args):
            x = args[0].detach().double().reshape(-1, args[0].shape[-1])
            sums[name] = sums.get(name, 0) + x.square().sum(0)
            counts[name] = counts.get(name, 0) + x.shape[0]
        return record
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_pre_hook(hook(name))
    with torch.no_grad():
        for w in windows:
            model(w[None])
    writer = gguf.GGUFWriter(out, "imatrix")
    writer.add_type("imatrix")
    writer.add_array("imatrix.datasets", ["qrc shipped text"])
    writer.add_uint32("imatrix.chunk_count", len(windows))
    writer.add_uint32("imatrix.chunk_size", int(windows.shape[1]))
    for name in sorted(sums):
        target = names.get_name(name + ".weight", try_suffixes=(".weight",))
        writer.add_tensor(target + ".in_sum2", sums[name].float().numpy().reshape(1, -1))
        writer.add_tensor(target + ".counts", np.array([[counts[name]]], np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def llama_quantize(quantize: Path, source: Path, folder: Path, out: Path, imatrix: Path | None) -> float:
    """llama.cpp's converter to F32, then the llama-quantize tool to Q4_K_M (embedding F32); seconds."""
    start = time.perf_counter()
    f32 = out.with_suffix(".f32.gguf")
    subprocess.run([sys.executable, "-c", CONVERT.format(source=str(source), folder=str(folder), out=str(f32))],
                   check=True, capture_output=True)
    extra = ["--imatrix", str(imatrix)] if imatrix is not None else []
    subprocess.run([str(quantize), *extra, "--token-embedding-type", "f32", str(f32), str(out), "Q4_K_M", "2"],
                   check=True, capture_output=True)
    seconds = time.perf_counter() - start
    f32.unlink()
    return seconds


def q6k_selectors(folder: Path, llama_file: Path) -> str:
    """The recipe's selectors for the tensors llama.cpp's file has in Q6_K (by their transformers names)."""
    import gguf
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "np") as f:
        keys = list(f.keys())
    config = json.loads((folder / "config.json").read_text())
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config["num_hidden_layers"])
    back = {names.get_name(k, try_suffixes=(".weight",)): k.removesuffix(".weight") for k in keys}
    q6 = [back[t.name] for t in gguf.GGUFReader(llama_file).tensors if t.tensor_type.name == "Q6_K"]
    return ", ".join(f'"{name}"' for name in q6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-cpp", type=Path, help="llama.cpp's source (convert_hf_to_gguf.py; default: the "
                        "installed llama-cpp-python's, llama_cpp_tools.py)")
    parser.add_argument("--quantize", type=Path, help="the llama-quantize binary (the Q4_K_M rows; default: built "
                        "from that source once, llama_cpp_tools.py)")
    parser.add_argument("--no-k-quants", action="store_true", help="skip the Q4_K_M rows (no llama-quantize)")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()
    args.llama_cpp = args.llama_cpp or llama_cpp_tools.llama_cpp_source()
    if args.quantize is None and not args.no_k_quants:
        args.quantize = llama_cpp_tools.llama_quantize(args.llama_cpp)

    import numpy as np
    import torch
    import transformers

    work = work_folder("qrc-gguf-bench-")
    folder = build(work / "model", args.hidden, args.layers)
    windows = text_windows(64, 1000)
    calibration, held_out = windows[:64], windows[-32:]
    data = work / "calibration.npz"
    np.savez(data, input_ids=calibration.numpy().astype(np.int64),
             attention_mask=np.ones(tuple(calibration.shape), np.int64))
    files = {"llama.cpp Q4_0 (head Q8_0)": work / "llama-cpp-q4_0.gguf", "qrc Q4_0 rtn": work / "qrc-q4_0-rtn.gguf",
             "qrc Q4_0 gptq": work / "qrc-q4_0-gptq.gguf"}
    seconds = {"llama.cpp Q4_0 (head Q8_0)": llama_cpp_file(args.llama_cpp, folder, files["llama.cpp Q4_0 (head Q8_0)"])}
    for rounding in ("rtn", "gptq"):
        out = files[f"qrc Q4_0 {rounding}"]
        seconds[f"qrc Q4_0 {rounding}"] = qrc_file(RECIPE.format(model=folder, out=out, rounding=rounding, data=data),
                                                   out, work)
    if args.quantize is not None:
        imatrix = work / "imatrix.gguf"
        imatrix_file(folder, calibration, imatrix)
        for label, matrix, rounding in (("imatrix", imatrix, "imatrix"), ("no imatrix", None, "rtn")):
            theirs, ours = f"llama.cpp Q4_K_M, {label}", f"qrc Q4_K_M types, {label}"
            files[theirs], files[ours] = work / f"llama-cpp-{rounding}.gguf", work / f"qrc-k-{rounding}.gguf"
            seconds[theirs] = llama_quantize(args.quantize, args.llama_cpp, folder, files[theirs], matrix)
            recipe = K_RECIPE.format(model=folder, out=files[ours], rounding=rounding, data=data,
                                     q6k=q6k_selectors(folder, files[theirs]))
            seconds[ours] = qrc_file(recipe, files[ours], work)
        # GPTQ onto the imatrix search's grid: the same types, the same calibration windows
        ours = "qrc Q4_K_M types, gptq"
        files[ours] = work / "qrc-k-gptq.gguf"
        recipe = K_RECIPE.format(model=folder, out=files[ours], rounding="gptq", data=data,
                                 q6k=q6k_selectors(folder, files["llama.cpp Q4_K_M, imatrix"]))
        seconds[ours] = qrc_file(recipe, files[ours], work)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        reference = [model(w[None]).logits[0].float() for w in held_out]
    float_ppl = float(torch.exp(torch.stack([torch.nn.functional.cross_entropy(r[:-1], w[1:], reduction="sum")
                                             for r, w in zip(reference, held_out, strict=True)]).sum()
                                / sum(len(w) - 1 for w in held_out)))
    speeds: dict[str, list[float]] = {name: [] for name in files}
    for _ in range(3):
        for name, path in files.items():
            speeds[name].append(decode_speed(path))
    print(f"Llama {args.layers} layers, hidden {args.hidden}, vocab 512 (random weights); float perplexity "
          f"{float_ppl:.2f} on {len(held_out)} held-out × 64 tokens of the shipped text\n")
    print("| file | KL vs float | perplexity | size (bytes) | decode tok/s | conversion s |")
    print("|---|---|---|---|---|---|")
    for name, path in files.items():
        kl, ppl = quality(path, held_out, reference)
        print(f"| {name} | {kl:.5f} | {ppl:.2f} ({100 * (ppl / float_ppl - 1):+.2f}%) | {path.stat().st_size:,} | "
              f"{max(speeds[name]):.0f} | {seconds[name]:.1f} |")


if __name__ == "__main__":
    main()
