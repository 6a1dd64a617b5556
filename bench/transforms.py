"""AWQ and SmoothQuant on a random-weight Llama with injected outlier channels, side by side with plain
rounding and (with `--llmcompressor`) llm-compressor's AWQModifier / SmoothQuantModifier on the same model
and calibration samples. Quality is measured outside qrc: transformers loads every folder
(compressed-tensors dequantizes the weights) and, for W8A8, the bench's own hooks quantize each Linear's
inputs as the folder's config says (static per-tensor scales from the folder, or dynamic per token), so
activations are really quantized. KL(float ‖ quantized), cosine and top-1 agreement on 16 held-out samples
(`--heldout N`: the KL's mean ± standard deviation over N such sets, cosine and top-1 the first set's).

    python bench/transforms.py [--hidden 512] [--layers 4] [--factor 20] [--alpha 0.8]
                               [--llmcompressor VENV/bin/python] [--onnx] [--no-torch] [--repeat N] [--heldout N]

With `--onnx`, the same folder is compiled on the ONNX backend too (qrc exports it): W8A8 QDQ with and
without SmoothQuant, W4A16 MatMulNBits with and without AWQ, each emitted model run in onnxruntime on the
held-out ids and compared with transformers' float logits (an exported decoder takes positions and a cache,
so these runs calibrate on synthetic ids of the same shape rather than on the npz).

Outliers: channels 3, 17, 40, … (every 37th) of every input and post-attention norm weight are scaled by
`--factor`, so the activations the projections read have the few large channels real LLMs have. Prints one
markdown table; times are each whole run (qrc: its compile; llm-compressor: its `oneshot` call), the best of
`--repeat` rounds that run every qrc and llm-compressor job once each, alternating.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from float_formats import compile_program, independent, model_folder, perplexity_cell

ROOT = Path(__file__).resolve().parents[1]
RECIPE = """recipe bench {{
    model "{model}"
    backend torch
    {transform}
    scheme s = {scheme}
    quantize {{ type Linear -> s  "lm_head" -> none }}
    group auto
    calibrate {{ data npz "{npz}" {{ samples 32 }}  chunk 8 }}
    memory {{ mode offload }}
    verify {{ samples 16  metric kld  at_most 10 }}
    emit "{out}"
}}
"""
DYNAMIC = "W8A8"  # per-token dynamic inputs: llm-compressor's W8A8, and qrc's preset


def outlier_model(hidden: int, layers: int, factor: float) -> Path:
    """The bench Llama with outlier channels in its pre-norms, saved once beside it."""
    import torch
    import transformers

    base = model_folder(hidden, layers)
    folder = base.with_name(f"{base.name}-outliers{factor:g}")
    if not (folder / "model.safetensors").exists():
        model = transformers.AutoModelForCausalLM.from_pretrained(str(base))
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith(("input_layernorm.weight", "post_attention_layernorm.weight")):
                    param[3::37] *= factor
        model.save_pretrained(folder)
    return folder


def calibration_npz(folder: Path, vocab: int = 8192) -> Path:
    """32 samples of 128 random token ids (and 16 held out for verification), the same for both tools."""
    import numpy as np

    path = folder / "calibration.npz"
    ids = np.random.default_rng(1).integers(0, vocab, (48, 128), dtype=np.int64)
    np.savez(path, input_ids=ids, attention_mask=np.ones_like(ids))
    np.savez(folder / "llmc.npz", input_ids=ids[:32], attention_mask=np.ones_like(ids[:32]))
    return path


def activation_hooks(model, out: Path) -> None:
    """Quantize each quantized Linear's input as the folder says: int8 static per tensor (the folder's
    input_scale / input_zero_point) or dynamic per token (symmetric, from each token's range)."""
    import json

    import torch
    from safetensors.torch import load_file

    config = json.loads((out / "config.json").read_text())["quantization_config"]
    group = next(iter(config["config_groups"].values()))
    act = group.get("input_activations")
    if not act:
        return
    tensors = load_file(str(out / "model.safetensors"))
    qmin, qmax = (-128, 127) if act["type"] == "int" else (0, 255)
    for name, module in model.named_modules():
        if f"{name}.weight_scale" not in tensors or not isinstance(module, torch.nn.Linear):
            continue
        scale = tensors.get(f"{name}.input_scale")
        zero = tensors.get(f"{name}.input_zero_point")

        def hook(mod, args, scale=scale, zero=zero):
            x = args[0]
            if act["dynamic"]:
                s = x.abs().amax(-1, keepdim=True).clamp(min=1e-8) / 127
                return (torch.clamp(torch.round(x / s), -127, 127) * s,)
            z = zero.float() if zero is not None else 0.0
            return ((torch.clamp(torch.round(x / scale.float()) + z, qmin, qmax) - z) * scale.float(),)

        module.register_forward_pre_hook(hook)


def measure(float_folder: Path, out: Path, sets: int = 1) -> dict:
    """float_formats.independent, with the folder's activation quantization applied, on `sets` held-out sets:
    the first set's figures, the KL as the mean over the sets (`kl_spread`: their standard deviation)."""
    import numpy as np

    found = [independent(float_folder, out, prepare=lambda model: activation_hooks(model, out), seed=99 + i)
             for i in range(sets)]
    kl = np.array([f["kl"] for f in found])
    return {**found[0], "kl": float(kl.mean()), "kl_spread": float(kl.std(ddof=1)) if sets > 1 else None}


ONNX_RECIPE = """recipe bench {{
    model "{model}"
    backend onnx
    {transform}
    quantize {{ type Linear -> {scheme}  "lm_head" -> none }}
    calibrate {{ data synthetic {{ samples 32  seqlen 128  seed 1 }}  chunk 8 }}
    memory {{ mode low_memory }}
    verify {{ samples 16  metric kld  at_most 10 }}
    emit "{out}" {{ format {fmt} }}
}}
"""


def measure_onnx(float_folder: Path, out: Path) -> dict:
    """The emitted decoder in onnxruntime (empty cache) against transformers' float logits, same ids."""
    import json

    import numpy as np
    import onnxruntime as ort
    import torch
    import transformers

    config = json.loads((float_folder / "config.json").read_text())
    head = config["hidden_size"] // config["num_attention_heads"]
    ids = torch.randint(0, 8192, (16, 128), generator=torch.Generator().manual_seed(99))
    reference = transformers.AutoModelForCausalLM.from_pretrained(str(float_folder)).eval()
    with torch.no_grad():
        a = reference(ids).logits.float()
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    feed = {"input_ids": ids.numpy(), "attention_mask": np.ones(ids.shape, np.int64),
            "position_ids": np.broadcast_to(np.arange(ids.shape[1]), ids.shape).astype(np.int64)}
    for info in session.get_inputs():
        if info.name.startswith("past_key_values"):
            feed[info.name] = np.zeros((ids.shape[0], config["num_key_value_heads"], 0, head), np.float32)
    b = torch.from_numpy(session.run(["logits"], {k: v for k, v in feed.items()
                                                  if k in {i.name for i in session.get_inputs()}})[0]).float()
    p, q = a.log_softmax(-1), b.log_softmax(-1)
    return {"kl": float((p.exp() * (p - q)).sum(-1).mean()),
            "cosine": float(torch.nn.functional.cosine_similarity(a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1]),
                                                                  dim=-1).mean()),
            "top1": float((a.argmax(-1) == b.argmax(-1)).float().mean())}


def onnx_rows(folder: Path, tmp: Path, alpha: float) -> list:
    """qrc's ONNX backend on the folder: plain rounding and each transform, measured in onnxruntime."""
    rows = []
    sq = f"transform smoothquant {{ alpha {alpha} }}"
    for label, transform, scheme, fmt in (("W8A8 static", "", "W8A8", "qdq"), ("W8A8 static smoothquant", sq, "W8A8", "qdq"),
                                          ("W4A16 rtn", "", "W4A16", "matmul_nbits"),
                                          ("W4A16 awq", "transform awq", "W4A16", "matmul_nbits")):
        out = tmp / f"onnx-{label.replace(' ', '-')}.onnx"
        recipe = tmp / "onnx.recipe"
        recipe.write_text(ONNX_RECIPE.format(model=folder, transform=transform, scheme=scheme, out=out, fmt=fmt))
        start = time.perf_counter()
        result, _ = compile_program(str(recipe), out)
        rows.append((f"qrc onnx {label}", time.perf_counter() - start, measure_onnx(folder, out), result.verify["kld"]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--factor", type=float, default=20.0)
    parser.add_argument("--alpha", type=float, default=0.8)
    parser.add_argument("--llmcompressor", help="python of a venv with llm-compressor")
    parser.add_argument("--onnx", action="store_true", help="also compile on the ONNX backend")
    parser.add_argument("--no-torch", action="store_true", help="skip the torch backend's runs")
    parser.add_argument("--repeat", type=int, default=1, help="rounds of every run, alternating; the best time counts")
    parser.add_argument("--heldout", type=int, default=1, help="held-out sets of 16 samples the KL is averaged over")
    args = parser.parse_args()
    folder = outlier_model(args.hidden, args.layers, args.factor)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        npz = calibration_npz(Path(tmp))
        jobs = [] if args.no_torch else qrc_jobs(folder, Path(tmp), npz, args.alpha)
        if args.llmcompressor:
            jobs += llmc_jobs(args.llmcompressor, folder, Path(tmp), args.alpha)
        best: dict[str, float] = {}
        own: dict[str, float | None] = {}
        for _ in range(args.repeat):  # alternating: a slow spell of the machine falls on every tool
            for label, out, run in jobs:
                shutil.rmtree(out, ignore_errors=True)
                done = run()
                if done is None:
                    continue
                best[label] = min(best.get(label, float("inf")), done[0])
                own[label] = done[1]
        rows = [(label, best[label], measure(folder, out, args.heldout), own[label])
                for label, out, _ in jobs if label in best]
        if args.onnx:
            rows += onnx_rows(folder, Path(tmp), args.alpha)
    print(f"Llama h{args.hidden} × {args.layers} blocks, outlier channels ×{args.factor:g}; 32 × 128 calibration, "
          f"{args.heldout} × 16 × 128 held out; best of {args.repeat} alternating\n")
    print("| run | time | KL (transformers) | cosine | top-1 | KL (qrc verify) | perplexity on the shipped text (vs float) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, seconds, m, verified in rows:
        spread = f" ± {m['kl_spread']:.5f}" if m.get("kl_spread") is not None else ""
        print(f"| {label} | {seconds:.1f} s | {m['kl']:.5f}{spread} | {m['cosine']:.4f} | {m['top1']:.3f} | "
              f"{'' if verified is None else f'{verified:.5f}'} | {perplexity_cell(m)} |")


def qrc_jobs(folder: Path, tmp: Path, npz: Path, alpha: float) -> list:
    """(label, output folder, run) for each qrc compile; a run returns (seconds, qrc's own verify KL)."""
    runs = [("W4A16 rtn", "", "W4A16"), ("W4A16 awq", "transform awq", "W4A16"),
            ("W8A8 static", "", "W8A8_STATIC"),
            ("W8A8 static smoothquant", f"transform smoothquant {{ alpha {alpha} }}", "W8A8_STATIC"),
            ("W8A8 dynamic", "", DYNAMIC),
            ("W8A8 dynamic smoothquant", f"transform smoothquant {{ alpha {alpha} }}", DYNAMIC)]
    jobs = []
    for label, transform, scheme in runs:
        out, recipe = tmp / label.replace(" ", "-"), tmp / f"{label.replace(' ', '-')}.recipe"
        recipe.write_text(RECIPE.format(model=folder, transform=transform, scheme=scheme, npz=npz, out=out))

        def run(recipe=recipe, out=out):
            start = time.perf_counter()
            result, _ = compile_program(str(recipe), out)
            return time.perf_counter() - start, result.verify["kld"]
        jobs.append((f"qrc {label}", out, run))
    return jobs


def llmc_jobs(python: str, folder: Path, tmp: Path, alpha: float) -> list:
    """(label, output folder, run) for each llm-compressor run; a run returns (its oneshot seconds, None), or
    None when it failed (said on the console)."""
    jobs = []
    for label, method in (("W4A16 rtn", "rtn"), ("W4A16 AWQModifier", "awq"), ("W8A8 dynamic", "w8a8"),
                          ("W8A8 dynamic SmoothQuantModifier", "smoothquant")):
        out = tmp / f"llmc-{method}"

        def run(label=label, method=method, out=out):
            done = subprocess.run([python, str(ROOT / "bench" / "llmc_calibrated.py"), str(folder),
                                   str(tmp / "llmc.npz"), method, str(out), str(alpha)], capture_output=True, text=True)
            if done.returncode:
                print(f"llm-compressor {label} failed:", done.stderr.strip().splitlines()[-1])
                return None
            return float(done.stdout.split("seconds")[-1].split()[0]), None
        jobs.append((f"llm-compressor {label}", out, run))
    return jobs


if __name__ == "__main__":
    main()
