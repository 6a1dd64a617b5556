"""Writes recipes/data/tokenizer/: a small byte-level BPE tokenizer (512 tokens, the vocabulary of
`builtin:tiny-llama`) trained on the text in recipes/data, with a chat template, so that the example recipes
and the tests can read chat rows through a tokenizer's own template without downloading one.

    python recipes/data/make_tokenizer.py
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

HERE = Path(__file__).resolve().parent
SPECIAL = ["<pad>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]
# each turn: its role's token, the text, the end token; `add_generation_prompt` opens the assistant's turn
TEMPLATE = ("{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}"
            "{{ eos_token }}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")


def texts() -> list[str]:
    """Every text in the shipped files: corpus rows, chat turns and the MiniLM calibration lines."""
    out = [json.loads(line)["text"] for line in (HERE / "corpus.jsonl").read_text().splitlines()]
    for line in (HERE / "chat.jsonl").read_text().splitlines():
        out += [m["content"] for m in json.loads(line)["messages"]]
    return out + (HERE / "minilm-calibration.txt").read_text().splitlines()


def main() -> None:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts(), trainer)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>",
                                      pad_token="<pad>", chat_template=TEMPLATE)
    wrapped.save_pretrained(str(HERE / "tokenizer"))


if __name__ == "__main__":
    main()
