"""What the torch backend cannot do, found by `qrc check` at the recipe text that asks for it (every
searched choice included), so `compile` never starts work it would refuse."""

from __future__ import annotations

from typing import Protocol, cast

from compiler.backends.torch.formats import DEFAULT, TORCH_FORMATS
from compiler.backends.torch.fused_experts_check import warn_fused_experts
from compiler.backends.torch.rotation_check import check_rotation, online_cells
from compiler.backends.torch.runtimes import folder_schemes, packs_zero_points, vllm_class
from compiler.backends.torch.vllm_rules import VllmRejects
from compiler.diagnostics import Diagnostics
from compiler.ir.checks import refuse_attention_kernel
from compiler.ir.runtimes import RuntimeCell
from compiler.ir.types import ActivationMode, Granularity, QType, RecipeIR
from compiler.models.index import ROUTER_OP, LayerKind, ModelFormat
from compiler.models.names import attention_modules
from compiler.resolve.assignment import Assignment
from compiler.resolve.choices import each_choice
from compiler.resolve.groups import auto_gate_up_instances, auto_qkv_instances


def check_recipe(ir: RecipeIR, diags: Diagnostics) -> None:
    """The torch backend's check of the recipe alone: a built-in model has its own attention (Q270); float zero
    points, which none of its outputs stores (Q277)."""
    if ir.model.startswith("builtin:"):
        refuse_attention_kernel(ir, diags, "a built-in model")
    for scheme in ir.used_schemes:
        if scheme.rounding.float_zero_points:
            diags.error("Q277", f"scheme `{scheme.name}` rounds with `{scheme.rounding.name}`, whose zero points are "
                        "floats; the torch backend writes compressed-tensors folders and GGUF files, which hold "
                        "integer zero points", scheme.span or ir.span, "float zero points",
                        help="use `rounding mse` or `rounding gptq` here, or `backend onnx` with "
                        "`emit { format matmul_nbits }` for hqq")


class FormatChecks(Protocol):
    """What a registered output format (formats.py) provides to `qrc check`."""

    name: str
    emit_example: str  # the `emit` that writes it, for a diagnostic that points a user at the format

    def check(self, ir: RecipeIR, assignment: Assignment, diags: Diagnostics) -> None:
        """What the format refuses of the resolved recipe."""
        ...

    def runtimes(self, assignment: Assignment) -> tuple[RuntimeCell, ...]:
        """Where the output runs (compiler/ir/runtimes.py); optional: a plug-in format without it says nothing."""
        ...

    def keeps_own(self, qtype: QType) -> bool:
        """Whether `qtype` is a weight type only this format stores (GGUF's K-quants): another format refusing it
        names this one."""
        ...


def _checks(name: str) -> FormatChecks | None:
    return cast(FormatChecks | None, TORCH_FORMATS.get(name))


def runtime_table(ir: RecipeIR, assignment: Assignment) -> tuple[RuntimeCell, ...]:
    """Where the recipe's output runs: its format's table (none for a format the backend does not write)."""
    fmt = _checks(ir.emit.format.name if ir.emit is not None else DEFAULT)
    runtimes = getattr(fmt, "runtimes", None)  # a plug-in's format may say nothing of where it runs
    return () if runtimes is None else online_cells(ir, runtimes(assignment))


def check_supported(ir: RecipeIR, assignment: Assignment, diags: Diagnostics) -> None:
    """Q411 for an output format the backend does not write, else the format's own checks (formats.py); what a
    rotation needs (Q273, rotation_check.py); learned rounding outside the blocks (Q274)."""
    check_rotation(ir, assignment, diags)
    _refuse_learned_outside_blocks(ir, assignment, diags)
    _warn_learned_batch(ir, diags)
    fmt = _checks(ir.emit.format.name if ir.emit is not None else DEFAULT)
    if fmt is None:
        assert ir.emit is not None  # the default format is registered
        diags.error("Q411", f"the torch backend writes {' or '.join(TORCH_FORMATS.names())}, not "
                    f"{ir.emit.format.name}", ir.emit.span_of("format") or ir.emit.span_of("path"), "not supported",
                    help="use `emit \"FOLDER\" { format safetensors }`, or `backend onnx` for ONNX output")
        return
    fmt.check(ir, assignment, diags)


def _refuse_learned_outside_blocks(ir: RecipeIR, assignment: Assignment, diags: Diagnostics) -> None:
    """Q274: `rounding autoround` learns against a block's float outputs, so each of its layers must be inside one
    of the model's blocks (a head or an embedding has none), under every searched choice."""
    outside: dict[str, list[str]] = {}
    for candidate in each_choice(ir, assignment):
        for a in candidate.layers:
            if a.scheme.learned is not None and not a.layer.block and a.layer.name not in outside.get(a.scheme.name, []):
                outside.setdefault(a.scheme.name, []).append(a.layer.name)
    for name, layers in outside.items():
        scheme = ir.scheme(name)
        shown = ", ".join(f"`{n}`" for n in layers[:3]) + (f" and {len(layers) - 3} more" if len(layers) > 3 else "")
        diags.error("Q274", f"scheme `{name}` learns its rounding per block, but {shown} "
                    f"{'is' if len(layers) == 1 else 'are'} outside the model's blocks",
                    scheme.span or ir.span, "no block to learn against",
                    help=f"give {layers[0]} another scheme (e.g. `\"{layers[0]}\" -> none`, or one with `rounding gptq`)")


def _warn_learned_batch(ir: RecipeIR, diags: Diagnostics) -> None:
    """Q278: a learned-rounding step draws its samples from one calibration chunk (torch/learned.py), so a `batch`
    above the chunk runs steps of the chunk's size."""
    if ir.calibration is None:
        return
    chunk, samples = ir.calibration.chunk, ir.calibration.data.samples
    for scheme in ir.used_schemes:
        learned = scheme.learned
        # fewer samples than a batch: every step runs all of them, as asked
        if learned is None or learned.step_samples(chunk, samples) >= min(learned.batch, samples):
            continue
        diags.warning("Q278", f"scheme `{scheme.name}` asks {learned.batch} samples a learned-rounding step, but a "
                      f"step draws them from one calibration chunk of {chunk}", scheme.span or ir.span,
                      f"each step runs {chunk}",
                      help=f"raise `calibrate {{ chunk {learned.batch} }}` (the memory plan counts the larger step), "
                      f"or write `batch {chunk}`")


def check_compressed_tensors(ir: RecipeIR, assignment: Assignment, diags: Diagnostics) -> None:
    """Q411 for each layer × scheme compressed-tensors cannot store, and the warnings about what vLLM and
    transformers will make of the folder (the safetensors format's checks)."""
    _warn_routers(ir, assignment, diags)
    warn_fused_experts(ir, assignment, diags)
    _warn_vllm(assignment, diags)
    _packed_zero_points(ir, assignment, diags)
    _warn_split_siblings(ir, assignment, diags)
    if ir.kv_cache is not None and assignment.model.format is not ModelFormat.HF:
        diags.error("Q411", "`kv_cache` needs a transformers decoder (an HF folder): built-in and ONNX models keep no "
                    "cache qrc can observe", ir.kv_cache.span, "no KV cache here", help="remove `kv_cache`")
    elif ir.kv_cache is not None and not attention_modules([layer.name for layer in assignment.model.layers]):
        diags.error("Q411", "`kv_cache` needs attention modules with `k_proj` and `v_proj` (a decoder's KV cache)",
                    ir.kv_cache.span, "no KV cache here", help="remove `kv_cache`: this model has no such attention")
    seen: set[tuple[str, str]] = set()
    found: dict[tuple, str | None] = {}  # what _problem reads of a layer, by scheme: 45,033 layers, a few kinds
    for candidate in each_choice(ir, assignment):
        for a in candidate.layers:
            if a.scheme.is_none:
                continue
            key = (id(a.scheme), a.layer.op, a.layer.kind, a.layer.in_features)
            problem = found[key] if key in found else found.setdefault(key, _problem(a))
            if problem and (a.layer.name, a.scheme.name) not in seen:
                seen.add((a.layer.name, a.scheme.name))
                diags.error("Q411", f"`{a.layer.name}` with scheme `{a.scheme.name}`: {problem}",
                            a.rule.span if a.rule else a.scheme.span, "not supported on torch",
                            help="give the layer `-> none` or another scheme, or use `backend onnx`")


def _warn_vllm(assignment: Assignment, diags: Diagnostics) -> None:
    """Q267: a scheme vLLM's loader has no kernel scheme for (vllm_rules.py): the folder loads in transformers,
    and vLLM refuses it."""
    for name, scheme in folder_schemes(assignment).items():
        try:
            vllm_class(scheme)
        except VllmRejects as exc:
            diags.warning("Q267", f"vLLM will not load scheme `{name}`: {str(exc).removeprefix(name + ': ')}",
                          scheme.span, "not served by vLLM",
                          help="transformers loads the folder; for vLLM pick a scheme it serves (W4A16, W8A8, "
                          "FP8_DYNAMIC, FP8, FP8_BLOCK, NVFP4A16)")


def _packed_zero_points(ir: RecipeIR, assignment: Assignment, diags: Diagnostics) -> None:
    """Q276: asymmetric pack-quantized schemes, whose folder transformers' default load refuses with
    compressed-tensors 0.20.1 (runtimes.packs_zero_points; vLLM loads it, and transformers with `dequantize=True`).
    An error where `verify` would run the folder as that load builds it, after all the work; a warning otherwise."""
    if assignment.model.format is not ModelFormat.HF:
        return
    for name, scheme in folder_schemes(assignment).items():
        if not packs_zero_points(scheme):
            continue
        message = (f"scheme `{name}` is asymmetric and pack-quantized: compressed-tensors packs its zero points, and "
                   "transformers' default load (with compressed-tensors 0.20.1) stops at a size mismatch; only "
                   "`dequantize=True` loads the folder there")
        fix = "make it `symmetric` (vLLM and transformers' default load run both), or keep it for vLLM"
        if ir.verify is not None:
            diags.error("Q276", message + "; `verify` runs the folder as the default load builds it", scheme.span,
                        "transformers' default load refuses it", help=fix + " and remove `verify`")
        else:
            diags.warning("Q276", message, scheme.span, "transformers' default load refuses it", help=fix)


def _warn_split_siblings(ir: RecipeIR, assignment: Assignment, diags: Diagnostics) -> None:
    """Q258: layers a runtime fuses into one GEMM (q/k/v; gate/up of an MLP or an expert) at different schemes.
    vLLM loads such siblings as one layer with one scheme and refuses a folder where they differ."""
    schemes = {a.layer.name: a for a in assignment.layers}
    names = list(schemes)
    split = [i for i in auto_qkv_instances(names) + auto_gate_up_instances(names)
             if len({schemes[m].scheme.name for m in i.members}) > 1]
    if split:
        first = split[0]
        listed = ", ".join(f"`{m.rpartition('.')[2]}` {schemes[m].scheme.name}" for m in first.members)
        diags.warning("Q258", f"{len(split)} groups of fused siblings mix schemes (e.g. `{first.name}`: {listed})",
                      next((rule.span for m in first.members if (rule := schemes[m].rule) is not None), ir.span),
                      "siblings differ", help="vLLM fuses them into one layer with one scheme and will not load the "
                      "folder; add `group auto` (the widest member's scheme wins), or give them one scheme")


def _warn_routers(ir: RecipeIR, assignment: Assignment, diags: Diagnostics) -> None:
    """Q247: a rule quantizes MoE routers (`mlp.gate`): their logits pick the experts, and serving
    stacks keep them in float."""
    routers = [a for a in assignment.layers if not a.scheme.is_none and a.layer.op == ROUTER_OP]
    if routers:
        a = routers[0]
        diags.warning("Q247", f"{len(routers)} MoE routers are quantized (e.g. `{a.layer.name}` with `{a.scheme.name}`)",
                      a.rule.span if a.rule else ir.span, "router quantized",
                      help='routers choose the experts; keep them in float: `re".*\\.(mlp|block_sparse_moe)\\.gate" -> none`')


def _problem(a) -> str | None:
    """Why the torch backend cannot store `a`'s layer with its scheme, or None. Reads the scheme and the layer's
    op, kind and input width only (check_compressed_tensors keeps its answers by those)."""
    w, act, layer = a.scheme.quantized_weights, a.scheme.activations, a.layer
    if layer.op == "Conv1D":
        return "transformers' Conv1D (GPT-2 style) stores its weight transposed, [in, out]; qrc does not quantize it yet"
    if layer.kind is not LayerKind.LINEAR:
        return f"the torch backend quantizes Linear layers (compressed-tensors); this is {layer.kind.value}"
    own = next((f for f in map(_checks, TORCH_FORMATS.names()) if f is not None and f.keeps_own(w.qtype)), None)
    if own is not None:
        return f"{w.qtype.name} is a {own.name.upper()} format; write it with {own.emit_example}"
    if not w.qtype.signed:
        return f"compressed-tensors stores signed integers; use {w.qtype.name.removeprefix('u')} (asymmetric) instead"
    if w.group_size and layer.in_features % w.group_size:
        return f"group {w.group_size} does not divide its {layer.in_features} input features"
    if act is not None and not act.qtype.signed:
        return "activations must be signed (int8)"
    if act is not None and act.mode is ActivationMode.STATIC and act.granularity is Granularity.PER_TOKEN:
        return "per-token activations are dynamic by nature; write `activations int8 per_token dynamic`"
    if act is not None and act.mode is ActivationMode.DYNAMIC and not act.symmetric:
        return "dynamic activations are symmetric in compressed-tensors"
    return None
