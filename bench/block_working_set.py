"""One block's forward, measured against the plan's per-sample working set (compiler/plan/memory.py
block_working_set): a one-block random Llama run by transformers with SDPA (its default, what the torch
backend runs) and with eager attention, which holds the attention scores.

    python bench/block_working_set.py

Each case runs in its own process: the model's own forward on `batch` samples of all-ones-masked token ids
(as calibration feeds them), the kernel's high-water mark reset after the embeddings, so the figure is the
block's forward plus the (small) logits.
"""

from __future__ import annotations

import subprocess
import sys

CASES = [(4, 2048, 512, 1024, 8, 8), (2, 4096, 512, 1024, 8, 8), (4, 1024, 1024, 2816, 16, 16),
         (16, 512, 576, 1536, 9, 3), (4, 1024, 1024, 256, 16, 4)]

CHILD = """
import ctypes, re, sys, torch, transformers
batch, seqlen, hidden, inter, heads, kv, impl = (int(a) if a.isdigit() else a for a in sys.argv[1:])
ctypes.CDLL("libc.so.6").mallopt(-3, 4 << 20)  # M_MMAP_THRESHOLD at 4 MiB, as a compile sets it (backends/release.py)
config = transformers.LlamaConfig(vocab_size=64, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=1,
                                  num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=seqlen,
                                  attn_implementation=impl)
model = transformers.LlamaForCausalLM(config).eval()
ids = torch.randint(0, 64, (batch, seqlen))
def hwm():
    return int(re.search(r"VmHWM:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) * 1024
with torch.no_grad():
    model.model.embed_tokens(ids)
    open("/proc/self/clear_refs", "w").write("5")
    base = hwm()
    model(input_ids=ids, attention_mask=torch.ones_like(ids))
    print(hwm() - base)
"""


def planned(batch: int, seqlen: int, hidden: int, inter: int, heads: int, kv: int, scores: bool) -> int:
    """The plan's formula (compiler/plan/memory.py block_working_set, float32): the larger of the attention
    (with the scores where they are held) and the MLP."""
    from compiler.plan.memory import ACT_BYTES, ATTENTION_HIDDEN, ATTENTION_KV, MLP_HIDDEN, MLP_INTER

    attention = (ATTENTION_HIDDEN + ATTENTION_KV * kv / heads) * seqlen * hidden + (2 * heads * seqlen ** 2 if scores else 0)
    return int(ACT_BYTES * batch * max(attention, MLP_HIDDEN * seqlen * hidden + MLP_INTER * seqlen * inter))


def main() -> None:
    print("| batch × seqlen | hidden | MLP | heads (KV) | attention | planned MiB | measured MiB | measured / planned |")
    print("|---|---:|---:|---:|---|---:|---:|---:|")
    for batch, seqlen, hidden, inter, heads, kv in CASES:
        for impl in ("sdpa", "eager"):
            out = subprocess.run([sys.executable, "-c", CHILD, *map(str, (batch, seqlen, hidden, inter, heads, kv)), impl],
                                 capture_output=True, text=True, check=True)
            measured = int(out.stdout.strip().splitlines()[-1])
            plan = planned(batch, seqlen, hidden, inter, heads, kv, impl == "eager")
            print(f"| {batch} × {seqlen} | {hidden} | {inter} | {heads} ({kv}) | {impl} | {plan / 2**20:,.0f} | {measured / 2**20:,.0f} | "
                  f"{measured / plan:.2f}× |", flush=True)


if __name__ == "__main__":
    main()
