"""Where the torch backend's outputs run (compiler/ir/runtimes.py): a compressed-tensors folder in transformers and
vLLM, a GGUF file in llama.cpp and in transformers' GGUF loader. Torch-free: `qrc check` fills the table from the
schemes and the model's dtype, reading no weights.

What each claim rests on: transformers on the CPU and llama.cpp on the CPU are run by tests/test_runtimes.py over
the same table (docs/runtimes.md); vLLM's CPU build by bench/runtimes.py (its own venv; bench/results/runtimes.md
records what ran, with versions); GPUs by the runtimes' rules as qrc restates them (vllm_rules.py), not run here."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from compiler.backends.torch.gguf_types import GgufType, gguf_type
from compiler.backends.torch.quant_args import DECOMPRESSED_TO_BFLOAT16, input_args, weight_args, weight_format
from compiler.backends.torch.vllm_rules import VllmRejects, vllm_scheme
from compiler.ir.runtimes import Device, Evidence, Runtime, RuntimeCell
from compiler.ir.types import Granularity, Scheme
from compiler.models.families import ENCODERS
from compiler.models.index import ROUTER_OP
from compiler.resolve.assignment import Assignment

# vLLM 0.32.0's CPU build: the scheme classes it has CPU kernels for, as bench/runtimes.py ran them
# (bench/results/runtimes.md). WNA16 runs 4-bit weights only ("Failed to find a kernel that can implement the
# WNA16 linear layer" for 8-bit); FP8 inputs only where they are rounded at run time (static FP8 inputs call
# `static_scaled_fp8_quant`, which its CPU ops lack); the FP4 and microscaling classes find no CPU kernel.
VLLM_CPU_SCHEMES = ("CompressedTensorsW8A8Int8 (static)", "CompressedTensorsW8A8Int8 (dynamic)",
                    "CompressedTensorsW8A8Fp8 (dynamic)", "CompressedTensorsWNA16 (4-bit)")
# What a GPU needs for the classes that ask more than any CUDA GPU (vLLM 0.32.0's `get_min_capability`)
VLLM_GPU_NEEDS = {"CompressedTensorsW4A8Fp8": "Hopper (capability 9.0) only",
                  "CompressedTensorsW4A4Fp4": "FP4 kernels on Blackwell (capability 10.0)",
                  "CompressedTensorsW8A8Fp8": "FP8 kernels from Ada (8.9); W8A16Fp8 on older GPUs"}


def folder_runtimes(assignment: Assignment) -> tuple[RuntimeCell, ...]:
    """A compressed-tensors folder of `assignment`'s schemes, in transformers and vLLM on each device."""
    if assignment.model.ref.startswith("builtin:"):
        why = "a built-in model's folder runs in qrc's own module code, not a transformers class"
        return tuple(RuntimeCell(r, d, False, why, Evidence.RULES) for r in (Runtime.TRANSFORMERS, Runtime.VLLM)
                     for d in Device)
    schemes = folder_schemes(assignment)
    dtype = transformers_dtype(assignment, schemes)
    zero_points = next((name for name, s in schemes.items() if packs_zero_points(s)), None)
    if zero_points is not None:
        how = (f"only with `dequantize=True`: `{zero_points}` packs zero points (asymmetric pack-quantized), which "
               "compressed-tensors 0.20.1 builds unpacked, so the default load stops at a size mismatch")
        transformers = (RuntimeCell(Runtime.TRANSFORMERS, Device.CPU, True, how, Evidence.TESTED),
                        RuntimeCell(Runtime.TRANSFORMERS, Device.GPU, True, how, Evidence.RULES))
    else:
        transformers = (RuntimeCell(Runtime.TRANSFORMERS, Device.CPU, True, f"default load, {dtype}", Evidence.TESTED),
                        RuntimeCell(Runtime.TRANSFORMERS, Device.GPU, True,
                                    f"compressed-tensors decompresses on load, {dtype}", Evidence.RULES))
    cpu = _vllm(schemes, Device.CPU)
    if cpu.evidence is Evidence.BENCH and not _like_the_bench(assignment):
        cpu = replace(cpu, how=f"{cpu.how} (bench/runtimes.py ran dense decoders only)", evidence=Evidence.RULES)
    return (*transformers, cpu, _vllm(schemes, Device.GPU))


def _like_the_bench(assignment: Assignment) -> bool:
    """A dense text decoder, as bench/runtimes.py's Llama is: no routed experts, no vision tower, no encoder (vLLM
    runs those through other layers: its MoE kernels, its pooling models), so its CPU claims are that bench's."""
    names = [layer.name for layer in assignment.model.layers]
    return (assignment.model.family not in ENCODERS
            and not any(layer.op == ROUTER_OP for layer in assignment.model.layers)
            and not any(part in name for name in names for part in ("vision", "visual", "mm_projector")))


def packs_zero_points(scheme: Scheme) -> bool:
    """Asymmetric integer weights per channel or in groups, written `pack-quantized`: compressed-tensors packs their
    zero points eight to an int32 along the rows (its PACK_ZP_STRATS), as vLLM reads them; its own meta
    initialization (what transformers' default load builds) leaves them unpacked, so transformers 5.24 with
    compressed-tensors 0.20.1 loads the folder only with `dequantize=True` (tests/test_runtimes.py)."""
    w = scheme.quantized_weights
    return (not w.symmetric and not w.qtype.is_float and weight_format(scheme) == "pack-quantized"
            and w.granularity in (Granularity.GROUP, Granularity.PER_CHANNEL))


def gguf_runtimes(assignment: Assignment) -> tuple[RuntimeCell, ...]:
    """A GGUF file: llama.cpp runs every type qrc writes (Q4_0, Q8_0, the K-quants, MXFP4, NVFP4) on CPU and on its
    CUDA build; transformers' GGUF loader dequantizes it to float, except NVFP4's, whose per-tensor `.scale`
    tensors it has no place for (transformers 5.25 stops at load), and gpt-oss's, whose YaRN keys it cannot read."""
    llama_cpp = (RuntimeCell(Runtime.LLAMA_CPP, Device.CPU, True, "llama-cpp-python, every GGUF type qrc writes",
                             Evidence.TESTED),
                 RuntimeCell(Runtime.LLAMA_CPP, Device.GPU, True, "its CUDA build has kernels for the same types",
                             Evidence.RULES))
    if assignment.model.family == "gpt_oss":  # the RoPE scaling keys its converter and qrc write (gguf_metadata.py)
        why = "its GGUF loader fails reading gpt-oss's YaRN keys (5.25: a TypeError at `rope.scaling.factor`)"
    elif any(gguf_type(a.scheme) is GgufType.NVFP4 for a in assignment.layers):
        why = "its GGUF loader has no place for NVFP4's per-tensor `.scale` tensors (it stops at load)"
    else:
        why = ""
    if why:
        return (*llama_cpp, RuntimeCell(Runtime.TRANSFORMERS, Device.CPU, False, why, Evidence.TESTED),
                RuntimeCell(Runtime.TRANSFORMERS, Device.GPU, False, why, Evidence.RULES))
    return (*llama_cpp,
            RuntimeCell(Runtime.TRANSFORMERS, Device.CPU, True, "`gguf_file=`: dequantized to float32",
                        Evidence.TESTED),
            RuntimeCell(Runtime.TRANSFORMERS, Device.GPU, True, "`gguf_file=`: dequantized to float", Evidence.RULES))


def transformers_dtype(assignment: Assignment, schemes: dict[str, Scheme]) -> str:
    """The dtype transformers' default load runs the folder in: the model's, except FP4 or MX weights of a float32
    model, which compressed-tensors decompresses to bfloat16 (the folder's config says bfloat16:
    output_layout.py)."""
    dtypes = Counter(layer.dtype for layer in assignment.model.layers if layer.dtype in ("float32", "float16", "bfloat16"))
    dtype = dtypes.most_common(1)[0][0] if dtypes else "float32"  # ties: the first layer's
    if dtype == "float32" and any(s.quantized_weights.qtype in DECOMPRESSED_TO_BFLOAT16 for s in schemes.values()):
        return "bfloat16"
    return dtype


def folder_schemes(assignment: Assignment) -> dict[str, Scheme]:
    """The folder's quantized schemes by name, each a config group (K-quants are GGUF's own: Q411 here). The
    last assignment's are kept: `check` asks three times (a pass over every layer: DeepSeek-V3 has 45,033), and
    an assignment is frozen, so the same object has the same schemes."""
    last = _LAST.get("schemes")
    if last is not None and last[0] is assignment:
        return dict(last[1])
    found = {a.scheme.name: a.scheme for a in assignment.layers
             if not a.scheme.is_none and not a.scheme.quantized_weights.qtype.is_kquant}
    _LAST["schemes"] = (assignment, found)
    return dict(found)


_LAST: dict[str, tuple[Assignment, dict[str, Scheme]]] = {}


def vllm_class(scheme: Scheme) -> str:
    """The vLLM scheme class a scheme's config group gets (raises VllmRejects where vLLM refuses it); WNA16 with
    its width and W8A8Fp8 with how its inputs are rounded, which decide the CPU kernel."""
    act = scheme.activations
    group = {"weights": weight_args(scheme.quantized_weights, scheme.rounding), "format": weight_format(scheme),
             "input_activations": input_args(act) if act is not None else None}
    found = vllm_scheme({"config_groups": {scheme.name: group}, "format": group["format"]}, scheme.name)
    if found == "CompressedTensorsWNA16":
        return f"{found} ({scheme.quantized_weights.qtype.bits}-bit)"
    if found == "CompressedTensorsW8A8Fp8" and act is not None:
        return f"{found} ({act.mode.value})"
    return found


def _vllm(schemes: dict[str, Scheme], device: Device) -> RuntimeCell:
    """vLLM on `device`: runs when every scheme gets a class with a kernel there; else the first that does not."""
    classes = []
    for name, scheme in schemes.items():
        try:
            found = vllm_class(scheme)
        except VllmRejects as exc:
            return RuntimeCell(Runtime.VLLM, device, False, f"its loader refuses `{name}`: "
                               f"{str(exc).removeprefix(name + ': ')}", Evidence.RULES)
        if device is Device.CPU and found not in VLLM_CPU_SCHEMES:
            return RuntimeCell(Runtime.VLLM, device, False, f"no CPU kernel for `{name}` ({_short(found)})",
                               Evidence.BENCH)
        classes.append(found)
    shown = ", ".join(dict.fromkeys(_short(c) for c in classes)) or "float"
    needs = list(dict.fromkeys(VLLM_GPU_NEEDS[c.split(" (")[0]] for c in classes if c.split(" (")[0] in VLLM_GPU_NEEDS))
    if device is Device.GPU:
        return RuntimeCell(Runtime.VLLM, device, True, shown + (f"; {'; '.join(needs)}" if needs else ""),
                           Evidence.RULES)
    return RuntimeCell(Runtime.VLLM, device, True, shown + ", bfloat16", Evidence.BENCH)


def _short(name: str) -> str:
    return name.removeprefix("CompressedTensors")
