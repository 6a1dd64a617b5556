"""Selectors as predicates over layers."""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache

from compiler.ir.patterns import glob_to_regex
from compiler.ir.types import Selector, SelectorKind
from compiler.models.index import Layer


@lru_cache(maxsize=1024)
def _compiled(kind: SelectorKind, pattern: str) -> re.Pattern:
    return re.compile(glob_to_regex(pattern) if kind is SelectorKind.GLOB else pattern)


def matcher(selector: Selector) -> Callable[[Layer], bool]:
    """`type X` matches a layer's kind (Linear, Conv, Embedding) or its op (MatMul, Gemm, Gather, …), except
    `named_only` layers (a VLM's vision tower and projector, a tied LM head): those are selected by name, so
    `type Linear` means the language model's own Linears, as llm-compressor's VLM recipes ignore the tower."""
    if selector.kind is SelectorKind.TYPE:
        return lambda layer: not layer.named_only and selector.pattern in (layer.kind.value, layer.op)
    by_name = name_matcher(selector)
    return lambda layer: by_name(layer.name)


def name_matcher(selector: Selector) -> Callable[[str], bool]:
    """A glob or regex selector as a predicate over module names (layers, and norms a transform maps from)."""
    regex = _compiled(selector.kind, selector.pattern)
    return lambda name: regex.fullmatch(name) is not None
