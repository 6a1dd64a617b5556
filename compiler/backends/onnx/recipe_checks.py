"""What the ONNX backend refuses in a recipe alone, before any model is read: MatMulNBits block sizes (Q208),
several devices (Q234), floating formats onnxruntime's CPU build cannot run (Q257), the importance-weighted
search on integer weights (Q272), learned rounding (Q274), an attention kernel choice an exported graph has no use for (Q270), a
rotation in offload (R4 after SmoothQuant's fold too) and a learned rotation (Q273)."""

from __future__ import annotations

from compiler.diagnostics import Diagnostics
from compiler.ir.checks import refuse_attention_kernel
from compiler.ir.types import EmitFormat, MemoryMode, OnlineRotation, QType, RecipeIR, Rounding

# the integer types ONNX's QuantizeLinear/DequantizeLinear and MatMulNBits hold (the float formats, the K-quants and a
# plug-in's integer of another width are not among them)
ONNX_TYPES = (QType.INT8, QType.UINT8, QType.INT4, QType.UINT4)


def check_recipe(ir: RecipeIR, diags: Diagnostics) -> None:
    """The ONNX backend's checks of the recipe alone."""
    if ir.emit is not None and ir.emit.format is EmitFormat.MATMUL_NBITS:
        _check_matmul_nbits(ir, diags)
    if ir.memory.mode is MemoryMode.MULTI_GPU:
        diags.error("Q234", "`mode multi_gpu` needs backend torch", ir.memory.span_of("mode"),
                    "onnx runs on one device", help="use `mode auto`, or `backend torch` for several GPUs")
    _refuse_float_formats(ir, diags)
    _refuse_imatrix(ir, diags)
    _refuse_learned(ir, diags)
    refuse_attention_kernel(ir, diags, "an ONNX graph")
    if ir.transform is not None and ir.transform.kind.learns:
        diags.error("Q273", f"`transform {ir.transform.kind.name}` learns its rotations by training the whole model "
                    "with gradients, which the ONNX backend does not run", ir.transform.span,
                    "learned on torch only", help="use `transform quarot` (random rotations: the ONNX backend folds "
                    "them, R4 included), or `backend torch`")
    elif ir.transform is not None and (ir.transform.kind.rotates or OnlineRotation.R4 in ir.transform.online) and \
            ir.memory.mode is MemoryMode.OFFLOAD:
        what = f"`transform {ir.transform.kind.name}`" if ir.transform.kind.rotates else "`online r4`"
        diags.error("Q273", f"{what} on the ONNX backend rotates a copy of the whole "
                    "graph before calibration; `mode offload` cuts its segments from the unrotated one",
                    ir.memory.span_of("mode") or ir.transform.span, "not with offload",
                    help="use `mode full` or `low_memory`, or `backend torch`, which rotates block by block")


def _refuse_imatrix(ir: RecipeIR, diags: Diagnostics) -> None:
    """Q272: `rounding imatrix` on integer weights is the torch backend's (its calibration gathers each input
    column's mean square); the ONNX backend gathers Hessians for GPTQ only. K-quants are Q257's."""
    for scheme in ir.used_schemes:
        if scheme.rounding is Rounding.IMATRIX and scheme.weights is not None and not scheme.quantized_weights.qtype.is_kquant:
            diags.error("Q272", f"scheme `{scheme.name}` rounds with `imatrix`, which the ONNX backend does not run",
                        scheme.span or ir.span, "imatrix on onnx",
                        help="use `backend torch`, or `rounding mse` (data-free) or `rounding gptq` on ONNX")



def _refuse_learned(ir: RecipeIR, diags: Diagnostics) -> None:
    """Q274: learned rounding trains each block's rounding with torch's autograd on the block as a module; an ONNX
    graph has no blocks to train."""
    for scheme in ir.used_schemes:
        if scheme.rounding is Rounding.AUTOROUND:
            diags.error("Q274", f"scheme `{scheme.name}` rounds with `autoround`, which learns per block on the torch "
                        "backend; the ONNX backend does not run it", scheme.span or ir.span, "autoround on onnx",
                        help="use `backend torch` on the model's folder, or `rounding gptq` on ONNX")


def _check_matmul_nbits(ir: RecipeIR, diags: Diagnostics) -> None:
    for scheme in ir.used_schemes:
        weights = scheme.weights
        if weights is None or scheme.activations is not None:
            continue  # float layers stay float; activation-quantized ones are emitted as QDQ
        size = weights.group_size
        if size is None or size < 16 or size & (size - 1):
            got = f"`group {size}`" if size else f"`{weights.granularity.value}`"
            diags.error("Q208", f"scheme `{scheme.name}` uses {got}, which MatMulNBits cannot take",
                        scheme.span or (ir.emit.span_of("format") if ir.emit else None), "not a MatMulNBits block size",
                        help="MatMulNBits needs `group N` with N a power of two ≥ 16 (32, 64, 128); "
                        "or emit `format qdq`")



def _refuse_float_formats(ir: RecipeIR, diags: Diagnostics) -> None:
    """Q257: floating formats on the ONNX backend. onnxruntime's CPU build has no float8 MatMul (its QDQ
    would run dequantized, in float) and no FP4 type; the formats are written for the runtimes that serve
    them from compressed-tensors folders (vLLM, transformers)."""
    if ir.kv_cache is not None:
        diags.error("Q257", "`kv_cache { fp8 }` is written by the torch backend, not the ONNX one", ir.kv_cache.span,
                    "KV cache on onnx", help="use `backend torch`; onnxruntime-genai keeps its cache in the model's dtype")
    for scheme in ir.used_schemes:
        types = {t for t in (scheme.quantized_weights.qtype, scheme.activations and scheme.activations.qtype)
                 if t and t not in ONNX_TYPES}
        if types:
            diags.error("Q257", f"scheme `{scheme.name}` uses {', '.join(sorted(t.name for t in types))}, which the "
                        "ONNX backend does not write", scheme.span or ir.span, "not written on onnx",
                        help="use `backend torch` (a compressed-tensors folder for vLLM and transformers; GGUF for "
                        "the K-quants), or an integer scheme (W8A8, W4A16) for onnxruntime")
