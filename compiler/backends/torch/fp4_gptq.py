"""GPTQ onto an FP4 format's grid (`rounding gptq` with NVFP4 or MXFP4 weights).

The block scales are taken from the float weight before the column loop (float_formats.fp4_scales): by default
searched as `rounding imatrix` searches them, each column weighted by the Hessian's diagonal, or with
`minmax_scales` the ones round to nearest takes (compressed-tensors' ranges, as llm-compressor's GPTQModifier
takes them from its observer); NVFP4's global scale is round to nearest's either way. Each block's step is what
compressed-tensors' own dequantize computes; GPTQ then rounds the columns onto those blocks' e2m1 values, each
column's error spread over the columns not yet rounded (quant/gptq.py), and the values are stored with the same
scales, so the folder decompresses to exactly the values GPTQ chose."""

from __future__ import annotations

import numpy as np
import torch

from compiler.backends.torch import float_formats
from compiler.backends.torch.quant_args import weight_args
from compiler.ir.types import Scheme
from compiler.quant.gptq import gptq_on_fp4_grid

STEP_ROWS = 1024  # rows whose block steps are read at once (a float32 row of ones and its dequantized copy each)


def block_steps(scales: float_formats.GivenScales, scheme: Scheme) -> np.ndarray:
    """Each block's step (float32 [out, in / block]): what one e2m1 unit of that block decompresses to, by
    compressed-tensors' calculate_qparams and dequantize (so the arithmetic is the loader's)."""
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import dequantize
    from compressed_tensors.quantization.utils import calculate_qparams

    spec = scheme.quantized_weights
    block = spec.qtype.fixed_group
    assert block is not None, "the FP4 formats define their block"
    args = QuantizationArgs.model_validate(weight_args(spec))
    scale, zero_point = calculate_qparams(-scales.high, scales.high, args, global_scale=scales.global_scale)
    rows, blocks = scales.high.shape
    steps = np.empty((rows, blocks), np.float32)
    for first in range(0, rows, STEP_ROWS):  # a slice of rows at a time: two weight-wide float32 temporaries
        last = min(first + STEP_ROWS, rows)  # of a slice, not of the whole weight
        ones = torch.ones(last - first, blocks * block)
        part = dequantize(ones, scale[first:last], zero_point[first:last], args, dtype=torch.float32,
                          global_scale=scales.global_scale)
        steps[first:last] = part[:, ::block].numpy()
    return steps


def gptq_fp4(weight: torch.Tensor, scheme: Scheme, hessian: np.ndarray, scale_dtype: torch.dtype,
             shared: float_formats.SharedGlobal | None, device: str, dampened=None) -> float_formats.FloatQuantized:
    """`weight` [out, in] rounded by GPTQ onto its FP4 grid with the layer's Hessian (consumed), stored as
    compressed-tensors stores the format. The block scales come from the float weight: searched with each column
    weighted by the Hessian's diagonal (`mse_scales`, the default: on the real SmolLM2-135M NVFP4A16 went from
    +9.1% to +6.2% perplexity over float), or round to nearest's ranges (`minmax_scales`)."""
    w = weight.detach().float().cpu()
    importance = np.ascontiguousarray(np.diagonal(hessian), np.float32) if scheme.mse_scales else None
    scales = float_formats.fp4_scales(w, scheme.quantized_weights, shared, importance)
    rounded = gptq_on_fp4_grid(w.numpy(), hessian, block_steps(scales, scheme), scheme.act_order, device, dampened)
    return float_formats.quantize_scheme(torch.from_numpy(rounded), scheme, scale_dtype, given=scales)
