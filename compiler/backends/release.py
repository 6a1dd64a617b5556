"""Give freed memory back to the operating system between phases, so that the RSS of the next phase is
that phase's own (glibc otherwise keeps freed heap pages, and the peak of one phase carries over)."""

from __future__ import annotations

import ctypes
import gc


def release_memory() -> None:
    """Collect garbage and give freed heap pages back to the OS (glibc's malloc_trim)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass
