"""Index a PyTorch module (meta-device modules work: only shapes and dtypes are read)."""

from __future__ import annotations

import math

from compiler.models import names
from compiler.models.index import Layer, LayerKind, ModelFormat, ModelIndex, Norm, norm_module


def index_torch_module(module, ref: str, family: str = "torch") -> ModelIndex:
    """Index a PyTorch module in memory."""
    import torch

    layers = []
    for name, mod in module.named_modules():
        weight = getattr(mod, "weight", None)
        if not isinstance(weight, torch.Tensor):
            continue
        dtype = str(weight.dtype).removeprefix("torch.")
        if isinstance(mod, torch.nn.Linear):
            kind, in_f, out_f = LayerKind.LINEAR, mod.in_features, mod.out_features
        elif isinstance(mod, torch.nn.Embedding):
            kind, in_f, out_f = LayerKind.EMBEDDING, mod.num_embeddings, mod.embedding_dim
        elif isinstance(mod, torch.nn.modules.conv._ConvNd):
            kind, in_f, out_f = LayerKind.CONV, math.prod(weight.shape[1:]), mod.out_channels
        else:
            continue
        layers.append(Layer(name, kind, type(mod).__name__, f"{name}.weight", f"{name}:input", tuple(weight.shape),
                            dtype, in_f, out_f, names.block_of(name)))
    unique = {id(p): p for p in module.parameters()}.values()
    total = sum(p.numel() * p.element_size() for p in unique)
    norms = []
    for name, param in module.named_parameters():
        owner = norm_module(name)
        if owner is not None and param.dim() == 1:
            bias = f"{owner}.bias" if isinstance(getattr(module.get_submodule(owner), "bias", None), torch.Tensor) else None
            norms.append(Norm(owner, name, bias, param.shape[0], names.block_of(owner)))
    return ModelIndex(ref, ModelFormat.TORCH, family, tuple(layers), (), (), total, norms=tuple(norms))
