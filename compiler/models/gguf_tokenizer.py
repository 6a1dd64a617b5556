"""A byte-level BPE tokenizer.json rebuilt from a GGUF file's vocabulary and merges with the `tokenizers` library
(no torch: `qrc check` reads GGUF sources too). llama.cpp stores a gpt2-type vocabulary spelled in GPT-2's
byte alphabet, so the tokens and merges go into a BPE model as they are; tokens the file marks as control (type
3) become special tokens, user-defined ones (type 4) added tokens that are never split. The text is split as
the vocabulary was learned: the regex of the file's `tokenizer.ggml.pre` where it is one of the known ones,
else GPT-2's own."""

from __future__ import annotations

_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPLITS = {"llama3": _LLAMA3, "llama-v3": _LLAMA3, "llama-bpe": _LLAMA3, "smaug-bpe": _LLAMA3, "dbrx": _LLAMA3,
          "qwen2": _QWEN2, "deepseek-r1-qwen": _QWEN2}
_CONTROL, _USER_DEFINED = 3, 4


def byte_level_bpe(tokens: list[str], merges: list[str], types: object, pre: str) -> str:
    """tokenizer.json's text for the vocabulary `tokens`, `merges` ("a b" each), the token types (a list, or
    anything else for none) and the pre-tokenizer name."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = {token: index for index, token in enumerate(tokens)}
    pairs = [(left, right) for left, _, right in (merge.partition(" ") for merge in merges if " " in merge)]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))
    split = SPLITS.get(pre)
    if split is not None:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    kinds = types if isinstance(types, list) and len(types) == len(tokens) else [0] * len(tokens)
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                  for t, kind in zip(tokens, kinds, strict=True) if kind == _CONTROL])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False)
                          for t, kind in zip(tokens, kinds, strict=True) if kind == _USER_DEFINED])
    return tokenizer.to_str(pretty=False)
