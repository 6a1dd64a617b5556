"""Give freed memory back to the operating system between phases, so that the RSS of the next phase is
that phase's own (glibc otherwise keeps freed heap pages, and the peak of one phase carries over)."""

from __future__ import annotations

import contextlib
import ctypes
import gc
from collections.abc import Iterator


def release_memory() -> None:
    """Collect garbage and give freed heap pages back to the OS (glibc's malloc_trim)."""
    gc.collect()
    trim_heap()


_REUSING = [False]  # inside heap_reused(): freed pages stay for the next allocations, untrimmed


def trim_heap() -> None:
    """Give freed heap pages back to the OS, in every arena: the rounding threads' arenas keep what their
    temporaries freed, which glibc never returns on its own (measured: 150 MiB over rounding the 112 layers
    of a 4-block MoE in place, all of it returned by a trim). Inside heap_reused() it waits for its end."""
    if _REUSING[0]:
        return
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


def freeze_long_lived() -> None:
    """Exempt every object alive now from later garbage collections (gc.freeze): called once the model is open,
    when what exists are the imported modules (transformers and torch: about 400,000 objects) and the
    skeleton, which live as long as the run. Each release_memory then scans only what the run made since:
    0.25 s a collection before, about nothing after (an 8-block compile collects ten times). Reference
    counting still frees frozen objects; only cycles among them wait for `thaw`."""
    gc.collect()
    gc.freeze()


@contextlib.contextmanager
def collections_paused() -> Iterator[None]:
    """Run a block of imports without cyclic garbage collections, then exempt everything alive from later ones
    (gc.freeze). Importing transformers and compressed-tensors makes about 400,000 long-lived objects, and the
    collections their allocations trigger rescan all of them: on a data-free compile of a 5.9 GiB checkpoint,
    whose imports run beside the rounding, 7% of the CPU samples were the collector (wall 0.5-1.6 s less
    with it paused). Nothing those imports make is garbage worth a scan."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def thaw() -> None:
    """Undo freeze_long_lived at the end of a run (a process compiling again collects the last run's cycles)."""
    gc.unfreeze()


M_MMAP_THRESHOLD = -3  # mallopt's parameter number (glibc malloc.h)
MMAP_THRESHOLD = 4 << 20
# onnxruntime's sessions without their arena allocate each activation with malloc: a chunk of a small model's
# activations (under 4 MiB each) then came from the heap, whose holes the next run did not fit; the README's first
# command (a 128-hidden Llama on ONNX, 16 samples a chunk) measured 141-154 MiB against 129 planned, 131-132 with
# the threshold at 512 KiB, in the same time (1.9-2.0 s)
SESSION_MMAP_THRESHOLD = 512 << 10


def keep_large_blocks_mapped(threshold: int = MMAP_THRESHOLD) -> None:
    """Fix glibc's mmap threshold (4 MiB unless `threshold` says; SESSION_MMAP_THRESHOLD for onnxruntime's
    sessions). By default it rises to the size of every large block freed (up
    to 32 MiB), after which tensors of a few MiB come from the heap; block after block their freed holes
    fragment it beyond what malloc_trim returns. Measured on a 32-block, hidden-2048 GPTQ offload compile:
    the RSS drifted from 1.47 to 2.01 GiB over the blocks; with the threshold fixed it stayed at 1.18-1.21
    GiB, at 13% more wall time (1,104 s against 976: each mapping is faulted in afresh). Fixed, each large
    tensor has its own mapping, returned to the OS when freed. Every torch compile that runs the model fixes
    it: in whole-model passes the heap grew far past what the plan counts (the real SmolLM2-135M calibrated on
    32 × 512 tokens of text, full: GPTQ 2.17-2.65 GiB measured against 1.61 planned, fixed 1.57; imatrix
    2.50 against 1.25, fixed 1.35; SmoothQuant 1.60 against 1.39, fixed 1.31), for 0-22% more time (GPTQ 59 s
    against 56-60, imatrix 54 against 52, SmoothQuant 38 against 31; low_memory +13%). The ONNX backend's
    arena-free sessions (calibration, verification) fix it too: each activation is then freed back to the
    OS as the plan's liveness walk assumes. The setting lasts for the process."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, threshold)
    except (OSError, AttributeError):  # not glibc
        pass


M_TRIM_THRESHOLD = -1  # mallopt's parameter number (glibc malloc.h)
HEAP_THRESHOLD_MAX = 32 << 20  # the largest mmap threshold glibc takes on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)
TRIM_THRESHOLD = 128 << 10  # glibc's default trim threshold


@contextlib.contextmanager
def heap_reused() -> Iterator[None]:
    """While the body runs, tensors up to 32 MiB come from the heap and freed pages stay in it (trim_heap waits),
    so a loop that allocates the same working set again and again (learned rounding's steps, and the passes of a
    learning block) reuses its pages instead of mapping and faulting them in afresh each time; after it the fixed
    threshold is back and the heap trimmed."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc
        yield
        return
    libc.mallopt(M_MMAP_THRESHOLD, HEAP_THRESHOLD_MAX)
    libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)
    _REUSING[0] = True
    try:
        yield
    finally:
        _REUSING[0] = False
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
        trim_heap()
