"""Run by bench/vllm_rotated.py with the interpreter of the venv that has vLLM's CPU build: load one folder and
print one JSON line with each window's mean negative log-likelihood of its own tokens (vLLM's prompt
log-probabilities), or vLLM's refusal.

    VLLM_VENV/bin/python bench/vllm_logprobs.py FOLDER WINDOWS_JSON
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    folder, windows = sys.argv[1], json.loads(sys.argv[2])
    from vllm import LLM, SamplingParams

    try:
        # on the CPU backend gpu_memory_utilization is the share of RAM vLLM reserves
        llm = LLM(model=folder, skip_tokenizer_init=True, max_model_len=max(len(w) for w in windows) + 8,
                  enforce_eager=True, seed=0, gpu_memory_utilization=0.15)
        outputs = llm.generate([{"prompt_token_ids": w} for w in windows],
                               SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False))
        nll = []
        for window, out in zip(windows, outputs, strict=True):
            said = out.prompt_logprobs[1:]  # the first token has no prediction
            nll.append(-sum(step[token].logprob for step, token in zip(said, window[1:], strict=True)) / len(said))
        print("RESULT " + json.dumps({"nll": nll}), flush=True)
    except Exception as exc:  # vLLM's refusal is the figure: report it, whatever its type
        message = (str(exc).strip().splitlines() or [""])[0][:240]
        print("RESULT " + json.dumps({"error": f"{type(exc).__name__}: {message}"}), flush=True)


if __name__ == "__main__":  # vLLM starts worker processes that import this module
    main()
