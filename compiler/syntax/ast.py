"""AST of a recipe: frozen nodes, each with the span of the text it came from.

Simple `key value` settings share one node type (Setting); the blocks that hold them differ only
in which keys they accept, which elaboration checks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Union

from compiler.source import Span


@dataclass(frozen=True, slots=True)
class Name:
    """An identifier."""
    value: str
    span: Span


@dataclass(frozen=True, slots=True)
class String:
    """A string literal (its value unquoted)."""
    value: str  # escapes decoded
    span: Span


@dataclass(frozen=True, slots=True)
class Number:
    """A number literal."""
    text: str
    value: float
    span: Span

    @property
    def is_integer(self) -> bool:
        """Written without a fraction or exponent."""
        return math.isfinite(self.value) and self.value == int(self.value) and not any(c in self.text for c in ".eE")


@dataclass(frozen=True, slots=True)
class Keyword:
    """A keyword used as a value (`int4`, `auto`, `cosine`); `kind` is the grammar rule it came from."""

    kind: str
    value: str
    span: Span


@dataclass(frozen=True, slots=True)
class Size:
    """A size with a unit (`4 GiB`)."""
    number: Number
    unit: Name
    span: Span


@dataclass(frozen=True, slots=True)
class DeviceSize:
    """`vram 2 x 80 GiB`: a device count and the size of each device."""

    count: Number
    size: Size
    span: Span


Value = Union[Name, String, Number, Keyword, Size, DeviceSize, tuple]


@dataclass(frozen=True, slots=True)
class Setting:
    """`key value`, e.g. `chunk 16`, `ram 4 GiB`, `choices [w4, w8a8]`."""

    key: str
    key_span: Span
    value: Value
    span: Span


@dataclass(frozen=True, slots=True)
class QSpecItem:
    """One item of a weights/activations spec: field is dtype|granularity|group|block|symmetry|mode."""

    field: str
    value: Keyword | Number
    span: Span


@dataclass(frozen=True, slots=True)
class QuantSpec:
    """`weights …` or `activations …` (`none` → items empty and is_none)."""

    role: str  # "weights" | "activations"
    items: tuple[QSpecItem, ...]
    is_none: bool
    span: Span


@dataclass(frozen=True, slots=True)
class SchemeDecl:
    """`scheme NAME = BASE { … }`."""
    name: Name
    base: Name | None
    bare_items: tuple[QSpecItem, ...]  # `{ group 64 }`: refine the weights
    specs: tuple[QuantSpec, ...]
    rounding: tuple[Keyword, ...]
    span: Span
    rounding_options: RoundingOptions | None = None  # `rounding autoround { iters 200 }`


@dataclass(frozen=True, slots=True)
class RoundingOptions:
    """`{ key value … }` after `rounding NAME`: the settings the named rounding reads (compiler/ir/kinds.py)."""
    settings: tuple[Setting, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class Selector:
    """One selector of a rule: glob, regex or type."""
    kind: str  # "glob" | "regex" | "type"
    pattern: str
    span: Span


@dataclass(frozen=True, slots=True)
class QuantizeRule:
    """`SELECTOR… -> SCHEME`."""
    selectors: tuple[Selector, ...]
    scheme: Name
    span: Span


@dataclass(frozen=True, slots=True)
class QuantizeBlock:
    """The `quantize { … }` block."""
    rules: tuple[QuantizeRule, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class GroupDecl:
    """`group PATTERN [policy P]` or `group auto [qkv|gate_up]`."""
    pattern: String | None  # None: `group auto …`
    policy: Keyword | None
    span: Span
    auto: str | None = None  # `qkv`, `gate_up` or `all` (plain `group auto`) when pattern is None


@dataclass(frozen=True, slots=True)
class DataDecl:
    """`data KIND [PATH] { … }`."""
    kind: str  # "synthetic" | "npz" | "text" | "dataset"
    path: String | None
    options: tuple[Setting, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class MethodDecl:
    """`method NAME [NUMBER] { key value … }`: what the named method reads is its own (compiler/ir/methods.py)."""
    kind: Keyword
    argument: Number | None
    options: tuple[Setting, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class Block:
    """`calibrate { … }`, `memory { … }`, `verify { … }`, `mixed_precision { … }`."""

    kind: str
    items: tuple[Setting | DataDecl | MethodDecl, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class EmitDecl:
    """`emit PATH { … }`."""
    path: String
    options: tuple[Setting, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class ModelDecl:
    """`model REF`."""
    ref: String
    span: Span


@dataclass(frozen=True, slots=True)
class BackendDecl:
    """`backend NAME`."""
    kind: Keyword
    span: Span


@dataclass(frozen=True, slots=True)
class KvCacheDecl:
    """`kv_cache { ITEMS }`: how the attention key/value cache is quantized."""
    items: tuple[QSpecItem, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class MapDecl:
    """`map SOURCE -> TARGET, …`: which module's output a transform scales, and the layers that read it."""
    source: Selector
    targets: tuple[Selector, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class TransformDecl:
    """`transform KIND { settings and maps }`: an outlier transform (awq, smoothquant)."""
    kind: Keyword
    settings: tuple[Setting, ...]
    maps: tuple[MapDecl, ...]
    span: Span


RecipeItem = Union[ModelDecl, BackendDecl, SchemeDecl, QuantizeBlock, GroupDecl, Block, EmitDecl, KvCacheDecl,
                   TransformDecl]


@dataclass(frozen=True, slots=True)
class Recipe:
    """A whole recipe as parsed."""
    name: Name
    items: tuple[RecipeItem, ...]
    span: Span
