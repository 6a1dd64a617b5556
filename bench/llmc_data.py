"""Shared by the llm-compressor runners (run with the interpreter of a venv that has llm-compressor): the
npz's token ids as a tokenized dataset, and the one-word processor `oneshot` wants beside it."""

from __future__ import annotations


def dataset_and_processor(npz: str):
    """(dataset, processor, ids) for `oneshot` from an npz with `input_ids` (already tokenized)."""
    import numpy as np
    import transformers
    from datasets import Dataset
    from tokenizers import Tokenizer, models

    ids = np.load(npz)["input_ids"]
    dataset = Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": np.ones_like(ids).tolist()})
    processor = transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")), unk_token="[UNK]",
        pad_token="[UNK]")
    return dataset, processor, ids
