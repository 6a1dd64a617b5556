"""What reading a GGUF source model (models/gguf_source.py) adds to a torch run's memory, and what copying a
tensor whole (into a GGUF) holds."""

from __future__ import annotations

from compiler.models.gguf_source import DEQUANTIZED_SLICE
from compiler.plan.workload import Workload

DEQUANTIZING = 4  # slices of float32 the gguf package's dequantizers hold at once (models/gguf_source.read_tensor)


def source_tensor_bytes(w: Workload, copied_whole: bool) -> int:
    """A GGUF source gives each weight to round dequantized from its blocks to float32 whole; each tensor only
    copied (the embedding) into a folder a slice of rows at a time (output_layout.py), or whole where the output
    format encodes whole tensors (`copied_whole`: GGUF's types read the whole tensor). So: the largest such
    tensor's float32 copy, held beside what the rounding holds, and the gguf package's temporaries of dequantizing
    one slice of rows (about four slices of float32; they stay in the heap: a Q4_0 GGUF written from SmolLM2-135M
    measured 446 MiB against 402 planned without them). Copied whole, SmolLM2-135M's 113 MB embedding took the
    W8A16 folder's rounding process to 551 MiB, a slice at a time 427. 0 for other sources."""
    if not w.index.ref.lower().endswith(".gguf"):
        return 0
    whole = [x for x in w.index.layers if copied_whole or x.name in set(w.quantized_layers)]
    return 4 * max((x.params for x in whole), default=0) + DEQUANTIZING * DEQUANTIZED_SLICE


def whole_copy_bytes(w: Workload) -> int:
    """The largest tensor no rule quantizes, as its copy into a format that encodes whole tensors (GGUF) holds
    it: read whole, in its stored bytes (a GGUF source's dequantized to float32). The real SmolLM2-135M's 113 MB
    embedding went into its GGUF at `emit` 378 MiB against 294 planned from a float folder, 547 against 462 from a
    compressed-tensors one."""
    quantized = set(w.quantized_layers)
    dequantized = w.index.ref.lower().endswith(".gguf")
    return max((4 * x.params if dequantized else x.bytes for x in w.index.layers if x.name not in quantized),
               default=0)
