"""What a recipe gives each layer of a model: its scheme, the rule that chose it, its group instance."""

from __future__ import annotations

from dataclasses import dataclass, field

from compiler.ir.types import Rule, Scheme
from compiler.models.index import Layer, ModelIndex
from compiler.resolve.selectors import matcher


@dataclass(frozen=True, slots=True)
class LayerAssignment:
    """One layer's scheme, the rule that gave it, and its group."""
    layer: Layer
    scheme: Scheme
    rule: Rule | None  # the winning rule; None when no rule matched (the layer stays float)
    group: str | None = None  # the group instance, e.g. `model.layers.0.self_attn.{q,k,v}_proj`
    promoted_from: str | None = None  # the scheme the rule gave, when a group promoted it


@dataclass(frozen=True, slots=True)
class Assignment:
    """For every layer of the model, in model order: its scheme, the rule that chose it, its group."""

    model: ModelIndex
    layers: tuple[LayerAssignment, ...]
    smoothing: tuple = ()  # the outlier transform's SmoothingMapping's (compiler/resolve/smoothing.py)
    # each layer's assignment by name, made once: the planner asks for every layer, and a scan each time was
    # quadratic (Qwen3-235B's 36,473 layers: 33 s of a 35 s `qrc plan`)
    by_name: dict[str, LayerAssignment] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_name", {a.layer.name: a for a in self.layers})

    def of(self, name: str) -> LayerAssignment:
        """The assignment of the layer named `name`."""
        return self.by_name[name]


def rule_matches(rule: Rule, layers: tuple[Layer, ...]) -> list[list[Layer]]:
    """For each selector of the rule, the layers it matches."""
    return [[layer for layer in layers if matcher(sel)(layer)] for sel in rule.selectors]
