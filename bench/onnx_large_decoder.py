"""A decoder beyond protobuf's 2 GB limit on the ONNX backend: a random Llama of ~3.4 GB float32, exported by
onnxruntime-genai's model builder (external data), compiled by qrc in `offload` under `ram 2 GiB`.

    python bench/onnx_large_decoder.py [--layers 16 --hidden 2048 --intermediate 5632 --vocab 32000]

Each compile runs in its own process: the plan's peak beside the measured VmHWM, the output's files (the
.onnx must stay small, its weights in external data), and fidelity measured outside qrc — the emitted
model and the float export run in onnxruntime on 2 held-out samples of 128 tokens (empty cache), logits
compared (cosine, top-1). Rows: W4A16 rtn (MatMulNBits), W4A16 gptq (48 × 128 tokens, more than the
widest input has features: Q255) and W8A8 (QDQ,
48 × 128 tokens, static inputs).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_ort import planned_peak, run_qrc  # noqa: E402
from onnx_decoder import _feed, builder, random_decoder  # noqa: E402

SCHEMES = {"w4a16 rtn": ("W4A16 { group 32 }", "matmul_nbits"),
           "w4a16 gptq": ("W4A16 { group 32  rounding gptq }", "matmul_nbits"),
           "w8a8": ("W8A8", "qdq")}


def llama_folder(tmp: Path, layers: int, hidden: int, intermediate: int, vocab: int) -> Path:
    """A random Llama folder (float32 safetensors) with a word-level tokenizer (the builder loads one)."""
    import transformers

    config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                                      num_hidden_layers=layers, num_attention_heads=16, num_key_value_heads=4,
                                      max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                                      tie_word_embeddings=False, torch_dtype="float32")
    return random_decoder(tmp / "llama", transformers.LlamaForCausalLM, config, vocab)


def recipe(model: Path, scheme: str, fmt: str, out: Path, tmp: Path) -> Path:
    path = tmp / f"{out.parent.name}.recipe"
    path.write_text(f'recipe large {{ model "{model}"  backend onnx\n  scheme s = {scheme}\n'
                    '  quantize { type Linear -> s  "lm_head" -> none }\n'
                    "  calibrate { data synthetic { samples 48  seqlen 128 }  chunk 2 }\n"
                    f'  memory {{ mode offload  ram 2 GiB  disk "{tmp / "cache"}" }}\n'
                    "  verify { samples 4  metric cosine  at_least 0.5 }\n"  # random weights: flat, fragile logits
                    f'  emit "{out}" {{ format {fmt} }} }}\n')
    return path


def fidelity(float_model: Path, model: Path, vocab: int) -> tuple[float, float]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.add_session_config_entry("session.disable_prepacking", "1")
    cosines, agree = [], []
    rng = np.random.RandomState(1_000_003)
    samples = [rng.randint(0, vocab, (1, 128)).astype(np.int64) for _ in range(2)]
    logits = {}
    for path in (float_model, model):  # one session at a time: two 3 GB models need not fit together
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        logits[path] = [session.run(["logits"], _feed(session, ids))[0][0].astype(np.float64) for ids in samples]
        del session
    for a, b in zip(logits[float_model], logits[model], strict=True):
        cosines.append(float(np.mean((a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1))))
        agree.append(float(np.mean(a.argmax(-1) == b.argmax(-1))))
    return float(np.mean(cosines)), float(np.mean(agree))


def sizes(out: Path) -> str:
    files = sorted(p for p in out.parent.iterdir() if p.name.startswith(out.name))
    return ", ".join(f"{p.name} {p.stat().st_size / 2**20:,.1f} MiB" for p in files)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--intermediate", type=int, default=5632)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--only", choices=list(SCHEMES), action="append")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="qrc-bench-large-"))
    folder = llama_folder(tmp, args.layers, args.hidden, args.intermediate, args.vocab)
    seconds, peak, err = builder(folder, tmp / "fp32", "fp32")
    assert not err, err
    shutil.rmtree(folder)  # the export is the input from here on
    float_model = tmp / "fp32" / "model.onnx"
    data = sum(p.stat().st_size for p in float_model.parent.iterdir() if p.name.startswith("model.onnx"))
    print(f"random Llama, {args.layers} layers, hidden {args.hidden}, intermediate {args.intermediate}, vocab "
          f"{args.vocab}: builder fp32 export {data / 2**30:.2f} GiB ({sizes(float_model)}), {seconds:.0f} s\n")
    print("| offload, ram 2 GiB | wall s | planned MiB | VmHWM MiB | measured / planned | cosine | top-1 | files |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for name in args.only or SCHEMES:
        scheme, fmt = SCHEMES[name]
        out = tmp / name.replace(" ", "-") / "model.onnx"
        out.parent.mkdir()
        path = recipe(float_model, scheme, fmt, out, tmp)
        planned = planned_peak(path)
        seconds, peak, err = run_qrc(path)
        if err:
            print(f"| {name} | {err} | {planned / 2**20:,.0f} | {peak / 2**20:,.0f} | | | | |", flush=True)
            continue
        assert (out.parent / "genai_config.json").exists()  # qrc carries the builder's, renamed
        cosine, top1 = fidelity(float_model, out, args.vocab)
        print(f"| {name} | {seconds:.0f} | {planned / 2**20:,.0f} | {peak / 2**20:,.0f} | {peak / planned:.2f}× | "
              f"{cosine:.4f} | {top1:.3f} | {sizes(out)} |", flush=True)
        shutil.rmtree(out.parent)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
