"""Every scheme the torch backend writes, on one random-weight Llama: quality against float measured outside
qrc (transformers loads each folder, compressed-tensors dequantizes it) and bits per quantized weight from the
bytes the folder stores.

    python bench/float_formats.py [--hidden 512] [--layers 4] [--schemes W4A16 FP8_DYNAMIC ...]
                                  [--llmcompressor VENV/bin/python]

The model is transformers' own random initialisation of a LlamaConfig (seeded), saved once. Each scheme
quantizes every Linear but lm_head, calibrating on 32 synthetic samples of 128 tokens and verifying on 16
held-out ones; the independent figures use 16 other samples. transformers runs inputs in float (it does not
apply activation quantization after dequantizing), so for schemes with activations the `qrc verify` column
(which rounds inputs as the runtime does) is the one that includes them. With `--llmcompressor`, the data-free
schemes are also quantized by llm-compressor's `oneshot` (bench/llmc_oneshot.py, run with that interpreter)
and measured the same way, in this environment, and their tensors compared with qrc's bit for bit. Times:
qrc's whole compile (load, calibration, rounding, verification on 16 samples, writing); llm-compressor's
`oneshot` call alone. The calibrated schemes (NVFP4, MXFP4, W4AFP8) run as llm-compressor calibrates: eager
attention (`calibrate { attention eager }`), mode full. Prints one markdown table.
"""

from __future__ import annotations

import argparse
import math
import re
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA_FREE = ("W8A16", "FP8_DYNAMIC", "FP8_BLOCK", "MXFP8A16", "W4A16", "NVFP4A16", "MXFP4A16")  # no calibration
# calibrated on the same token ids by both tools (bench/llmc_calibrated.py); MXFP4 and W4AFP8 need none, but
# their activations only run through a calibration pipeline in llm-compressor's oneshot
CALIBRATED = ("NVFP4", "MXFP4", "W4AFP8")
SCHEMES = ("W8A16", "W8A8", "FP8", "FP8_DYNAMIC", "FP8_BLOCK", "MXFP8A16", "W4A16", "NVFP4A16", "MXFP4A16",
           "NVFP4", "MXFP4", "W4AFP8")
RECIPE = """recipe bench {{
    model "{model}"
    backend torch
    quantize {{ type Linear -> {scheme}  "lm_head" -> none }}
    group auto
    calibrate {{ data npz "{npz}"  chunk 8  attention {attention} }}
    memory {{ mode {mode} }}
    verify {{ samples 16  metric kld  at_most 10 }}
    emit "{out}"
}}
"""


def model_folder(hidden: int, layers: int, vocab: int = 8192, kv_heads: int | None = None,
                 positions: int = 512) -> Path:
    """transformers' seeded random init of a Llama (heads of 64, grouped-query with `kv_heads`, by default
    half as many as the heads), saved once under $QRC_CACHE/bench/."""
    import torch
    import transformers

    from compiler.models.builtin import cache_dir

    suffix = f"-v{vocab}" if vocab != 8192 else ""
    folder = cache_dir() / "bench" / f"hf-llama-h{hidden}-l{layers}{suffix}"
    if not (folder / "model.safetensors").exists():
        config = transformers.LlamaConfig(hidden_size=hidden, intermediate_size=hidden * 11 // 4, num_hidden_layers=layers,
                                          num_attention_heads=hidden // 64, num_key_value_heads=kv_heads or hidden // 128,
                                          vocab_size=vocab, max_position_embeddings=positions, tie_word_embeddings=False)
        torch.manual_seed(0)
        transformers.LlamaForCausalLM(config).eval().save_pretrained(folder)
    return folder


def independent(float_folder: Path, out: Path, vocab: int = 8192, seqlen: int = 128, prepare=None,
                seed: int = 99, inputs_quantized: bool = False) -> dict:
    """KL(float ‖ quantized), cosine and top-1 agreement of the logits, transformers on both folders
    (`prepare(model)`: called on the loaded quantized model first, e.g. to quantize its activations).
    `inputs_quantized`: the folder loaded compressed, so compressed-tensors quantizes each Linear's inputs as
    its config says, both models in bfloat16 (compressed-tensors 0.20 decompresses FP4 weights to bfloat16
    on the CPU)."""
    import torch
    import transformers

    dtype = torch.bfloat16 if inputs_quantized else None
    reference = transformers.AutoModelForCausalLM.from_pretrained(str(float_folder), dtype=dtype).eval()
    # passing quantization_config=None would drop the folder's own config: leave the argument out instead
    config = {} if inputs_quantized else {"quantization_config": transformers.CompressedTensorsConfig(dequantize=True)}
    quantized = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=dtype, **config).eval()
    if prepare is not None:
        prepare(quantized)
    ids = torch.randint(0, vocab, (16, seqlen), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        a, b = reference(ids).logits.float(), quantized(ids).logits.float()
        text = text_windows(seqlen)
        perplexity = {name: math.exp(float(model(input_ids=text, labels=text).loss))
                      for name, model in (("ppl_float", reference), ("ppl", quantized))}
    p, q = a.log_softmax(-1), b.log_softmax(-1)
    return {"kl": float((p.exp() * (p - q)).sum(-1).mean()),
            "cosine": float(torch.nn.functional.cosine_similarity(a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1]),
                                                                  dim=-1).mean()),
            "top1": float((a.argmax(-1) == b.argmax(-1)).float().mean()), **perplexity}


def perplexity_cell(figures: dict) -> str:
    """A table cell: the quantized folder's perplexity on the shipped text and its change from the float
    model's (empty where it was not measured)."""
    if "ppl" not in figures:
        return ""
    return f"{figures['ppl']:.2f} ({100 * (figures['ppl'] / figures['ppl_float'] - 1):+.2f}%)"


def text_windows(seqlen: int, windows: int = 8):
    """The shipped text (recipes/data: corpus rows, chat turns, the MiniLM calibration lines) through the shipped
    512-token tokenizer, packed into `windows` windows of `seqlen` tokens: the same text for every tool's output,
    on which transformers' own loss gives each folder's perplexity."""
    import json

    import torch
    from transformers import PreTrainedTokenizerFast

    data = ROOT / "recipes" / "data"
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(data / "tokenizer"))
    texts = [json.loads(line)["text"] for line in (data / "corpus.jsonl").read_text().splitlines()]
    texts += [m["content"] for line in (data / "chat.jsonl").read_text().splitlines()
              for m in json.loads(line)["messages"]]
    texts += (data / "minilm-calibration.txt").read_text().splitlines()
    stream = [t for text in texts for t in tokenizer(text)["input_ids"]]
    count = min(windows, len(stream) // seqlen)
    return torch.tensor(stream[:count * seqlen]).reshape(count, seqlen)


def bits_per_weight(out: Path) -> float:
    """Stored bits of the quantized layers (those with a `weight_scale`: values, scales, zero points, global
    scales) per weight."""
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
        layers = {k.removesuffix(".weight_scale") for k in keys if k.endswith(".weight_scale")}
        stored = params = 0
        for layer in layers:
            own = {k.rpartition(".")[2]: f.get_tensor(k) for k in keys if k.rpartition(".")[0] == layer}
            stored += sum(t.numel() * t.element_size() * 8 for leaf, t in own.items() if not leaf.startswith("input"))
            if "weight_shape" in own:
                params += int(own["weight_shape"].prod())
            elif "weight" in own:
                params += own["weight"].numel()
            else:
                params += own["weight_packed"].numel() * 2  # FP4: two values a byte
    return stored / params


def same_tensors(a: Path, b: Path) -> str:
    """Whether two folders store the same tensors, bit for bit ("yes", or how many differ)."""
    import torch
    from safetensors.torch import load_file

    x, y = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    differ = [k for k in set(x) | set(y) if k not in x or k not in y or x[k].dtype != y[k].dtype
              or x[k].shape != y[k].shape or not torch.equal(x[k].view(torch.uint8), y[k].view(torch.uint8))]
    return "yes" if not differ else f"{len(differ)} of {len(set(x) | set(y))} differ"


def compile_program(recipe: str, out: Path):
    """qrc's compile through its API (what `qrc compile` runs): (CompileResult, PlanResult)."""
    from rich.console import Console

    from compiler.compile_run import compile_recipe

    return compile_recipe(Path(recipe), (), out, Console(quiet=True))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--schemes", nargs="+", default=list(SCHEMES))
    parser.add_argument("--llmcompressor", help="python of a venv with llm-compressor installed")
    args = parser.parse_args()
    float_folder = model_folder(args.hidden, args.layers)
    print(f"random Llama {args.layers} blocks, hidden {args.hidden}: {float_folder}\n")
    print("| scheme | tool | bits/weight | qrc verify KL | KL (transformers) | cosine | top-1 | time | same tensors as qrc |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    with tempfile.TemporaryDirectory() as tmp:
        from gptq_llmc import calibration_ids  # it imports this module: here, not at the top

        npz = calibration_ids(Path(tmp), 32, 128, vocab=8192)  # both tools calibrate on these ids
        with_inputs: dict[str, list[dict]] = {}
        for scheme in args.schemes:
            out = Path(tmp) / scheme
            recipe = Path(tmp) / f"{scheme}.recipe"
            # the calibrated schemes as llm-compressor calibrates them: eager attention, every block's inputs
            # from the float model (mode full; low_memory takes them from the blocks already quantized)
            calibrated = scheme in CALIBRATED
            recipe.write_text(RECIPE.format(model=float_folder, scheme=scheme, out=out, npz=npz,
                                            attention="eager" if calibrated else "model",
                                            mode="full" if calibrated else "low_memory"))
            start = time.perf_counter()
            result, _ = compile_program(str(recipe), out)
            seconds = time.perf_counter() - start
            figures = independent(float_folder, out)
            if scheme in CALIBRATED:
                with_inputs[scheme] = [independent(float_folder, out, inputs_quantized=True)]
            print(f"| {scheme} | qrc | {bits_per_weight(out):.2f} | {result.verify['kld']:.5f} | {figures['kl']:.5f} | "
                  f"{figures['cosine']:.5f} | {figures['top1']:.4f} | {seconds:.1f} s | |", flush=True)
            if args.llmcompressor and scheme in DATA_FREE + CALIBRATED:
                theirs = Path(tmp) / f"{scheme}-llmc"
                command = (["llmc_oneshot.py", str(float_folder), scheme, str(theirs)] if scheme in DATA_FREE else
                           ["llmc_calibrated.py", str(float_folder), str(npz), scheme, str(theirs)])
                ran = subprocess.run([args.llmcompressor, str(ROOT / "bench" / command[0]), *command[1:]],
                                     capture_output=True, text=True, check=True)
                seconds = float(re.search(r"seconds ([0-9.]+)", ran.stdout).group(1))
                figures = independent(float_folder, theirs)
                if scheme in CALIBRATED:
                    with_inputs[scheme].append(independent(float_folder, theirs, inputs_quantized=True))
                print(f"| {scheme} | llm-compressor | {bits_per_weight(theirs):.2f} | | {figures['kl']:.5f} | "
                      f"{figures['cosine']:.5f} | {figures['top1']:.4f} | {seconds:.1f} s | "
                      f"{same_tensors(out, theirs)} |", flush=True)
    if with_inputs:
        print("\nWith the inputs quantized in transformers (compressed loading, bfloat16 against bfloat16 float):\n")
        print("| scheme | tool | KL | cosine | top-1 | perplexity |\n|---|---|---:|---:|---:|---:|")
        for scheme, runs in with_inputs.items():
            for tool, f in zip(("qrc", "llm-compressor"), runs, strict=False):  # qrc alone without --llmcompressor
                print(f"| {scheme} | {tool} | {f['kl']:.5f} | {f['cosine']:.5f} | {f['top1']:.4f} | {perplexity_cell(f)} |")


if __name__ == "__main__":
    main()
