"""How the ONNX backend writes its output: the quantized model assembled in memory and serialized whole, or its
weights streamed to a data file as they are rounded. The cost model (memory and time) and the emitter both ask."""

from __future__ import annotations

from compiler.ir.types import MemoryMode
from compiler.plan.workload import Workload

EXTERNAL_THRESHOLD = 1 << 30  # an output above this keeps its weights in `<model>.data` (protobuf stops at 2 GiB)


def streams_output(w: Workload, mode: MemoryMode) -> bool:
    """Whether the output keeps its weights in external data, written as they are rounded (offload, or an
    output beyond EXTERNAL_THRESHOLD); otherwise the quantized model is assembled in memory."""
    return mode is MemoryMode.OFFLOAD or w.quantized_bytes > EXTERNAL_THRESHOLD
