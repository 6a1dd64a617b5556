"""llama.cpp itself, run on a GGUF file from the tests through llama-cpp-python (which builds llama.cpp from
source when pip installs it): the logits it computes for token ids, and the text it generates."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def logits(path: Path, ids: list[int], threads: int = 2) -> np.ndarray:
    """[len(ids), vocab] logits llama.cpp computes for `ids` in one batch (a fresh context, no BOS added)."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(path), logits_all=True, n_ctx=max(64, len(ids)), n_threads=threads,
                          verbose=False)
    try:
        llm.eval(ids)
        return np.array(llm.scores[:len(ids)], dtype=np.float32)
    finally:
        llm.close()


def generate(path: Path, prompt: str, tokens: int = 8) -> str:
    """Greedy text llama.cpp generates after `prompt` (tokenized by the file's own tokenizer)."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(path), n_ctx=128, n_threads=2, verbose=False, seed=0)
    try:
        return llm(prompt, max_tokens=tokens, temperature=0.0)["choices"][0]["text"]
    finally:
        llm.close()
