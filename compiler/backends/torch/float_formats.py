"""The floating formats (FP8, NVFP4, MXFP4, MXFP8) rounded and stored by compressed-tensors itself: its
calculate_qparams / generate_gparam turn each scale's min and max into scales (the global scale of NVFP4,
the e8m0 exponents of MX), and its registered compressor writes the stored tensors, so the bits are the
ones its decompressor, transformers and vLLM expect. qrc does what compressed-tensors leaves to an observer
(each scale's range, one reduction per strategy) and reads the weights back through the same decompressor
for verification."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from compiler.backends.torch import fp4_kernels
from compiler.backends.torch.fp4_cast import E4M3_POWERS, exact_cast
from compiler.backends.torch.quant_args import weight_args, weight_format
from compiler.ir.types import ActivationQuant, Granularity, QType, Rounding, Scheme, WeightQuant
from compiler.quant import fused_float
from compiler.quant.parallel import cores, parallel_map
from compiler.quant.qparams import FP4_MAX, FP8_MAX
from compiler.quant.weights import error_sums


@dataclass(frozen=True)
class SharedGlobal:
    """What NVFP4 siblings (q/k/v, gate/up: global_scales.py) share so that they get one global scale: their
    largest |w|, and whether each of them lies on an FP4 grid it keeps exactly (fp4_cast.py: then the global
    scale is the cast's power of two for all of them, else the one from `absmax` for all of them). `unit`: the
    global scale is 1 whatever the weights (a runtime that reads none: global_scales.py), `absmax` UNIT_RANGE."""

    absmax: float
    exact: bool
    unit: bool = False


UNIT_RANGE = 448.0 * 6.0  # the largest |w| whose NVFP4 global scale is 1 (448 · 6 / |w|, generate_gparam's)


@dataclass(frozen=True)
class FloatQuantized:
    """A weight rounded to a floating format: the stored tensors by local name (`weight`, `weight_packed`,
    `weight_scale`, `weight_global_scale`) and the weight they decompress to."""

    stored: dict[str, torch.Tensor]
    dequantized: torch.Tensor | None  # float32 [out, in]; None when rounded with `measure` (its sums instead)
    sums: tuple[float, float] | None = None  # (Σ w², Σ (w − dequantized)²), taken slice by slice with `measure`

    def dequantize(self) -> np.ndarray:
        """The weight as a loader computes with it, float32."""
        assert self.dequantized is not None, "a weight rounded with `measure` keeps its sums, not its values"
        return self.dequantized.numpy()

    # torch 2.13 pickles float8 tensors but cannot unpickle them; the ranks hand rounded weights on as pickles
    # (torch.distributed's object collectives), so float8 tensors travel as their bytes
    def __getstate__(self) -> tuple:
        return {k: portable(v) for k, v in self.stored.items()}, self.dequantized, self.sums

    def __setstate__(self, state: tuple) -> None:
        stored, dequantized, sums = state
        object.__setattr__(self, "stored", {k: restored(v) for k, v in stored.items()})  # frozen: unpickling sets it once
        object.__setattr__(self, "dequantized", dequantized)
        object.__setattr__(self, "sums", sums)


def portable(tensor: torch.Tensor):
    """A tensor as it can travel pickled between ranks: float8 as its bytes and its dtype's name."""
    if tensor.is_floating_point() and tensor.element_size() == 1:  # float8: its bytes and its dtype's name
        return tensor.view(torch.uint8), str(tensor.dtype).removeprefix("torch.")
    return tensor


def restored(value):
    """The tensor `portable` made travel."""
    if isinstance(value, tuple):
        data, dtype = value
        return data.view(getattr(torch, dtype))
    return value


@dataclass(frozen=True)
class GivenScales:
    """Block scales to round an FP4 weight with instead of its own: each block's symmetric range `high` (float32
    [out, in / block]) under `global_scale` (NVFP4; None for MXFP4), as compressed-tensors turns them into
    scales. What GPTQ onto FP4 (fp4_gptq.py) stores its values with: the float weight's."""

    global_scale: torch.Tensor | None
    high: torch.Tensor


def fp4_scales(weight: torch.Tensor, spec: WeightQuant, shared: SharedGlobal | None = None,
               importance: np.ndarray | None = None) -> GivenScales:
    """The block ranges and global scale round to nearest takes for an FP4 weight (`quantize_float`): an exact
    cast's where the weight lies on an FP4 grid, else the blocks' largest magnitudes under the global scale of
    `shared` or of the weight's own range; with `importance` (float32 [in]), the scales searched with each
    column's error so weighted (searched_scales)."""
    w = weight.detach().cpu()
    cast = _exact(w, spec, shared)
    if cast is not None:
        return GivenScales(cast.global_scale, cast.high)
    searched = None if importance is None else searched_scales(w, spec, shared.absmax if shared else None, importance)
    if searched is not None:
        return _floored(searched, shared)
    unit = _unit_ranges(w, spec, shared)
    if unit is not None:
        return unit
    low, high = _ranges(w.float(), spec)
    return GivenScales(_global_scale(w, spec, shared), torch.maximum(-low, high))


def _exact(w: torch.Tensor, spec: WeightQuant, shared: SharedGlobal | None):
    """The exact NVFP4 cast of `w` (fp4_cast.py) where it applies (alone, or with every fused sibling), else None."""
    if spec.qtype is QType.NVFP4 and (shared is None or shared.exact):
        return exact_cast(w, shared.absmax if shared is not None else None, unit=shared is not None and shared.unit)
    return None


def _unit_ranges(w: torch.Tensor, spec: WeightQuant, shared: SharedGlobal | None) -> GivenScales | None:
    """With a global scale of 1 (`shared.unit`) and a weight on no FP4 grid: the blocks' ranges, floored
    (_floored); None otherwise."""
    if spec.qtype is not QType.NVFP4 or shared is None or not shared.unit:
        return None
    low, high = _ranges(w.float(), spec)
    return _floored(GivenScales(torch.ones(1, dtype=torch.float32), torch.maximum(-low, high)), shared)


def _floored(scales: GivenScales, shared: SharedGlobal | None) -> GivenScales:
    """Under a global scale of 1 (`shared.unit`), block ranges no smaller than e4m3's smallest scale times 6
    (6 · 2^-9): a block of values under 0.012 then rounds with the scale 2^-9 rather than with one e4m3 flushes to
    zero, which would zero the block (random weights of std 0.001 all became 0). As they are otherwise."""
    if shared is None or not shared.unit:
        return scales
    floor = torch.tensor(FP4_MAX * 2.0 ** E4M3_POWERS[0])
    return GivenScales(scales.global_scale, torch.maximum(scales.high, floor))


def _global_scale(w: torch.Tensor, spec: WeightQuant, shared: SharedGlobal | None) -> torch.Tensor | None:
    """NVFP4's global scale by compressed-tensors' generate_gparam, from the siblings' shared largest magnitude or
    the weight's own range; None for the formats without one."""
    if spec.qtype.fixed_group != 16:
        return None
    from compressed_tensors.quantization.utils import generate_gparam

    if shared is not None:
        bound = torch.tensor(shared.absmax)
        return generate_gparam(-bound, bound)
    return generate_gparam(w.min().float(), w.max().float())


def quantize_float(weight: torch.Tensor, spec: WeightQuant, args: dict, fmt: str, scale_dtype: torch.dtype,
                   shared: SharedGlobal | None = None, measure: bool = False, kernel: bool = True,
                   given: GivenScales | None = None, importance: np.ndarray | None = None) -> FloatQuantized:
    """Round `weight` [out, in] with the compressed-tensors weight arguments `args` and store it in format
    `fmt`; scales are kept in `scale_dtype` (the checkpoint's float dtype) where the format does not fix their
    type. NVFP4's global scale comes from `shared` where fused siblings share it (global_scales.py), else from
    the weight's own range; a weight already on an FP4 grid NVFP4 holds exactly (an MXFP4 source) is cast to
    it, its floats kept bit for bit (fp4_cast.py). Every scale but a per-tensor one covers rows of its own, so slices of
    rows (whole blocks of them) are rounded on every core, each made float32 there, and their tensors joined:
    the bytes of one piece. `measure`: the SQNR's sums instead of the dequantized weight, and the formats
    fused_float rounds are rounded there (the same bits; `kernel=False`: compressed-tensors' functions only,
    the reference tests/test_float_kernels.py holds the loop to). `given`: the block scales to round with
    instead (GivenScales). `importance` (NVFP4, MXFP4; float32 [in]: `rounding imatrix`'s input mean squares,
    ones for `rounding mse`): each block's scale the one of least squared error so weighted among its own and its
    neighbours, chosen by fused_float's loop and rounded with there or, where the dequantized weight is wanted,
    handed to compressed-tensors as given scales (the same bits)."""
    w = weight.detach().cpu()
    cast = given if given is not None else _exact(w, spec, shared)
    shared_absmax = shared.absmax if shared is not None else None
    floored = shared is not None and shared.unit  # the compiled loop flushes small blocks under it: _floored
    if measure and kernel and cast is None and not floored:  # before compressed-tensors' import: data-free rounding
        compiled = _compiled(w, spec, scale_dtype, shared_absmax, importance)  # starts without it
        if compiled is not None:
            return compiled
    if importance is not None and cast is None:
        searched = searched_scales(w, spec, shared_absmax, importance)
        cast = _floored(searched, shared) if searched is not None else None
    if cast is None:
        cast = _unit_ranges(w, spec, shared)
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    fp4_kernels.register()  # FP4's cast and packing on the CPU, through compressed-tensors' own dispatch
    quant_args = QuantizationArgs.model_validate(args)
    global_scale = cast.global_scale if cast is not None else _global_scale(w, spec, shared)
    scheme = QuantizationScheme(targets=["Linear"], weights=quant_args)
    compressor = BaseCompressor.load_from_registry(fmt)

    def rounded(first: int, rows: torch.Tensor) -> _Piece:
        high = None if cast is None else cast.high[first:first + rows.shape[0]]
        return _round_rows(rows.float(), spec, quant_args, scheme, compressor, global_scale, scale_dtype, measure,
                           high)

    unit = spec.block_shape[0] if spec.granularity is Granularity.BLOCK else 1
    step = _rows_per_slice(w, unit)
    if spec.granularity is Granularity.PER_TENSOR or step >= w.shape[0]:
        pieces = [rounded(0, w)]
    else:
        pieces = parallel_map(lambda first: rounded(first, w[first:first + step]), range(0, w.shape[0], step))
    return _joined(pieces, global_scale is not None, measure)


def nvfp4_global_scale(absmax: float) -> torch.Tensor:
    """compressed-tensors' generate_gparam for a range whose largest magnitude is `absmax`, written out: 448 ·
    6 / absmax in float32 (absmax at least float32's tiny; a NaN or infinite result made 1), shape [1].
    Data-free rounding then needs no import of compressed-tensors, which imports transformers (seconds),
    before its first weight; tests/test_float_kernels.py compares the two bit for bit."""
    bound = torch.tensor([absmax], dtype=torch.float32).clamp(min=torch.finfo(torch.float32).tiny)
    return torch.nan_to_num(FP8_MAX * FP4_MAX / bound, nan=1.0, posinf=1.0, neginf=1.0)


def absmax(weight: torch.Tensor, compiled: bool) -> float:
    """max |w| of a weight in its stored dtype: from its bits on every core (bfloat16, float32) where
    `compiled` (where the compiled loops round: file to file), else from its min and max (no float32 or |w|
    copy of it either way; and no compiled code loaded, 100 MiB, where the weights round without it)."""
    bits = float_bits(weight) if compiled else None
    if bits is not None:
        return fused_float.absmax(bits)
    low, high = torch.aminmax(weight)
    return max(-float(low), float(high))


def float_bits(weight: torch.Tensor) -> np.ndarray | None:
    """A bfloat16 or float32 CPU weight's bits as numpy (uint16, uint32; no copy of a contiguous one), else None."""
    kinds = {torch.bfloat16: (torch.int16, np.uint16), torch.float32: (torch.int32, np.uint32)}
    if weight.dtype not in kinds or weight.device.type != "cpu":
        return None
    signed, unsigned = kinds[weight.dtype]
    return weight.contiguous().view(signed).numpy().view(unsigned)


def searched_scales(w: torch.Tensor, spec: WeightQuant, shared_absmax: float | None,
                    importance: np.ndarray) -> GivenScales | None:
    """The block scales `rounding mse`/`imatrix` choose for an NVFP4 or MXFP4 weight (fused_float's search, each
    column's error weighted by `importance`), as the ranges
    compressed-tensors turns back into them: NVFP4 the e4m3 scale · 6 over the global scale, MXFP4 4 · 2^(e − 127)
    (its power-of-two rounding gives e back); None where the loop cannot round the weight (compressed-tensors
    then rounds it by its ranges, and refuses a non-finite one)."""
    bits = float_bits(w if w.dtype in (torch.bfloat16, torch.float32) else w.float())
    if bits is None or not fused_float.applies(spec, "float32", tuple(w.shape)):
        return None
    global_scale = _loop_global_scale(bits, spec, shared_absmax)
    done = fused_float.round_bits(bits, spec, "float32", None if global_scale is None else float(global_scale),
                                  importance)
    if done is None:
        return None
    codes = torch.from_numpy(done.scales)
    if global_scale is not None:
        return GivenScales(global_scale, codes.view(torch.float8_e4m3fn).float() * FP4_MAX / global_scale)
    return GivenScales(None, torch.ldexp(torch.full(codes.shape, 4.0), codes.to(torch.int32) - 127))


def _loop_global_scale(bits: np.ndarray, spec: WeightQuant, shared_absmax: float | None) -> torch.Tensor | None:
    """NVFP4's global scale for the compiled loop, from the fused siblings' shared range or the weight's own
    (its bits); None for the formats without one."""
    if spec.qtype is not QType.NVFP4:
        return None
    return nvfp4_global_scale(shared_absmax if shared_absmax is not None else fused_float.absmax(bits))


def _compiled(w: torch.Tensor, spec: WeightQuant, scale_dtype: torch.dtype,
              shared_absmax: float | None, importance: np.ndarray | None = None) -> FloatQuantized | None:
    """`w` rounded by fused_float's loop, its tensors as compressed-tensors' compressor stores them (the same
    names, dtypes, shapes and order); None where the loop does not take it. `importance`: the searched scales'
    column weights (quantize_float)."""
    bits, dtype_name = float_bits(w), str(scale_dtype).removeprefix("torch.")
    if bits is None or not fused_float.applies(spec, dtype_name, tuple(w.shape)):
        return None
    global_scale = _loop_global_scale(bits, spec, shared_absmax)
    done = fused_float.round_bits(bits, spec, dtype_name, None if global_scale is None else float(global_scale),
                                  importance)
    if done is None:
        return None
    scales = torch.from_numpy(done.scales)
    if spec.qtype is QType.FP8:
        stored = {"weight_scale": scales.to(scale_dtype),
                  "weight": torch.from_numpy(done.codes).view(torch.float8_e4m3fn)}
    else:
        stored = {"weight_packed": torch.from_numpy(done.codes),
                  "weight_scale": scales.view(torch.float8_e4m3fn) if spec.qtype is QType.NVFP4 else scales}
        if global_scale is not None:
            stored = {"weight_global_scale": global_scale, **stored}
    return FloatQuantized(stored, None, done.sums)


FLOAT_TASK_BYTES = 2 << 20  # float32 bytes of rows one core rounds at a time


@dataclass(frozen=True)
class _Piece:
    stored: dict[str, torch.Tensor]
    dequantized: torch.Tensor | None
    sums: tuple[float, float] | None


def _rows_per_slice(w: torch.Tensor, unit: int) -> int:
    """Rows per slice: about FLOAT_TASK_BYTES of float32, whole blocks of `unit` rows, at least one slice a core."""
    rows = w.shape[0]
    bytes_per_row = 4 * max(1, w.shape[1] if w.ndim > 1 else 1)
    slices = max(cores(), -(-rows * bytes_per_row // FLOAT_TASK_BYTES))
    step = max(1, -(-rows // slices))
    return -(-step // unit) * unit


def _round_rows(w: torch.Tensor, spec: WeightQuant, quant_args, scheme, compressor, global_scale,
                scale_dtype: torch.dtype, measure: bool, high: torch.Tensor | None = None) -> _Piece:
    """Rows of a weight (float32) rounded and compressed by compressed-tensors, decompressed again by it.
    `high`: each scale's symmetric range where it is given (an exact cast's), not the values' own."""
    from compressed_tensors.quantization.utils import calculate_qparams

    low, high = _ranges(w, spec) if high is None else (-high, high)
    scale, _ = calculate_qparams(low, high, quant_args, global_scale=global_scale)
    if not spec.qtype.fixed_group:  # FP8's scales are held in the model's dtype, as llm-compressor's modules do
        scale = scale.to(scale_dtype)
    state = {"weight": w, "weight_scale": scale}
    if global_scale is not None:
        state["weight_global_scale"] = global_scale
    stored = {k: v.contiguous() for k, v in compressor.compress(state, scheme).items()}
    restored = compressor.decompress(dict(stored), scheme)["weight"].float()
    if measure:
        return _Piece(stored, None, error_sums(w.numpy(), restored.numpy()))
    return _Piece(stored, restored, None)


def _joined(pieces: list[_Piece], global_scale: bool, measure: bool) -> FloatQuantized:
    """The slices' tensors joined along their rows (the one global scale taken once), and their sums added."""
    head = pieces[0]
    if len(pieces) == 1:
        return FloatQuantized(head.stored, head.dequantized, head.sums)
    stored = {k: v if global_scale and k == "weight_global_scale" else torch.cat([p.stored[k] for p in pieces])
              for k, v in head.stored.items()}
    if measure:
        sums = (sum(p.sums[0] for p in pieces if p.sums), sum(p.sums[1] for p in pieces if p.sums))
        return FloatQuantized(stored, None, sums)
    return FloatQuantized(stored, torch.cat([p.dequantized for p in pieces if p.dequantized is not None]))


def _ranges(w: torch.Tensor, spec: WeightQuant) -> tuple[torch.Tensor, torch.Tensor]:
    """Each scale's (min, max): one reduction per strategy, shaped as compressed-tensors shapes its scales."""
    out, inp = w.shape
    if spec.granularity is Granularity.PER_TENSOR:
        return w.min(), w.max()
    if spec.granularity is Granularity.PER_CHANNEL:
        return w.amin(dim=1, keepdim=True), w.amax(dim=1, keepdim=True)
    if spec.granularity is Granularity.GROUP:
        groups = w.reshape(out, inp // spec.group, spec.group)
        return groups.amin(dim=-1), groups.amax(dim=-1)
    rows, cols = spec.block_shape  # BLOCK: tiles padded with zeros (0 is in every range anyway)
    padded = torch.zeros(math.ceil(out / rows) * rows, math.ceil(inp / cols) * cols)
    padded[:out, :inp] = w
    tiles = padded.reshape(padded.shape[0] // rows, rows, padded.shape[1] // cols, cols)
    return tiles.amin(dim=(1, 3)), tiles.amax(dim=(1, 3))


def fp8_input_scale(low: float, high: float, scale_dtype: torch.dtype) -> float:
    """A static FP8 input's scale from its calibrated range: absmax / 448, as stored (the model's dtype)."""
    absmax = max(abs(low), abs(high))
    scale = torch.tensor(absmax / FP8_MAX if absmax > 0 else torch.finfo(torch.float32).tiny, dtype=scale_dtype)
    return float(scale.float())


def quantize_scheme(weight: torch.Tensor, scheme: Scheme, scale_dtype: torch.dtype,
                    shared: SharedGlobal | None = None, measure: bool = False,
                    given: GivenScales | None = None, importance: np.ndarray | None = None) -> FloatQuantized:
    """`weight` rounded and stored as a floating scheme's weights say (its compressed-tensors arguments and
    format): what the rounding and the precision search both call. An FP4 scheme's `rounding mse` searches its
    block scales; `rounding imatrix` too, weighted by `importance` (each input column's mean square; None where
    no calibration token reached the layer: unweighted, as mse)."""
    spec = scheme.quantized_weights
    weighted = None
    if scheme.searches_fp4_scales and given is None:  # GPTQ's searched scales come given (fp4_gptq.py)
        weighted = importance if scheme.rounding is Rounding.IMATRIX and importance is not None else \
            np.ones(weight.shape[-1], np.float32)
        weighted = np.ascontiguousarray(weighted, np.float32)
    return quantize_float(weight, spec, weight_args(spec), weight_format(scheme), scale_dtype, shared, measure,
                          given=given, importance=weighted)


def nvfp4_input_global_scale(low: float, high: float) -> float:
    """NVFP4's global input scale from the calibrated range, by compressed-tensors' generate_gparam
    (448·6 / absmax, float32), as its `static_minmax` observer sets `input_global_scale`."""
    from compressed_tensors.quantization.utils import generate_gparam

    return float(generate_gparam(torch.tensor(float(low)), torch.tensor(float(high)))[0])


def fp4_input_hook(args: dict, global_scale: float | None):
    """The forward pre-hook of NVFP4/MXFP4 inputs: compressed-tensors' own dynamic block scales (under the
    global scale, for NVFP4) and its rounding, what transformers runs a loaded folder with."""
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    from compressed_tensors.quantization.utils import compute_dynamic_scales_and_zp

    quant_args = QuantizationArgs.model_validate(args)
    scale_of_scales = torch.tensor([global_scale], dtype=torch.float32) if global_scale is not None else None
    on_device: dict = {}  # the global scale on each device the layer's inputs come from (a GPU in multi_gpu)

    def hook(module, inputs):
        x = inputs[0]
        scaled = None if scale_of_scales is None else on_device.setdefault(x.device, scale_of_scales.to(x.device))
        scale, zero_point = compute_dynamic_scales_and_zp(x, quant_args, module, global_scale=scaled)
        q = fake_quantize(x, scale, zero_point, quant_args, global_scale=scaled)
        return (q.to(x.dtype),) + tuple(inputs[1:])
    return hook


def fake_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x rounded through float8_e4m3fn with `scale` (broadcast), back in x's dtype."""
    q = (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return (q.float() * scale).to(x.dtype)


def dynamic_fp8(x: torch.Tensor, act: ActivationQuant) -> torch.Tensor:
    """What a runtime computes for dynamic FP8 inputs: a scale per token (or per group of a token's columns)
    from its absmax, the values rounded through float8_e4m3fn."""
    if act.granularity is Granularity.GROUP and x.shape[-1] % act.group == 0:
        grouped = x.reshape(*x.shape[:-1], x.shape[-1] // act.group, act.group)
        scale = (grouped.abs().amax(dim=-1, keepdim=True).float() / FP8_MAX).clamp_min(torch.finfo(torch.float32).tiny)
        return fake_fp8(grouped, scale).reshape(x.shape)
    absmax = x.abs().amax(dim=-1, keepdim=True) if act.granularity is Granularity.PER_TOKEN else x.abs().amax()
    return fake_fp8(x, (absmax.float() / FP8_MAX).clamp_min(torch.finfo(torch.float32).tiny))
