"""Every scheme the torch backend writes, on one random-weight Llama: quality against float measured outside
qrc (transformers loads each folder, compressed-tensors dequantizes it) and bits per quantized weight from the
bytes the folder stores.

    python bench/float_formats.py [--hidden 512] [--layers 4] [--schemes W4A16 FP8_DYNAMIC ...]

The model is transformers' own random initialisation of a LlamaConfig (seeded), saved once. Each scheme
quantizes every Linear but lm_head, calibrating on 32 synthetic samples of 128 tokens and verifying on 16
held-out ones; the independent figures use 16 other samples. transformers runs inputs in float (it does not
apply activation quantization after dequantizing), so for schemes with activations the `qrc verify` column
(which rounds inputs as the runtime does) is the one that includes them. Prints one markdown table.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCHEMES = ("W8A16", "W8A8", "FP8", "FP8_DYNAMIC", "FP8_BLOCK", "MXFP8A16", "W4A16", "NVFP4A16", "MXFP4A16")
RECIPE = """recipe bench {{
    model "{model}"
    backend torch
    quantize {{ type Linear -> {scheme}  "lm_head" -> none }}
    group auto
    calibrate {{ data synthetic {{ samples 32  seqlen 128  seed 1 }}  chunk 8 }}
    memory {{ mode low_memory }}
    verify {{ samples 16  metric kld  at_most 10 }}
    emit "{out}"
}}
"""


def model_folder(hidden: int, layers: int) -> Path:
    import torch
    import transformers

    from compiler.models.builtin import cache_dir

    folder = cache_dir() / "bench" / f"hf-llama-h{hidden}-l{layers}"
    if not (folder / "model.safetensors").exists():
        config = transformers.LlamaConfig(hidden_size=hidden, intermediate_size=hidden * 11 // 4, num_hidden_layers=layers,
                                          num_attention_heads=hidden // 64, num_key_value_heads=hidden // 128,
                                          vocab_size=8192, max_position_embeddings=512, tie_word_embeddings=False)
        torch.manual_seed(0)
        transformers.LlamaForCausalLM(config).eval().save_pretrained(folder)
    return folder


def independent(float_folder: Path, out: Path) -> dict:
    """KL(float ‖ quantized), cosine and top-1 agreement of the logits, transformers on both folders."""
    import torch
    import transformers

    reference = transformers.AutoModelForCausalLM.from_pretrained(str(float_folder)).eval()
    quantized = transformers.AutoModelForCausalLM.from_pretrained(
        str(out), quantization_config=transformers.CompressedTensorsConfig(dequantize=True)).eval()
    ids = torch.randint(0, 8192, (16, 128), generator=torch.Generator().manual_seed(99))
    with torch.no_grad():
        a, b = reference(ids).logits.float(), quantized(ids).logits.float()
    p, q = a.log_softmax(-1), b.log_softmax(-1)
    return {"kl": float((p.exp() * (p - q)).sum(-1).mean()),
            "cosine": float(torch.nn.functional.cosine_similarity(a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1]),
                                                                  dim=-1).mean()),
            "top1": float((a.argmax(-1) == b.argmax(-1)).float().mean())}


def bits_per_weight(out: Path) -> float:
    """Stored bits of the quantized layers (values, scales, zero points, global scales) per weight."""
    from safetensors import safe_open

    config = json.loads((out / "config.json").read_text())["quantization_config"]
    layers = [t for g in config["config_groups"].values() for t in g["targets"]]
    stored = params = 0
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        for key in f.keys():
            layer, _, leaf = key.rpartition(".")
            if layer in layers and not leaf.startswith("input"):
                tensor = f.get_tensor(key)
                stored += tensor.numel() * tensor.element_size() * 8
                if leaf == "weight_shape":
                    params += int(tensor.prod())
                elif leaf == "weight":
                    params += tensor.numel()
                elif leaf == "weight_packed" and "weight_shape" not in [k.rpartition(".")[2] for k in f.keys()
                                                                          if k.startswith(layer + ".")]:
                    params += tensor.numel() * 2  # FP4: two values a byte
    return stored / params


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
    args = parser.parse_args()
    float_folder = model_folder(args.hidden, args.layers)
    print(f"random Llama {args.layers} blocks, hidden {args.hidden}: {float_folder}\n")
    print("| scheme | bits/weight | qrc verify KL | KL (transformers) | cosine | top-1 | compile |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for scheme in args.schemes:
            out = Path(tmp) / scheme
            recipe = Path(tmp) / f"{scheme}.recipe"
            recipe.write_text(RECIPE.format(model=float_folder, scheme=scheme, out=out))
            start = time.perf_counter()
            result, _ = compile_program(str(recipe), out)
            seconds = time.perf_counter() - start
            figures = independent(float_folder, out)
            print(f"| {scheme} | {bits_per_weight(out):.2f} | {result.verify['kld']:.5f} | {figures['kl']:.5f} | "
                  f"{figures['cosine']:.5f} | {figures['top1']:.4f} | {seconds:.1f} s |", flush=True)


if __name__ == "__main__":
    main()
