"""Whether this CPU's onnxruntime runs uint8 × int8 MatMuls with a saturating kernel.

On x86 without VNNI (SSE4.1, AVX2, AVX-512 without VNNI) onnxruntime's MLAS U8S8 kernel multiplies with
`vpmaddubsw`, which adds each pair of uint8 × int8 products in 16 bits and saturates, so a layer with int8
weights can compute less accurately there than its QDQ graph says. AVX-VNNI and AVX-512 VNNI (`vpdpbusd`)
add in 32 bits, and uint8 weights (the U8U8 kernel) widen to 16 bits first: neither saturates. ARM's kernels
(`sdot`/`udot`) do not either.
"""

from __future__ import annotations

import platform
from pathlib import Path

from compiler.backends.cpu_flags import cpu_flags
from compiler.backends.onnx.kernels import layer_kernels
from compiler.diagnostics import Diagnostic, warning
from compiler.ir.types import EmitFormat, QType
from compiler.resolve.assignment import Assignment
from compiler.source import Span

_X86 = ("x86_64", "amd64", "i686", "i386")
_VNNI = ("avx512_vnni", "avx_vnni", "amx_int8")
_INTEGER_KERNELS = ("MatMulIntegerToFloat", "QLinearConv", "QGemm")
CPUINFO = Path("/proc/cpuinfo")


def u8s8_saturates() -> bool:
    """True on an x86 CPU whose flags (Linux's /proc/cpuinfo) name no VNNI; False elsewhere or when unknown."""
    if platform.machine().lower() not in _X86:
        return False
    flags = cpu_flags(CPUINFO)
    return flags is not None and not any(f in flags for f in _VNNI)


def saturating_layers(assignment: Assignment, fmt: EmitFormat) -> list[str]:
    """The layers onnxruntime runs with an integer kernel on int8 weights (U8S8)."""
    kernels = layer_kernels(assignment, fmt)
    return [a.layer.name for a in assignment.layers
            if kernels.get(a.layer.name) in _INTEGER_KERNELS and a.scheme.quantized_weights.qtype is QType.INT8]


def saturation_warning(assignment: Assignment, fmt: EmitFormat, span: Span | None) -> Diagnostic | None:
    """Q502 when this CPU verifies int8-weight integer kernels that saturate here: the figures are this CPU's."""
    layers = saturating_layers(assignment, fmt)
    if not layers or not u8s8_saturates():
        return None
    return warning("Q502", f"verified on a CPU without VNNI: onnxruntime's U8S8 kernel adds uint8 × int8 products "
                           f"in 16 bits with saturation here, so {len(layers)} layers with int8 weights (first "
                           f"`{layers[0]}`) may verify lower than on a CPU with VNNI", span, "this CPU's figures",
                   help="the figures are what this CPU serves; `weights uint8 per_channel asymmetric` (U8U8, "
                        "recipes/tiny-llama-w8a8-u8u8.recipe) adds in 32 bits on every x86 CPU")
