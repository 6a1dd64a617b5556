"""Block-wise execution: a stream is a set of samples whose hidden states between blocks are cached per
chunk (in RAM, or on disk), with the per-sample-constant inputs of the blocks (position embeddings,
masks, ids) stored once when every chunk has the same ones."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from compiler.backends.release import trim_heap
from compiler.backends.torch.model import StandInSignal


def cache_write_error(exc: Exception, path: Path) -> OSError:
    """A failed write of a cache file as an OSError naming the cache (not the output), so the compile reports
    it as Q417 with the folder that filled up."""
    number = exc.errno if isinstance(exc, OSError) and exc.errno else errno.ENOSPC
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"the disk cache is full ({exc})"
    return OSError(number, reason, str(path))


class HiddenCache:
    """Hidden states per chunk, in the checkpoint's dtype; on disk (one safetensors file per chunk, in a fresh
    folder of its own: nothing already there is read, and nothing read can run code) when `folder`."""

    def __init__(self, dtype: torch.dtype, folder: Path | None = None):
        self.dtype = dtype
        self._ram: dict[int, torch.Tensor] = {}
        self._dir = Path(tempfile.mkdtemp(prefix="qrc-hidden-", dir=folder)) if folder is not None else None

    @classmethod
    def existing(cls, dtype: torch.dtype, folder: Path) -> HiddenCache:
        """The chunks an earlier run left in `folder` (what a resumed run's state points at: torch/resume.py)."""
        cache = cls(dtype)
        cache._dir = folder
        return cache

    @property
    def folder(self) -> Path | None:
        """Where the chunks are on disk (None: in RAM)."""
        return self._dir

    def put(self, chunk: int, hidden: torch.Tensor) -> None:
        """Keep one chunk's hidden states."""
        value = hidden.detach().to("cpu", self.dtype)
        if self._dir is None:
            self._ram[chunk] = value
            return
        path = self._dir / f"{chunk}.safetensors"
        fd, temp = tempfile.mkstemp(dir=self._dir, prefix=f".{chunk}.", suffix=".qrc-tmp")  # never a planted name
        os.close(fd)
        try:
            save_file({"hidden": value.contiguous()}, temp)  # data only
            os.replace(temp, path)
        except Exception as exc:  # safetensors raises its own error type for a full disk
            Path(temp).unlink(missing_ok=True)  # no partial file left behind
            raise cache_write_error(exc, path) from None

    def get(self, chunk: int) -> torch.Tensor:
        """One chunk's hidden states."""
        if self._dir is None:
            return self._ram[chunk]
        return load_file(str(self._dir / f"{chunk}.safetensors"))["hidden"]

    def close(self) -> None:
        """Remove the chunks (and their files)."""
        self._ram.clear()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)


class _Reached(StandInSignal):
    def __init__(self):
        super().__init__("last block reached")


def _take_attributes(stand_in: nn.Module, block: nn.Module) -> None:
    """What some models' loops read off a block (its attention type, index, causality), on its stand-in."""
    for attribute in ("attention_type", "layer_idx", "is_causal"):
        if hasattr(block, attribute):
            setattr(stand_in, attribute, getattr(block, attribute))


class _Recorder(nn.Module):
    """Stands in for one block while the model's inputs are captured: keeps the block's inputs and hands its
    hidden states on unchanged (the last one stops the forward). The inputs besides the hidden states do not
    depend on earlier blocks, but may differ per block: position embeddings and masks of its attention type
    (sliding or full), a per-layer input (Gemma 4)."""

    def __init__(self, like: nn.Module, last: bool):
        super().__init__()
        self.last, self.seen = last, None
        _take_attributes(self, like)

    def forward(self, *args, **kwargs):
        self.seen = (args, kwargs)
        if self.last:
            raise _Reached()
        return args[0] if args else kwargs["hidden_states"]


@dataclass
class Stream:
    """Samples in chunks: their model inputs, the hidden states at the current block, the other inputs."""

    name: str
    feeds: list[dict]
    hidden: HiddenCache
    # per chunk, per block: the blocks' other inputs; identical ones (across blocks, or as in the first chunk)
    # are one object
    rest: list[list[tuple[tuple, dict]]] = field(default_factory=list)
    arity: int | None = None  # what the blocks return: 0 for a tensor, else the length of their tuple

    def __len__(self) -> int:
        return len(self.feeds)


def capture(container: nn.ModuleList, stream: Stream, call, before=None) -> None:
    """Run the model on each chunk through stand-ins of the blocks: keep the first block's hidden states and
    every block's other inputs, and stop the forward at the last block (where the model's loop cannot pass
    a block's input through, the blocks after the first take the first one's)."""
    original = dict(container._modules)
    names = list(original)
    try:
        for i, feed in enumerate(stream.feeds):
            if before:
                before()
            recorders = [_Recorder(block, k == len(names) - 1) for k, block in enumerate(original.values())]
            container._modules.clear()
            container._modules.update(zip(names, recorders, strict=True))
            try:
                call(feed)
            except _Reached:
                pass
            except Exception:
                # a loop that takes apart what its blocks return (a tuple) cannot run on pass-through stand-ins:
                # from the first block on, every block gets the first one's inputs (they are the same there)
                if recorders[0].seen is None:
                    raise
            else:
                raise RuntimeError("the forward pass never reached the last block")
            finally:
                container._modules.clear()
                container._modules.update(original)
            seen_first = recorders[0].seen
            assert seen_first is not None  # the forward reached the first block (or raised above)
            hidden, first = _split(*seen_first)
            stream.hidden.put(i, hidden)
            seen = [_split(*r.seen)[1] if r.seen is not None else first for r in recorders]
            stream.rest.append(_dedupe(seen, stream.rest[:1]))
    finally:
        container._modules.clear()
        container._modules.update(original)


def _split(args: tuple, kwargs: dict) -> tuple[torch.Tensor, tuple[tuple, dict]]:
    if args:
        return args[0], (tuple(args[1:]), dict(kwargs))
    kwargs = dict(kwargs)
    return kwargs.pop("hidden_states"), ((), kwargs)


def _dedupe(blocks: list[tuple[tuple, dict]], earlier: list) -> list[tuple[tuple, dict]]:
    """One chunk's per-block inputs, each stored once: the previous block's or the first chunk's object when
    equal (the whole first chunk's list when every block's is)."""
    first = earlier[0] if earlier else None
    out: list[tuple[tuple, dict]] = []
    for k, rest in enumerate(blocks):
        if out and _same(rest, out[-1]):
            rest = out[-1]
        elif first is not None and _same(rest, first[k]):
            rest = first[k]
        out.append(rest)
    return first if first is not None and all(a is b for a, b in zip(out, first, strict=True)) else out


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                and a.dtype == b.dtype and bool(torch.equal(a, b)))
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a is b or (type(a) is type(b) and isinstance(a, (int, float, str, bool, type(None))) and a == b)


def tensors_mapped(value, change):
    """`value` (a block's other inputs: nested tuples, lists, dicts) with `change` applied to each tensor in it."""
    if isinstance(value, torch.Tensor):
        return change(value)
    if isinstance(value, tuple):
        return tuple(tensors_mapped(v, change) for v in value)
    if isinstance(value, list):
        return [tensors_mapped(v, change) for v in value]
    if isinstance(value, dict):
        return {k: tensors_mapped(v, change) for k, v in value.items()}
    return value


def on_device(value, device):
    """Tensors in `value` (nested tuples, lists, dicts) moved to `device`."""
    return tensors_mapped(value, lambda tensor: tensor.to(device))


def in_dtype(value, device, dtype: torch.dtype):
    """A block's other inputs moved to `device`, their floating tensors in `dtype`, the dtype its weights and
    hidden states compute in there. The inputs were captured in float32 (the model's head runs on the CPU) and
    a bfloat16 block on a GPU would otherwise take float32 rotary cos/sin: they turn its queries and keys
    float32 beside bfloat16 values, which attention refuses. transformers gives a model of that dtype its
    position embeddings and masks in it; a mask's float32 minimum is clamped to the dtype's finite range
    (cast alone it would be -inf)."""
    def moved(tensor: torch.Tensor) -> torch.Tensor:
        if not tensor.is_floating_point() or tensor.dtype == dtype:
            return tensor.to(device)
        limits = torch.finfo(dtype)
        return tensor.to(device).clamp(limits.min, limits.max).to(dtype)

    return tensors_mapped(value, moved)


def run_block(block: nn.Module, number: int, stream: Stream, device, out: HiddenCache | None, before=None,
              keep: list[torch.Tensor] | None = None) -> None:
    """Block `number` on every chunk of the stream; its hidden outputs go to `out` (None: statistics only). The
    heap is trimmed after each chunk: glibc keeps the chunk's freed activations (below its risen mmap threshold)
    and the next chunk's do not fit the same holes, so without it a pass held up to twice the working set the plan
    counts (SmolLM2-135M, 16 samples of 512 tokens a chunk: 1.77 GiB against 1.40 planned)."""
    for i in range(len(stream)):
        if before:
            before()
        result = run_chunk(block, number, stream, device, i)
        if out is not None:
            out.put(i, result)
        if keep is not None:  # each chunk's output as float32, where it stays (learned rounding's targets)
            keep.append(result.detach().float())
        del result
        trim_heap()


def run_chunk(block: nn.Module, number: int, stream: Stream, device, i: int) -> torch.Tensor:
    """Block `number` on chunk `i` of the stream: its hidden output."""
    dtype = torch.float32 if str(device) == "cpu" else stream.hidden.dtype
    args, kwargs = in_dtype(stream.rest[i][number], device, dtype)
    hidden = stream.hidden.get(i).to(device, dtype)
    result = block(hidden, *args, **kwargs)
    if stream.arity is None:
        stream.arity = len(result) if isinstance(result, (tuple, list)) else 0
    return result[0] if stream.arity else result


class _Replay(nn.Module):
    """Stands in for all the blocks: returns the cached output of the last block for the current chunk,
    so the model's own forward runs what comes after the blocks (final norm, heads)."""

    def __init__(self, hidden: torch.Tensor, arity: int, like: nn.Module):
        super().__init__()
        self.hidden, self.arity = hidden, arity
        _take_attributes(self, like)

    def forward(self, *args, **kwargs):
        return (self.hidden,) + (None,) * (self.arity - 1) if self.arity else self.hidden


def replay_tail(container: nn.ModuleList, stream: Stream, call, before=None, lazy: bool = False):
    """The model's outputs on each chunk, the blocks replaced by the stream's cached hidden states: a list,
    or (`lazy`) one chunk's outputs at a time, so only one chunk of logits is alive."""
    outputs = _replayed(container, stream, call, before)
    return outputs if lazy else list(outputs)


def first_tail_output(container: nn.ModuleList, stream: Stream, call) -> torch.Tensor:
    """The model's output on the stream's first chunk, the blocks replaced by its cached hidden states."""
    outputs = _replayed(container, stream, call, None)
    try:
        return next(outputs)
    finally:
        outputs.close()  # puts the blocks back


def _replayed(container: nn.ModuleList, stream: Stream, call, before):
    original = dict(container._modules)
    last = list(original.values())[-1]
    try:
        for i, feed in enumerate(stream.feeds):
            if before:
                before()
            replay = _Replay(stream.hidden.get(i).float(), stream.arity or 0, last)
            container._modules.clear()
            container._modules["0"] = replay
            out = call(feed)
            container._modules.clear()  # the caller may run other streams through the blocks between chunks
            container._modules.update(original)
            yield out
            del out, replay  # the caller has this chunk's output: not kept while the next one is computed
    finally:
        container._modules.clear()
        container._modules.update(original)


def torch_feed(feed: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """A feed of numpy arrays as torch tensors (sharing their memory)."""
    return {name: torch.from_numpy(np.ascontiguousarray(value)) for name, value in feed.items()}


def first_row(feed: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The feed's first sample where every input is batched by sample (else the whole feed: a vision model's
    patches, say, are not): what a transform's fold check runs, its outputs a chunk's 1/rows (a language
    model's logits over a chunk of long samples are gigabytes)."""
    rows = {value.shape[0] if value.ndim else -1 for value in feed.values()}
    if len(rows) != 1 or "input_ids" not in feed:
        return feed
    return {name: value[:1] for name, value in feed.items()}


def mask_of(feed: dict[str, torch.Tensor]):
    """The feed's attention mask as numpy (None without one): what verification compares under."""
    mask = feed.get("attention_mask")
    return None if mask is None else mask.numpy()


def tokens_of(feed: dict[str, torch.Tensor]) -> tuple:
    """The feed's attention mask and token ids as numpy (each None without one): what verification compares
    under, and what each model's next-token loss (perplexity) is taken on."""
    ids = feed.get("input_ids")
    return mask_of(feed), None if ids is None else ids.numpy()
