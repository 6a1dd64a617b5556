"""GPTQ on a Qwen3-MoE-shaped model: qrc with its experts rounded as batches, qrc one expert at a time, and
llm-compressor's `oneshot`, same model, same data, one run.

    python bench/moe_gptq.py [--blocks 8] [--experts 16] [--hidden 512] [--llmcompressor PYTHON]

The model and data are bench/moe_offload.py's: a Qwen3-MoE built by transformers from a config (top-2 routing,
expert width hidden / 2, seeded random weights) saved with `save_pretrained`, and 32 calibration samples of 256
token ids from qrc's synthetic source in an npz both tools read. GPTQ W4A16 group 128 on every Linear but the
routers and the LM head, and the folder saved: the same work for both tools (qrc's recipe has no `verify`, which
llm-compressor does not do). Each run is a process of its own: wall seconds and peak RSS (VmHWM); qrc's runs also
report the seconds its rounding took (every call of the torch backend's Rounder.in_place: GPTQ and writing the
tensors) and, within them, the seconds GPTQ took on the experts (Rounder._gptq_batch, or Rounder.quantize of each
expert one at a time), which is where batching acts. The second qrc run sets plan/memory.py's EXPERT_BATCH_BYTES to 0, so no
batch fits and each expert rounds alone (the same integers: tests/test_zoo.py checks the folders are equal). qrc
sends every calibration token through every expert for statistics by default (`experts all`); the third run gives
each expert its routed tokens only (`experts routed`), as the model's own forward does. llm-compressor runs both
ways too: its default (`moe_calibrate_all_experts`, every expert sees every token) and routed.
Quality is measured outside the tools: transformers loads the float folder and each output (compressed-tensors
dequantizes it) and takes the KL divergence of the next-token distributions on 8 held-out samples.

llm-compressor 0.14 pins transformers 5.17 and compressed-tensors 0.19: its own venv,
`python -m venv V && V/bin/pip install torch==2.13.0 llmcompressor`, then `--llmcompressor V/bin/python`.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from moe_offload import (  # noqa: E402  (the bench folder is not a package)
    CHUNK,
    HELD_OUT,
    LLMC_CHILD,
    SAMPLES,
    SEQLEN,
    checkpoint,
    kl_divergence,
    model_arguments,
    packed_experts,
    run,
    token_data,
)

# qrc in its own process, the rounding's seconds summed around Rounder.in_place; argv[2] "alone" turns batching off
QRC_CHILD = """
import atexit, json, re, sys, time
from pathlib import Path
from rich.console import Console
import compiler.plan.memory
from compiler.backends.torch import rounding
from compiler.compile_run import compile_recipe
if sys.argv[2] == 'alone':
    compiler.plan.memory.EXPERT_BATCH_BYTES = 0
spent = [0.0, 0.0]  # every layer's rounding with its writes; the experts' GPTQ alone
in_place, batch, quantize = rounding.Rounder.in_place, rounding.Rounder._gptq_batch, rounding.Rounder.quantize
def timed(method, slot, only=lambda job: True):
    def run(self, first, *args, **kwargs):
        start = time.perf_counter()
        try:
            return method(self, first, *args, **kwargs)
        finally:
            if only(first):
                spent[slot] += time.perf_counter() - start
    return run
rounding.Rounder.in_place = timed(in_place, 0)
rounding.Rounder._gptq_batch = timed(batch, 1)
rounding.Rounder.quantize = timed(quantize, 1, lambda job: '.experts.' in job.layer.name)
atexit.register(lambda: print('HWM', re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)))
result, planned = compile_recipe(Path(sys.argv[1]), (), None, Console(file=open('/dev/null', 'w')))
print('RESULT', json.dumps({'planned': planned.plan.peak_bytes, 'rounding': spent[0], 'experts': spent[1]}))
"""

LLMC_LABELS = {"all": "every expert sees every token (its default)", "routed": "`moe_calibrate_all_experts=False`"}


def recipe(folder: Path, data: Path, tmp: Path, name: str, experts: str = "all") -> Path:
    """qrc's recipe: GPTQ W4A16 g128 (act-order, qrc's default), routers and head float, the planner's mode;
    `experts`: which tokens reach each expert for its statistics (`all`, qrc's default, or `routed`)."""
    path = tmp / f"{name}.recipe"
    path.write_text(
        f'recipe bench_moe_gptq {{\n model "{folder}"\n backend torch\n scheme w4 = W4A16 {{ group 128  rounding gptq }}\n'
        ' quantize {\n  type Linear -> w4\n  "lm_head" -> none\n  re".*\\.mlp\\.gate" -> none\n }\n'
        f' calibrate {{ data npz "{data}" {{ samples {SAMPLES} }}  chunk {CHUNK}  experts {experts} }}\n'
        f' emit "{tmp / name}"\n}}\n')
    return path


def main() -> None:
    args = model_arguments(__doc__.splitlines()[0])
    folder = checkpoint(args.blocks, args.experts, args.hidden)
    mib = 2**20
    print(f"{folder.name}: {args.blocks} blocks × {args.experts} experts of [{args.hidden // 2}, {args.hidden}] and "
          f"[{args.hidden}, {args.hidden // 2}], top-2; GPTQ W4A16 g128, {SAMPLES} samples × {SEQLEN} tokens; KL on "
          f"{HELD_OUT} held out\n")
    print("| run | wall s | rounding s | experts' GPTQ s | peak RSS (VmHWM) | plan | int4 experts | KL (transformers) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        _, calibration, held_out = token_data(folder, tmp)
        for label, mode, experts in (("qrc, experts in batches (every expert sees every token, its default)", "batched", "all"),
                                     ("qrc, one expert at a time (every token)", "alone", "all"),
                                     ("qrc, experts in batches, `experts routed`", "routed", "routed")):
            r = run([sys.executable, "-c", QRC_CHILD, str(recipe(folder, calibration, tmp, mode, experts)), mode])
            if "error" in r:
                print(f"| {label} | {r['seconds']:.1f} | failed: {r['error']} | | | | | |", flush=True)
                continue
            print(f"| {label} | {r['seconds']:.1f} | {r['rounding']:.1f} | {r['experts']:.1f} | {r['hwm'] / mib:,.0f} MiB | "
                  f"{r['planned'] / mib:,.0f} MiB | {packed_experts(tmp / mode)} | "
                  f"{kl_divergence(folder, tmp / mode, held_out):.4g} |", flush=True)
        for experts in ("all", "routed") if args.llmcompressor else ():
            label, out = f"llm-compressor oneshot, {LLMC_LABELS[experts]}", tmp / f"llmc-{experts}"
            r = run([args.llmcompressor, "-c", LLMC_CHILD, str(folder), str(calibration), str(out), str(SEQLEN),
                     str(SAMPLES), experts])
            if "error" in r:
                print(f"| {label} | {r['seconds']:.1f} | failed: {r['error']} | | | | | |", flush=True)
            else:
                print(f"| {label} | {r['seconds']:.1f} | | | {r['hwm'] / mib:,.0f} MiB | | {packed_experts(out)} | "
                      f"{kl_divergence(folder, out, held_out):.4g} |", flush=True)



if __name__ == "__main__":
    main()
