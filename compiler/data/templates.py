"""Chat templates rendered as the untrusted code they are: in a child process (data/template_worker.py) with a
deadline per row, a cap on the rendered text and a cap on the child's memory. Every way a template can fail (a
syntax error, `raise_exception`, an undefined name, a sandbox escape refused, an include, a loop past the
deadline, an output past the cap, memory) is one Q442 naming the template file, its line where Jinja gives one,
and the dataset row; nothing is written.

The limits (documented in docs/data.md) can be set by environment variables: QRC_TEMPLATE_SECONDS (per row,
default 10), QRC_TEMPLATE_CHARS (rendered characters per row, default 4,000,000) and QRC_TEMPLATE_MEMORY (the
child's memory beyond its imports, default 1 GiB)."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

from compiler.diagnostics import StageError, error
from compiler.env_numbers import env_number

START_SECONDS = 60.0  # the child's imports (transformers' template code) on a slow, loaded machine


def limits() -> tuple[float, int, int]:
    """(seconds per row, characters per row, bytes of memory) from the environment, checked (Q442 otherwise)."""
    return (env_number("QRC_TEMPLATE_SECONDS", 10.0, low=0.1, high=3600.0),
            int(env_number("QRC_TEMPLATE_CHARS", 4_000_000, low=1000, high=1 << 31, integer=True)),
            int(env_number("QRC_TEMPLATE_MEMORY", 1 << 30, low=64 << 20, high=1 << 40, integer=True)))


class TemplateRenderer:
    """Renders conversations through one tokenizer's chat template in a child process."""

    def __init__(self, tokenizer, location: Path, span, generation_prompt: bool = False):
        """`tokenizer`: a tokenizer or a processor (its chat template, and its tokenizer's special tokens);
        `location`: the folder the template came from; `generation_prompt`: end each text with the assistant's
        turn (a VLM's prompt rows)."""
        self.where = template_file(location)
        self.span = span
        self.seconds, self.max_chars, memory = limits()
        env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
        self.child = subprocess.Popen([sys.executable, "-m", "compiler.data.template_worker"],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                      text=True, encoding="utf-8", env=env)
        tokens = getattr(tokenizer, "tokenizer", tokenizer)  # a processor's own tokenizer
        special = {k: v for k, v in tokens.special_tokens_map.items() if isinstance(v, str)}
        self._send({"template": tokenizer.chat_template, "special": special, "max_chars": self.max_chars,
                    "memory": memory, "generation_prompt": generation_prompt})
        self._receive(START_SECONDS, None)

    def render(self, messages: list, row: int) -> str:
        """The text of one conversation (dataset row `row`)."""
        self._send(messages, row)
        answer = self._receive(self.seconds, row)
        if "error" in answer:
            line = f", line {answer['line']}" if answer.get("line") else ""
            raise self._failure(f"{answer['error']}: {answer['message']}", row, line)
        return answer["text"]

    def close(self) -> None:
        """End the child (it ends by itself when its input closes)."""
        if self.child.poll() is None:
            self.child.kill()
        self.child.wait()
        for stream in (self.child.stdin, self.child.stdout):
            if stream is not None:
                stream.close()

    def __enter__(self) -> TemplateRenderer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _send(self, value, row: int | None = None) -> None:
        try:
            assert self.child.stdin is not None
            self.child.stdin.write(json.dumps(value, ensure_ascii=False) + "\n")
            self.child.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._failure("the template's renderer ended", row, "") from None
        except (TypeError, ValueError) as exc:  # a row value JSON cannot carry (the reader gave it)
            raise self._failure(f"the row cannot be rendered ({exc})", row, "") from None

    def _receive(self, seconds: float, row: int | None) -> dict:
        assert self.child.stdout is not None
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.child.stdout], [], [], max(left, 0))
            if ready:
                line = self.child.stdout.readline()
                if not line:
                    self.close()
                    raise self._failure("the template's renderer ended (it ran out of memory or crashed)", row, "")
                return json.loads(line)
            if left <= 0:
                self.close()
                raise self._failure(f"rendering ran past its deadline of {seconds:g} s (QRC_TEMPLATE_SECONDS)",
                                    row, "")

    def _failure(self, what: str, row: int | None, line: str) -> StageError:
        self.close()
        at = f"row {row}" if row is not None else "its start"
        return StageError(error(
            "Q442", f"the chat template `{self.where}`{line} failed on {at}: {what}", self.span,
            "chat template failed", help="the template is code from the tokenizer's folder: fix or replace it "
            "(`chat_template.jinja`), or skip rows it refuses; nothing was written"))


def template_file(location: Path) -> Path:
    """The file a tokenizer's chat template comes from (for diagnostics)."""
    if location.is_dir():
        for name in ("chat_template.jinja", "chat_template.json", "tokenizer_config.json"):
            if (location / name).is_file():
                return location / name
    return location
