"""Every dtype the safetensors format defines (its spec's dtype list), one table for the whole project: the
model index reads headers with it, the torch backend reads and writes tensors with it. Sub-byte types
(F4, F6_*) are packed, so widths are in bits."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SafetensorsDtype:
    """A safetensors dtype code: torch's name for it (None where torch has no such dtype) and its width."""
    code: str
    torch_name: str | None
    bits: int

    def nbytes(self, elements: int) -> int:
        """Bytes of `elements` values (sub-byte types packed)."""
        return -(-elements * self.bits // 8)


SAFETENSORS_DTYPES = {d.code: d for d in (
    SafetensorsDtype("BOOL", "bool", 8),
    SafetensorsDtype("U8", "uint8", 8), SafetensorsDtype("I8", "int8", 8),
    SafetensorsDtype("U16", "uint16", 16), SafetensorsDtype("I16", "int16", 16),
    SafetensorsDtype("U32", "uint32", 32), SafetensorsDtype("I32", "int32", 32),
    SafetensorsDtype("U64", "uint64", 64), SafetensorsDtype("I64", "int64", 64),
    SafetensorsDtype("F16", "float16", 16), SafetensorsDtype("BF16", "bfloat16", 16),
    SafetensorsDtype("F32", "float32", 32), SafetensorsDtype("F64", "float64", 64),
    SafetensorsDtype("C64", "complex64", 64),
    SafetensorsDtype("F8_E4M3", "float8_e4m3fn", 8), SafetensorsDtype("F8_E5M2", "float8_e5m2", 8),
    SafetensorsDtype("F8_E4M3FNUZ", "float8_e4m3fnuz", 8), SafetensorsDtype("F8_E5M2FNUZ", "float8_e5m2fnuz", 8),
    SafetensorsDtype("F8_E8M0", "float8_e8m0fnu", 8),
    SafetensorsDtype("F6_E2M3", None, 6), SafetensorsDtype("F6_E3M2", None, 6),
    SafetensorsDtype("F4", "float4_e2m1fn_x2", 4),
)}
BY_TORCH_NAME = {d.torch_name: d for d in SAFETENSORS_DTYPES.values() if d.torch_name}
