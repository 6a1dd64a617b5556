"""Q266 (and Q411 where transformers would load them per expert): MoE experts a checkpoint stores fused in 3-D
tensors, which no rule selects, said at check for every output format instead of being silently left
unquantized (the folder's and the GGUF's checks call it)."""

from __future__ import annotations

from compiler.diagnostics import Diagnostics
from compiler.ir.types import EmitFormat, RecipeIR
from compiler.models import expert_slices
from compiler.resolve.assignment import Assignment


def warn_fused_experts(ir: RecipeIR, assignment: Assignment, diags: Diagnostics) -> None:
    """Q266: the fused experts stay as they are (float; an MXFP4 source's in a GGUF, MXFP4). Q411 where the family
    is loaded per expert and the fused tensors are not the layout qrc splits (the folder would not load)."""
    fused = assignment.model.fused_experts
    if not fused:
        return
    if expert_slices.loaded_per_expert(assignment.model.family):  # not the layout expert_slices splits
        diags.error("Q411", f"`{fused[0]}`: {assignment.model.family}'s checkpoint stores its experts fused, and "
                    "transformers opens a compressed-tensors folder of it with one Linear per expert; this tensor's "
                    "shape is not the fused layout qrc splits into them, so the folder would not load",
                    ir.model_span or ir.span, "experts loaded per expert",
                    help="the fused expert tensors must be 3-D [experts, in, out] as transformers saves them; "
                    "check the checkpoint against its config.json")
        return
    blocks = len({_moe_block(name) for name in fused})
    gguf = ir.emit is not None and ir.emit.format is EmitFormat.GGUF
    packed = bool(assignment.model.packed_experts)
    if packed and gguf:  # llama.cpp runs MXFP4: the file keeps the source's values exactly
        kept, how = "keep the source's MXFP4", "the experts are written as MXFP4, their values exactly"
    elif packed:  # transformers loads one quantization method per folder: MXFP4 cannot stay beside these layers
        kept, how = "stay float", ("the experts are decoded from the source's MXFP4 and written in the model's float "
                                   "dtype, as transformers' MXFP4 loader dequantizes them (larger on disk than the "
                                   "source); in a GGUF (`emit … { format gguf }`) they are layers of their own, which "
                                   "rules round (NVFP4 bit for bit) or leave MXFP4, for llama.cpp")
    else:
        kept, how = "stay float", ("the experts are written in the model's float type" if gguf
                                   else "the experts' bytes are copied as they are")
    diags.warning("Q266", f"{blocks} MoE blocks store their experts fused (`{fused[0]}`, …): qrc cannot quantize "
                  f"fused expert tensors yet, so they {kept}", ir.model_span or ir.span, f"experts {kept}",
                  help=f"the rest of the model is quantized as the recipe says; {how}")


def _moe_block(fused: str) -> str:
    """The MoE block a fused expert tensor belongs to: `….mlp` of `….mlp.experts.gate_up_proj` and of GraniteMoE's
    `….block_sparse_moe.input_linear.weight`."""
    owner = fused.removesuffix(".weight").rpartition(".")[0]
    return owner.removesuffix(".experts")
