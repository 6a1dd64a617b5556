"""The child process that renders a tokenizer's chat template for compiler/data/templates.py.

A chat template is code from a download: transformers renders it in Jinja's immutable sandbox, which stops
attribute escapes but neither a loop that never ends nor one expression that allocates gigabytes
(`'A' * 10**10`). Here it runs in a process of its own whose address space is capped (RLIMIT_AS, above what the
imports took) and which the parent ends at its deadline, so neither can hang or exhaust the compile.

Protocol, one JSON document a line: the parent sends {"template", "special", "max_chars"} once, then one
conversation (a list of messages) a line; each answer is {"text": ...} or {"error": kind, "message": ...,
"line": template line or null}."""

from __future__ import annotations

import json
import resource
import sys
from typing import Any


def _address_space() -> int:
    """This process's virtual size now, in bytes (0 where /proc does not say)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _cap_memory(extra: int) -> None:
    """Allow `extra` bytes of address space beyond what the process holds now."""
    current = _address_space()
    if current:
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        wanted = current + extra
        resource.setrlimit(resource.RLIMIT_AS, (wanted if hard == resource.RLIM_INFINITY else min(wanted, hard), hard))


def _template_line(exc: BaseException) -> int | None:
    """The template line Jinja's rewritten traceback points at (its frames are named `<template>`)."""
    line = getattr(exc, "lineno", None)
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _answer(render, messages, max_chars: int) -> dict:
    import jinja2

    try:
        text = render(messages)
    except jinja2.TemplateSyntaxError as exc:
        return {"error": "syntax error", "message": exc.message or str(exc), "line": exc.lineno}
    except jinja2.exceptions.SecurityError as exc:
        return {"error": "refused by the sandbox", "message": str(exc), "line": _template_line(exc)}
    except jinja2.TemplateError as exc:  # raise_exception(), an undefined name, a refused include
        return {"error": type(exc).__name__, "message": str(exc), "line": _template_line(exc)}
    except MemoryError:
        return {"error": "memory", "message": "the template needed more memory than its cap", "line": None}
    except RecursionError as exc:
        return {"error": "recursion", "message": str(exc), "line": _template_line(exc)}
    except Exception as exc:  # noqa: BLE001 - whatever else a template's code raises is this row's failure
        return {"error": type(exc).__name__, "message": str(exc)[:500], "line": _template_line(exc)}
    if len(text) > max_chars:
        return {"error": "size", "message": f"the rendered text has {len(text):,} characters, above the cap of "
                f"{max_chars:,}", "line": None}
    return {"text": text}


def main() -> None:
    """Answer the parent until its input ends."""
    setup = json.loads(sys.stdin.readline())
    from transformers.utils.chat_template_utils import render_jinja_template

    template, special, max_chars = setup["template"], setup["special"], int(setup["max_chars"])
    prompt = bool(setup.get("generation_prompt"))

    def render(messages) -> str:
        # (texts, generation indices), whatever its annotation says
        rendered: Any = render_jinja_template([messages], chat_template=template, add_generation_prompt=prompt,
                                              **special)
        return rendered[0][0]

    _cap_memory(int(setup["memory"]))
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        print(json.dumps(_answer(render, json.loads(line), max_chars)), flush=True)


if __name__ == "__main__":
    main()
