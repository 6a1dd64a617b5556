"""Verification of the emitted folder on the torch backend: the held-out samples run through the folder as
its users load it (artifact.py), block by block, and its outputs are compared with the float model's.

The float side is what qrc already computed: the float outputs kept before rounding (full), or the float
stream's hidden states after the last block, run through the float model's tail chunk by chunk
(block-wise). The emitted side reads one block of the folder at a time and drops it again, caching the
hidden states between blocks like every other stream (on disk in offload with `disk`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from pathlib import Path

import torch

from compiler.backends import BackendError
from compiler.backends.agreement import Agreement
from compiler.backends.release import release_memory
from compiler.backends.torch import streams
from compiler.backends.torch.artifact import ArtifactModel
from compiler.diagnostics import StageError, error
from compiler.source import Span


def run_emitted(span: Span | None, artifact: ArtifactModel, feeds: list[dict], reference: Iterable[torch.Tensor],
                agreement: Agreement, cache: Callable[[], streams.HiddenCache], devices: dict,
                watch: Callable[[str | None, ArtifactModel], AbstractContextManager], progress) -> None:
    """Every chunk of `feeds` through the emitted model; each chunk's output compared with the next float
    output of `reference` in `agreement`. `watch(scope, artifact)` is a context manager attributing each
    layer's own error while the layers of a scope run: a block's name, None (outside the blocks) or ""
    (the whole model). A folder that fails to run as transformers loads it is Q428 at `span` (its users would
    hit the same error)."""
    try:
        _run(artifact, feeds, reference, agreement, cache, devices, watch, progress)
    except (StageError, KeyboardInterrupt, MemoryError):
        raise
    except Exception as exc:  # the folder does not run as transformers loads it: say so, write nothing
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise BackendError(error("Q428", f"the emitted folder fails to run as transformers loads it "
                                 f"({type(exc).__name__}: {first})", span, "does not run",
                                 help="its users would hit the same error; nothing was written to the "
                                 "destination. If the recipe is valid, this is a qrc bug: please report it")) from None


def _run(artifact: ArtifactModel, feeds: list[dict], reference: Iterable[torch.Tensor], agreement: Agreement,
         cache: Callable[[], streams.HiddenCache], devices: dict,
         watch: Callable[[str | None, ArtifactModel], AbstractContextManager], progress) -> None:
    if not artifact.container:  # no repeated blocks: the model runs whole
        everything = artifact.owners("")
        artifact.load(everything)
        with watch("", artifact):
            for feed, ref in zip(feeds, reference, strict=True):
                agreement.update(ref.float().numpy(), artifact.forward(feed).float().numpy(), *streams.tokens_of(feed))
        artifact.release(everything)
        return
    stream = streams.Stream("verify (emitted folder)", feeds, cache())
    container = artifact.block_modules()
    outside = artifact.owners(None)
    with artifact.read_on_use(outside):
        streams.capture(container, stream, artifact.forward)
    advance = progress("verify the emitted folder", len(artifact.blocks))
    for number, name in enumerate(artifact.blocks):
        device = devices.get(name, "cpu")
        owners = artifact.owners(name)
        artifact.load(owners, device)
        out = cache()
        with watch(name, artifact), torch.no_grad():
            streams.run_block(container[number], number, stream, device, out)
        stream.hidden.close()
        stream.hidden = out
        artifact.release(owners)
        release_memory()
        advance()
    with artifact.read_on_use(outside), watch(None, artifact):
        for ref, out, feed in zip(reference, streams.replay_tail(container, stream, artifact.forward, lazy=True), feeds,
                                  strict=True):
            agreement.update(ref.float().numpy(), out.float().numpy(), *streams.tokens_of(feed))
            del ref, out  # one chunk of logits per side alive, as the plan counts
    stream.hidden.close()


def hidden_cache(dtype: torch.dtype, disk: Path | None) -> Callable[[], streams.HiddenCache]:
    """A factory of the emitted stream's caches (float32 in RAM, or files under `disk`)."""
    return lambda: streams.HiddenCache(dtype, disk)
