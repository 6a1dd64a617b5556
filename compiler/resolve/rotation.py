"""What `transform quarot` needs of any model, whichever backend folds it, checked from the model's index alone (no
torch, no weight bytes): Q273 where the rotation would not leave the float model's outputs unchanged or where no
Hadamard matrix is built for a width it turns. Each backend adds what its outputs can take (torch/rotation_check.py,
onnx/rotation_check.py)."""

from __future__ import annotations

from compiler.diagnostics import Diagnostics
from compiler.ir.types import DataKind, OnlineRotation, RecipeIR, Transform
from compiler.models import builtin
from compiler.models.index import LayerKind, ModelIndex
from compiler.quant.rotations import hadamard_order
from compiler.resolve.rotation_widths import down_width, widths

BLOCK_NORMS = ("input_layernorm", "post_attention_layernorm")
# a block's linear layers by role, as transformers names them (onnxruntime-genai's builder writes `attn.` for
# `self_attn.`, and fuses q, k and v into one `attn.qkv_proj` unless asked not to)
BLOCK_LINEARS = ("attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.qkv_proj", "attn.o_proj", "mlp.gate_proj",
                 "mlp.up_proj", "mlp.down_proj")
# onnxruntime-genai's builder names the final norm as a block's (`model.layers.30.final_norm_layernorm`)
BUILDER_FINAL_NORM = "final_norm_layernorm"


def rotates(ir: RecipeIR) -> bool:
    """Whether the recipe's transform is a rotation."""
    return ir.transform is not None and ir.transform.kind.rotates


def turns_online(ir: RecipeIR) -> bool:
    """Whether the runtime turns the down projections' inputs as it runs (`online r4`: QuaRot's, SpinQuant's, or
    after SmoothQuant's fold)."""
    return ir.transform is not None and OnlineRotation.R4 in ir.transform.online


def online_only(ir: RecipeIR) -> bool:
    """`transform smoothquant { online r4 }`: R4 alone, applied after the smoothing folds (no R1 or R2)."""
    return turns_online(ir) and not rotates(ir)


def check_online_only(ir: RecipeIR, index: ModelIndex, diags: Diagnostics) -> bool:
    """Q273 where R4 alone cannot turn this model's down projections: none found, or no Hadamard matrix of their
    input width; whether it can."""
    assert ir.transform is not None
    span, name = ir.transform.span_of("online") or ir.transform.span, ir.transform.kind.name
    width = down_width(index)
    if width is None:
        diags.error("Q273", f"`transform {name} {{ online r4 }}` turns each `mlp.down_proj`'s input, and this model "
                    "has none", span, "nothing to turn", help="drop `online r4`")
        return False
    if hadamard_order(width) is None:
        diags.error("Q273", f"`online r4`: no Hadamard matrix of order {width} (the down projection's input width) "
                    "is built here", span, "no Hadamard of that order",
                    help="orders 2^k times up to two Paley orders (12, 20, 24, 28, 44, …) are built; drop `online r4`")
        return False
    if ir.mixed_precision is not None:
        diags.error("Q273", "`online r4` with `mixed_precision`: the search's cached scores are of the unrotated "
                    "down projections", span, "not with a search", help="remove one of the two")
        return False
    return True


def role(name: str, block: str | None) -> str:
    """A block's layer by its role (`attn.q_proj`, `mlp.down_proj`): its name within the block, `self_attn.` read
    as `attn.`."""
    leaf = name.removeprefix(f"{block}.") if block else name
    return leaf.removeprefix("self_")


def final_norms(index: ModelIndex) -> list:
    """The norms before the LM head: outside the blocks, or the builder's final norm."""
    return [n for n in index.norms if n.block is None or n.name.endswith(BUILDER_FINAL_NORM)]


def model_problem(index: ModelIndex) -> str:
    """Why the rotation would change this model's outputs ('' when it would not)."""
    if index.family.startswith("gemma"):
        return "Gemma's norms weigh by 1 + γ and follow attention and MLP"
    for norm in index.norms:
        if norm.bias is not None:
            return f"`{norm.name}` has a bias (a LayerNorm): the rotation commutes with RMSNorm only"
    finals = final_norms(index)
    if len(finals) != 1 or not finals[0].name.endswith((".norm", BUILDER_FINAL_NORM)):
        return "it has no single final norm before the LM head"
    for norm in index.norms:
        if norm is not finals[0] and not norm.name.endswith(BLOCK_NORMS):
            return f"`{norm.name}` is a norm the rotation does not fold (input_layernorm and " \
                "post_attention_layernorm only)"
    for layer in index.layers:
        if layer.block and layer.kind is LayerKind.LINEAR and role(layer.name, layer.block) not in BLOCK_LINEARS:
            return f"`{layer.name}` is no q/k/v/o or gate/up/down projection"
    return ""


def check_model_and_widths(ir: RecipeIR, index: ModelIndex, diags: Diagnostics) -> bool:
    """Q273 where the model does not commute with the rotation, or a width it turns has no Hadamard matrix (or is
    not a multiple of `block`); whether it can be rotated."""
    assert ir.transform is not None
    span, name = ir.transform.span, ir.transform.kind.name
    problem = model_problem(index)
    if problem:
        diags.error("Q273", f"`transform {name}` cannot rotate this model: {problem}", span, "no rotation here",
                    help="rotations fold into Llama-family decoders (RMSNorm before attention and MLP): Llama, "
                    "Mistral, Qwen2, Qwen3, SmolLM")
        return False
    hidden, head_dim = widths(index)
    online = down_width(index) if OnlineRotation.R4 in ir.transform.online else None
    block = ir.transform.block
    ok = True
    if block is not None:
        for what, width in (("hidden", hidden), ("down projection's input", online)):
            if width is not None and width % block:
                ok = False
                diags.error("Q273", f"`block {block}` does not divide the {what} width {width}",
                            ir.transform.span_of("block") or span, "not a divisor",
                            help="a block that divides every rotated width: the FP4 group (16) or the int group")
        hidden, online = block, (block if online is not None else None)
    for what, width in (("hidden" if block is None else "block", hidden), ("head", head_dim),
                        ("down projection's input" if block is None else "block", online)):
        if width is not None and hadamard_order(width) is None:
            ok = False
            diags.error("Q273", f"`transform {name}`: no Hadamard matrix of order {width} (the {what} width) is "
                        "built here", span, "no Hadamard of that order",
                        help="orders 2^k times up to two Paley orders (12, 20, 24, 28, 44, …) are built")
    return ok


def rotation_to_check(ir: RecipeIR, index: ModelIndex, diags: Diagnostics) -> Transform | None:
    """The recipe's rotation, once what every backend needs of it holds (else None: no rotation, or Q273 said
    why): the model and its widths (`check_model_and_widths`), and no search beside it (its cached scores are of
    the unrotated weights). Each backend's own checks follow."""
    if not rotates(ir) or ir.transform is None or not check_model_and_widths(ir, index, diags):
        return None
    if ir.mixed_precision is not None:
        diags.error("Q273", f"`transform {ir.transform.kind.name}` with `mixed_precision`: the search's cached "
                    "scores are of the unrotated weights", ir.transform.span, "not with a search",
                    help="remove one of the two")
    if ir.transform.kind.learns:
        _check_learning(ir, diags)
    return ir.transform


def _check_learning(ir: RecipeIR, diags: Diagnostics) -> None:
    """A learned rotation lowers the next-token loss of a transformers model on real calibration text: Q273 on
    synthetic (random) tokens, which would teach it nothing, and on a built-in model (qrc's own module code)."""
    assert ir.transform is not None
    name = ir.transform.kind.name
    if ir.calibration.data.kind is DataKind.SYNTHETIC:
        diags.error("Q273", f"`transform {name}` learns its rotations from calibration text, and the calibration "
                    "data is synthetic (random tokens)", ir.calibration.span_of("data") or ir.transform.span,
                    "nothing to learn from", help='calibrate on text: `calibrate { data text "calib.txt" }` '
                    "(or a dataset, or an npz of token ids); `transform quarot` needs no data")
    if ir.model.startswith(builtin.PREFIX):
        diags.error("Q273", f"`transform {name}` learns on a transformers model; `{ir.model}` runs in qrc's own "
                    "module code", ir.model_span or ir.transform.span, "not a transformers model",
                    help="use a model folder (config.json and safetensors) or a GGUF file; `transform quarot` "
                    "rotates a built-in")
