"""`kv_cache { fp8 }`: the keys and values a transformers attention module stores in its cache, observed
during calibration and rounded through FP8 from then on, as the runtime does. Like compressed-tensors'
QuantizedKVCache, a forward pre-hook hands each attention module a stand-in for its `past_key_values`
whose `update(key, value, …)` sees the keys after RoPE, exactly what the cache holds; the real cache (if
any) still gets the values. Scales are static per tensor: absmax / 448 over every calibration token, held in
the model's dtype as `k_scale`/`v_scale` on the attention module (compressed-tensors' names, which vLLM
maps to its attention layers)."""

from __future__ import annotations

import enum
import inspect
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from compiler.backends import BackendError
from compiler.backends.emitter import Spec
from compiler.backends.torch.compressed import TensorSpec
from compiler.backends.torch.float_formats import fake_fp8, fp8_input_scale
from compiler.diagnostics import error
from compiler.ir.types import KvCache

# the attention forward's cache argument, newest name first (transformers 5.24 renamed `past_key_values` to
# `cache`; releases before 4.56 called it `past_key_value`)
_CACHE_ARGUMENTS = ("cache", "past_key_values", "past_key_value")


class KvMode(enum.Enum):
    """What the stand-in cache does with the keys and values it sees."""
    PASS = "pass"  # float runs (the reference stream)
    OBSERVE = "observe"  # calibration: record each module's absolute maxima
    QUANTIZE = "quantize"  # runs of the quantized model: round through FP8 where a module has its scales


@dataclass
class _Module:
    k_absmax: float = 0.0
    v_absmax: float = 0.0
    scales: tuple[float, float] | None = None


class KvCacheQuantizer:
    """Hooks on every attention module of `modules` (none without `kv_cache`: then every method does
    nothing); `mode` says what they do; `write_scales` turns what was observed into the stored
    `k_scale`/`v_scale`."""

    def __init__(self, root: nn.Module, modules: list[str], kv: KvCache | None, scale_dtype: torch.dtype):
        self.kv, self.scale_dtype = kv, scale_dtype
        self.mode = KvMode.QUANTIZE
        self.state = {name: _Module() for name in modules}
        self._handles = [self._install(root.get_submodule(name), name) for name in modules]

    def _install(self, module: nn.Module, name: str):
        parameters = inspect.signature(module.forward).parameters
        argument = next((a for a in _CACHE_ARGUMENTS if a in parameters), None)
        if argument is None:
            raise BackendError(error(
                "Q411", f"`{name}` ({type(module).__name__}) takes no KV cache argument, so its keys and values "
                "cannot be observed", self.kv.span if self.kv else None, "no KV cache here",
                help="remove `kv_cache`; it needs a transformers decoder (an HF folder)"))

        def hook(_, args, kwargs):
            # the caller may still pass an older name, which transformers' deprecation shim renames
            given = next((a for a in _CACHE_ARGUMENTS if a in kwargs), argument)
            kwargs[given] = _StandIn(self, name, kwargs.get(given))
            return args, kwargs
        return module.register_forward_pre_hook(hook, with_kwargs=True)

    def close(self) -> None:
        """Remove the hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    @contextmanager
    def running(self, mode: KvMode):
        """Run with `mode`, then back to the previous one."""
        previous, self.mode = self.mode, mode
        try:
            yield
        finally:
            self.mode = previous

    def process(self, name: str, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What the cache of module `name` receives, per the mode."""
        state = self.state[name]
        if self.mode is KvMode.OBSERVE:
            state.k_absmax = max(state.k_absmax, _finite_absmax(key))
            state.v_absmax = max(state.v_absmax, _finite_absmax(value))
        elif self.mode is KvMode.QUANTIZE and state.scales is not None:
            k_scale, v_scale = state.scales
            return fake_fp8(key, torch.tensor(k_scale)), fake_fp8(value, torch.tensor(v_scale))
        return key, value

    def write_scales(self, prefix: str, writer) -> None:
        """Scales for the modules under `prefix` not done yet, from what calibration observed, put to
        `writer` (`NAME.k_scale`, `NAME.v_scale`); from now on their caches are rounded."""
        for name, state in self.state.items():
            if state.scales is not None or not name.startswith(prefix):
                continue
            state.scales = (fp8_input_scale(-state.k_absmax, state.k_absmax, self.scale_dtype),
                            fp8_input_scale(-state.v_absmax, state.v_absmax, self.scale_dtype))
            for leaf, scale in zip(("k_scale", "v_scale"), state.scales, strict=True):
                writer.put(f"{name}.{leaf}", torch.tensor([scale], dtype=self.scale_dtype))


def kv_specs(modules: list[str], scale_dtype: torch.dtype) -> list[TensorSpec]:
    """The output tensors of the KV cache scales, known before any is computed."""
    return [Spec(f"{name}.{leaf}", scale_dtype, (1,)) for name in modules for leaf in ("k_scale", "v_scale")]


def _finite_absmax(x: torch.Tensor) -> float:
    values = x.detach().float().abs()
    values = values[torch.isfinite(values)]
    return float(values.max()) if values.numel() else 0.0


class _StandIn:
    """Stands for the attention module's cache: `update` quantizes (or observes), then hands the keys and
    values to the real cache when there is one; anything else is the real cache's."""

    def __init__(self, owner: KvCacheQuantizer, name: str, inner):
        self._owner, self._name, self._inner = owner, name, inner

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """The cache's update: the keys and values as the runtime stores them."""
        key_states, value_states = self._owner.process(self._name, key_states, value_states)
        if self._inner is not None:
            return self._inner.update(key_states, value_states, *args, **kwargs)
        return key_states, value_states

    def __getattr__(self, name: str):
        inner = self.__dict__.get("_inner")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)
