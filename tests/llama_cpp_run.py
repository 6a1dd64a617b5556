"""llama.cpp itself, run on a GGUF file from the tests: the logits it computes for token ids, and what it
generates. llama-cpp-python where it is installed (it builds llama.cpp from source, minutes on this machine);
otherwise llama-cpp-py-sync, whose wheels carry a prebuilt llama.cpp of the same upstream (the CI install)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def logits(path: Path, ids: list[int], threads: int = 2) -> np.ndarray:
    """[len(ids), vocab] logits llama.cpp computes for `ids` in one batch (a fresh context, no BOS added)."""
    try:
        import llama_cpp
    except ImportError:
        return _sync_logits(path, ids, threads)
    llm = llama_cpp.Llama(model_path=str(path), logits_all=True, n_ctx=max(64, len(ids)), n_threads=threads,
                          verbose=False)
    try:
        llm.eval(ids)
        return np.array(llm.scores[:len(ids)], dtype=np.float32)
    finally:
        llm.close()


def generate(path: Path, prompt: str, tokens: int = 8) -> str:
    """Greedy text llama.cpp generates after `prompt` (tokenized by the file's own tokenizer)."""
    try:
        import llama_cpp
    except ImportError:
        import llama_cpp_py_sync

        with llama_cpp_py_sync.Llama(str(path), n_ctx=128, n_threads=2, seed=0) as llm:
            return llm.generate(prompt, max_tokens=tokens, temperature=0.0)
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=128, n_threads=2, verbose=False, seed=0)
    try:
        return llm(prompt, max_tokens=tokens, temperature=0.0)["choices"][0]["text"]
    finally:
        llm.close()


def _sync_logits(path: Path, ids: list[int], threads: int) -> np.ndarray:
    """The same through llama-cpp-py-sync's C bindings (its high-level API keeps the last position's only)."""
    import llama_cpp_py_sync

    with llama_cpp_py_sync.Llama(str(path), n_ctx=max(64, len(ids)), n_batch=max(64, len(ids)), n_threads=threads,
                                 seed=0) as llm:
        lib, ctx = llm._lib, llm._ctx
        batch = lib.llama_batch_init(len(ids), 0, 1)
        try:
            batch.n_tokens = len(ids)
            for i, token in enumerate(ids):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = int(token), i, 1
                batch.seq_id[i][0], batch.logits[i] = 0, 1
            if lib.llama_decode(ctx, batch) != 0:
                raise RuntimeError("llama_decode failed")
            vocab = llm.n_vocab
            return np.stack([np.frombuffer(llm._ffi.buffer(lib.llama_get_logits_ith(ctx, i), 4 * vocab),
                                           dtype=np.float32).copy() for i in range(len(ids))])
        finally:
            lib.llama_batch_free(batch)
