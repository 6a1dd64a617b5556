"""int4 on an exported decoder: qrc (rtn, mse, gptq) vs onnxruntime's MatMulNBitsQuantizer (RTN and its
GPTQ) vs onnxruntime-genai's model builder int4, side by side in one run.

    python bench/onnx_decoder.py [--layers 4 --hidden 512 --vocab 8192]

A random-weight Qwen2 decoder (transformers config, no download) is exported by the builder in fp32:
that graph (fused GroupQueryAttention) is the float reference and the input of qrc and of onnxruntime's
quantizer; the builder's own int4 export is the third anchor. Each tool runs in its own process (wall
time, peak RSS from VmHWM). Fidelity: logits vs the float graph on 8 held-out samples of 128 tokens,
empty cache (cosine, top-1 agreement, KL of the softmax). Decode: greedy generation of 256 tokens in
onnxruntime-genai after an 8-token prompt, ms per token (median of 5). Block size 32 everywhere,
MatMulNBits accuracy_level 4 (the builder's CPU default, qrc's default). GPTQ calibrates on random token
ids, 128 tokens per sample: 32 samples for both tools (dampening 0.01, no act-order, symmetric), and qrc
again with 128 samples to show its peak stays flat in the sample count.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_ort import child, planned_peak, run_qrc  # noqa: E402

BLOCK = 32


def decoder_folder(tmp: Path, layers: int, hidden: int, vocab: int, family: str = "qwen2") -> Path:
    """A random Qwen2 (or Llama) folder with a word-level tokenizer (the builder loads one), untied."""
    import transformers

    config_class, model_class = {"qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
                                 "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM)}[family]
    config = config_class(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 11 // 4,
                          num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=2,
                          max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                          tie_word_embeddings=False)
    return random_decoder(tmp / family, model_class, config, vocab)


def random_decoder(folder: Path, model_class, config, vocab: int) -> Path:
    """`model_class(config)` with seeded random weights saved to `folder`, and a word-level tokenizer over
    the vocabulary (ids 1 and 2 are bos and eos)."""
    import torch
    from tokenizers import Tokenizer, models

    torch.manual_seed(0)
    model_class(config).eval().save_pretrained(folder)
    Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0")).save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                              "bos_token": "t1", "eos_token": "t2", "pad_token": "t0"}))
    return folder


def builder(folder: Path, out: Path, precision: str) -> tuple[float, int, str]:
    """The builder in a child process: (seconds, peak RSS, error)."""
    extra = f", '--extra_options', 'int4_block_size={BLOCK}'" if precision == "int4" else ""
    return child(f"import sys, runpy\nsys.argv = ['builder', '-i', {str(folder)!r}, '-o', {str(out)!r}, '-p', "
                 f"{precision!r}, '-e', 'cpu', '-c', {str(out.parent / 'cache')!r}{extra}]\n"
                 "runpy.run_module('onnxruntime_genai.models.builder', run_name='__main__')")


def qrc(model: Path, out: Path, rounding: str, tmp: Path, samples: int = 32) -> tuple[float, int, str]:
    recipe = tmp / f"{rounding}-{samples}.recipe"
    recipe.write_text(f'recipe bench {{ model "{model}"  backend onnx\n'
                      f"  scheme s = W4A16 {{ group {BLOCK}  rounding {rounding} }}\n"
                      '  quantize { type Linear -> s  "model.embed_tokens" -> none }\n'
                      f"  calibrate {{ data synthetic {{ samples {samples}  seqlen 128 }}  chunk 8 }}\n"
                      f'  emit "{out}" {{ format matmul_nbits  accuracy_level 4 }} }}\n')
    return run_qrc(recipe)


def ort_rtn(model: Path, out: Path) -> tuple[float, int, str]:
    return child(f"""
import onnx
from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer, DefaultWeightOnlyQuantConfig
model = onnx.load({str(model)!r})
config = DefaultWeightOnlyQuantConfig(block_size={BLOCK}, is_symmetric=True, accuracy_level=4)
q = MatMulNBitsQuantizer(model, block_size={BLOCK}, is_symmetric=True, accuracy_level=4, algo_config=config)
q.process()
q.model.save_model_to_file({str(out)!r}, use_external_data_format=True)
""")


def ort_gptq(model: Path, out: Path, vocab: int) -> tuple[float, int, str]:
    """onnxruntime's GPTQ (its bundled neural-compressor code) with 32 random-id samples of 128 tokens."""
    return child(f"""
import json, numpy as np, onnx
from onnxruntime.quantization import CalibrationDataReader
from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer, GPTQWeightOnlyQuantConfig
decoder = json.load(open({str(model.parent / "genai_config.json")!r}))["model"]["decoder"]
model = onnx.load({str(model)!r})
past = [i.name for i in model.graph.input if i.name.startswith("past_key_values")]

class Reader(CalibrationDataReader):
    def __init__(self):
        rng = np.random.RandomState(7)
        self.feeds = []
        for _ in range(32):
            ids = rng.randint(0, {vocab}, (1, 128)).astype(np.int64)
            feed = {{"input_ids": ids, "attention_mask": np.ones_like(ids)}}
            feed.update({{p: np.zeros((1, decoder["num_key_value_heads"], 0, decoder["head_size"]), np.float32)
                         for p in past}})
            self.feeds.append(feed)
        self.at = iter(self.feeds)
    def get_next(self):
        return next(self.at, None)
    def __deepcopy__(self, memo):
        return Reader()

config = GPTQWeightOnlyQuantConfig(calibration_data_reader=Reader(), percdamp=0.01, block_size=128, actorder=False)
q = MatMulNBitsQuantizer(model, block_size={BLOCK}, is_symmetric=True, accuracy_level=4, algo_config=config,
                         nodes_to_exclude=[])
q.process()
q.model.save_model_to_file({str(out)!r}, use_external_data_format=True)
""")


def plan_vs_measured(model: Path, tmp: Path) -> str:
    """W8A8 with calibration (32 × 128 tokens, chunk 8) and verification on the float graph: the plan's peak
    and the compile's VmHWM."""
    recipe = tmp / "w8a8.recipe"
    recipe.write_text(f'recipe plan {{ model "{model}"  backend onnx\n  quantize {{ type Linear -> W8A8  "lm_head" -> none }}\n'
                      "  calibrate { data synthetic { samples 32  seqlen 128 }  chunk 8 }\n"
                      "  verify { samples 8  metric cosine  at_least 0.9 }\n"
                      f'  emit "{tmp / "w8a8" / "model.onnx"}" {{ format qdq }} }}\n')
    planned = planned_peak(recipe)
    _, peak, err = run_qrc(recipe)
    if err:
        return f"W8A8 plan vs measured: {err}"
    return (f"W8A8 (32 × 128 tokens, chunk 8, verify 8): planned {planned / 2**20:,.0f} MiB, measured VmHWM "
            f"{peak / 2**20:,.0f} MiB ({peak / planned:.2f}×)")


def genai_folder(model: Path, float_folder: Path) -> Path:
    """A folder onnxruntime-genai loads: the model, and the float export's genai_config (file renamed)."""
    folder = model.parent
    if not (folder / "genai_config.json").exists():
        config = json.loads((float_folder / "genai_config.json").read_text())
        config["model"]["decoder"]["filename"] = model.name
        (folder / "genai_config.json").write_text(json.dumps(config))
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(float_folder / name, folder / name)
    return folder


def fidelity(float_model: Path, model: Path, vocab: int) -> tuple[float, float, float]:
    import onnxruntime as ort

    ref, cand = (ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in (float_model, model))
    rng = np.random.RandomState(1_000_003)
    cosines, agree, kls = [], [], []
    for _ in range(8):
        ids = rng.randint(0, vocab, (1, 128)).astype(np.int64)
        a, b = (s.run(["logits"], _feed(s, ids))[0][0].astype(np.float64) for s in (ref, cand))
        cosines.append(float(np.mean((a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1))))
        agree.append(float(np.mean(a.argmax(-1) == b.argmax(-1))))
        la, lb = _log_softmax(a), _log_softmax(b)
        kls.append(float(np.mean((np.exp(la) * (la - lb)).sum(-1))))
    return float(np.mean(cosines)), float(np.mean(agree)), float(np.mean(kls))


def _feed(session, ids: np.ndarray) -> dict:
    config = json.loads((Path(session._model_path).parent / "genai_config.json").read_text())["model"]["decoder"]
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    for info in session.get_inputs():
        if info.name.startswith("past_key_values"):
            feed[info.name] = np.zeros((1, config["num_key_value_heads"], 0, config["head_size"]), np.float32)
    return feed


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def decode_ms(folder: Path) -> float:
    import time

    import onnxruntime_genai as og

    model = og.Model(str(folder))
    times = []
    for _ in range(5):
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=264, min_length=264, do_sample=False)
        generator = og.Generator(model, params)
        generator.append_tokens(np.arange(3, 11, dtype=np.int32)[None])
        start, steps = time.perf_counter(), 0
        while not generator.is_done():
            generator.generate_next_token()
            steps += 1
        times.append((time.perf_counter() - start) / steps * 1000)
    return float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=8192)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="qrc-bench-decoder-"))
    folder = decoder_folder(tmp, args.layers, args.hidden, args.vocab)
    seconds, peak, err = builder(folder, tmp / "fp32", "fp32")
    assert not err, err
    float_model = tmp / "fp32" / "model.onnx"
    rows = []
    runs = {"onnxruntime-genai builder int4": (lambda out: builder(folder, out.parent, "int4"), "b4/model.onnx"),
            "onnxruntime MatMulNBitsQuantizer (RTN)": (lambda out: ort_rtn(float_model, out), "ort/model.onnx"),
            "onnxruntime MatMulNBitsQuantizer (GPTQ, 32 samples)": (lambda out: ort_gptq(float_model, out, args.vocab),
                                                                    "ort-gptq/model.onnx"),
            "qrc rtn": (lambda out: qrc(float_model, out, "rtn", tmp), "qrc-rtn/model.onnx"),
            "qrc mse": (lambda out: qrc(float_model, out, "mse", tmp), "qrc-mse/model.onnx"),
            "qrc gptq (32 samples)": (lambda out: qrc(float_model, out, "gptq", tmp), "qrc-gptq/model.onnx"),
            "qrc gptq (128 samples)": (lambda out: qrc(float_model, out, "gptq", tmp, 128), "qrc-gptq128/model.onnx")}
    for name, (run, where) in runs.items():
        out = tmp / where
        out.parent.mkdir(parents=True, exist_ok=True)
        seconds, peak, err = run(out)
        if err:
            rows.append(f"| {name} | {err} | | | | | |")
            continue
        folder_g = genai_folder(out, float_model.parent)
        cosine, top1, kl = fidelity(float_model, out, args.vocab)
        rows.append(f"| {name} | {seconds:.1f} | {peak / 2**20:,.0f} | {cosine:.4f} | {top1:.4f} | {kl:.5f} | "
                    f"{decode_ms(folder_g):.2f} |")
    plan_line = plan_vs_measured(float_model, tmp)
    float_ms = decode_ms(float_model.parent)
    print(f"random Qwen2, {args.layers} layers, hidden {args.hidden}, vocab {args.vocab}; float fp32 decode "
          f"{float_ms:.2f} ms/token\n")
    print("| int4, block 32 | wall s | peak RSS MiB | logits cosine | top-1 | KL | decode ms/token |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))
    print(f"\n{plan_line}")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
