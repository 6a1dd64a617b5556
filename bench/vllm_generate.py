"""Run by bench/vllm_side_by_side.py with the interpreter of the venv that has vLLM's CPU build: load one
folder, generate greedily from the given token ids, print one JSON line (the generated ids, or vLLM's
refusal: the exception's type and first line).

    VLLM_VENV/bin/python bench/vllm_generate.py FOLDER PROMPTS_JSON KV_CACHE_DTYPE
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    folder, prompts, kv_dtype = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    from vllm import LLM, SamplingParams

    try:
        # on the CPU backend gpu_memory_utilization is the share of RAM vLLM reserves (its 0.92 default wants
        # nearly all of this machine's 24 GiB)
        llm = LLM(model=folder, skip_tokenizer_init=True, max_model_len=256, enforce_eager=True,
                  kv_cache_dtype=kv_dtype, seed=0, gpu_memory_utilization=0.15)
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                               SamplingParams(max_tokens=8, temperature=0.0, detokenize=False))
        print("RESULT " + json.dumps({"tokens": [list(o.outputs[0].token_ids) for o in outputs]}), flush=True)
    except Exception as exc:  # vLLM's refusal is the figure: report it, whatever its type
        message = (str(exc).strip().splitlines() or [""])[0][:240]
        print("RESULT " + json.dumps({"error": f"{type(exc).__name__}: {message}"}), flush=True)


if __name__ == "__main__":  # vLLM starts worker processes that import this module
    main()
