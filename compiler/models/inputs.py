"""What a model's inputs mean, read from their names, ranks and dtypes: token ids, masks, positions,
token types, a key/value cache (`past_key_values.N.key`, …) or anything else. Exporters name inputs
this way (optimum, torch.onnx's dynamo exporter, onnxruntime-genai's model builder, transformers), so the
meaning of each axis follows, and with it the size of every symbolic dimension for a chunk of `batch`
samples of `sequence` new tokens after a cache of `past` tokens. Synthetic data and the memory plan both
bind dimensions here, so what the plan counts is what the run feeds."""

from __future__ import annotations

from dataclasses import dataclass

from compiler.models.axes import Axis, InputRole, axes_of, role_of
from compiler.models.index import ModelIndex, TensorInfo

__all__ = ["Axis", "Binding", "InputRole", "axes_of", "has_cache", "role_of", "shape_at", "unbindable"]


@dataclass(frozen=True)
class Binding:
    """Sizes for one forward pass: `batch` samples of `sequence` new tokens after `past` cached ones."""

    batch: int
    sequence: int
    past: int = 0

    def size(self, axis: Axis, index: ModelIndex) -> int | None:
        """The size of an axis meaning `axis`, or None when the model does not tell it."""
        sizes = {Axis.BATCH: self.batch, Axis.SEQUENCE: self.sequence, Axis.PAST: self.past,
                 Axis.TOTAL: self.past + self.sequence, Axis.FIXED: None,
                 Axis.HEADS: _positive(index.config_value("num_key_value_heads",
                                                          index.config_value("num_attention_heads"))),
                 Axis.HEAD_DIM: _head_dim(index)}
        return sizes[axis]


def _positive(value) -> int | None:
    return value if isinstance(value, int) and value > 0 else None


def _head_dim(index: ModelIndex) -> int | None:
    explicit = _positive(index.config_value("head_dim"))
    hidden, heads = _positive(index.config_value("hidden_size")), _positive(index.config_value("num_attention_heads"))
    return explicit or (hidden // heads if hidden and heads and hidden % heads == 0 else None)


def shape_at(index: ModelIndex, info: TensorInfo, binding: Binding) -> tuple[int, ...] | str:
    """The concrete shape of input `info` at `binding`, or why qrc cannot tell it (a sentence)."""
    dims = []
    for axis, (dim, meaning) in enumerate(zip(info.shape, axes_of(info), strict=True)):
        if isinstance(dim, int) and dim > 0 and meaning is not Axis.BATCH:
            dims.append(dim)
            continue
        size = binding.size(meaning, index)
        if size is None:
            return (f"axis {axis} of `{info.name}` (`{dim}`, the {meaning.value}) is symbolic and the model's "
                    "config does not give it")
        dims.append(size)
    return tuple(dims)


def unbindable(index: ModelIndex) -> list[str]:
    """Why some input's shape cannot be known (one sentence per such input)."""
    probe = Binding(1, 1)
    return [found for info in index.inputs if isinstance(found := shape_at(index, info, probe), str)]


def has_cache(index: ModelIndex) -> bool:
    """Whether the model takes a key/value cache (a decoder exported `with past`)."""
    return any(role_of(info) is InputRole.PAST for info in index.inputs)
