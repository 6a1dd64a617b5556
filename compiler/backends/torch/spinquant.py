"""SpinQuant's learned rotations (`transform spinquant`, docs/torch.md, Rotations): R1 and each layer's R2 start
from QuaRot's random Hadamards (rotation.py, the same seeds) and are moved by Cayley SGD on the calibration text,
minimising the next-token loss of the model as the recipe quantizes it: each quantized Linear's weight rounded by
its scheme (round to nearest) and its inputs by the scheme's input quantizer, both passed straight through to the
gradient. One calibration sample in HELD_OUT is kept out of the steps: the rotation kept is the one of the lowest
loss on those, checked VALIDATIONS times over the run and at its start (on the real SmolLM2, 100 steps of one sample
from no rotation lowered the loss they ran and raised held-out perplexity from +69.9% to +106.5%: bench/README.md).
Then it is folded into the weights exactly as QuaRot's are (a `Rotation` with a dense Q and one H per layer), so
the float model still computes the same.

Each step forms every rotated weight afresh (W·Q, Qᵀ·W, the heads' H), rounds it, and runs `batch` calibration
samples; the gradient reaches Q and the H's only. Cayley SGD (Li et al., 2020, as SpinQuant uses it) keeps them
orthogonal: with G the gradient of R, A = G·Rᵀ − R·Gᵀ (skew-symmetric) and R ← (I + α/2·A)⁻¹(I − α/2·A)·R, a
rotation again for any step α; α is the learning rate decaying linearly to 0, at most 1/‖A‖ (the optimizer's own
bound, which keeps a large gradient from overshooting). The embeddings are rotated as they are looked up (only the
batch's rows), and a head left float reads the stream turned back by Qᵀ, so neither vocabulary-wide product is
formed in a step. Static input ranges are not calibrated yet while this learns: their inputs are rounded with a
range of their own per step (dynamic, per tensor), the closest thing the step can compute.

Written here rather than taken from SpinQuant's code: that trains a patched model class per family on GPUs, where
qrc's plan owns the model, the data and the memory; the arithmetic is the paper's (Liu et al., 2024)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from compiler.backends import BackendError
from compiler.backends.torch import float_formats
from compiler.backends.torch.layers import dynamic_integer
from compiler.backends.torch.learned import step_precision
from compiler.backends.torch.learning_schedule import HELD_OUT, VALIDATIONS
from compiler.backends.torch.quant_args import input_args
from compiler.backends.torch.rotation import (
    Dense,
    Kronecker,
    Rotation,
    RotationRefused,
    attach_online,
    decoder_of,
    refuse_other_norms,
)
from compiler.diagnostics import error
from compiler.ir.types import ActivationQuant, QType, RotationStart, Rounding, Scheme
from compiler.quant.weights import Convention, quantize_weight

READERS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
WRITERS = ("self_attn.o_proj", "mlp.down_proj")
NORM_OF = {"self_attn": "input_layernorm", "mlp": "post_attention_layernorm"}


@dataclass(frozen=True)
class Learned:
    """What the learning found and what it cost: the rotation to fold (dense Q, one H per layer), the loss on the
    held-out calibration samples with the rotation it started from and with the one kept, the steps and their
    seconds."""

    rotation: Rotation
    first_loss: float  # the quantized model's next-token loss on the held-out calibration samples, at the start
    kept_loss: float  # the same samples, the rotation kept
    steps: int
    seconds: float
    started: str = "QuaRot's rotation"  # the start, in words
    kept_step: int = 0  # after which step the rotation kept was taken (0: the start's)
    held_out: int = 0  # calibration samples the steps never ran, which chose it

    def words(self) -> str:
        """What the learning cost and bought (the summary's transform line)."""
        return (f"learned in {self.steps} Cayley SGD steps ({self.seconds:.1f} s): the quantized model's next-token "
                f"loss on {self.held_out} held-out calibration sample(s) {self.first_loss:.4f} with {self.started}, "
                f"{self.kept_loss:.4f} with the rotation kept (after step {self.kept_step})")


def learn_from_calibration(op, assignment, spans, advance: Callable[[], None]) -> Learned:
    """`learn_rotation` (a LearnRotation op): the float model opened whole, learned on the op's calibration samples
    for the assignment's schemes, then dropped (the caller frees its memory)."""
    from compiler import data
    from compiler.backends.torch.layers import jobs_of
    from compiler.backends.torch.model import open_model

    model = open_model(op.model, assignment.model.blocks, spans.model)
    try:
        _refuse_other_shapes(model.module)
    except RotationRefused as exc:  # what the index did not show (check refuses what it does: resolve/rotation.py)
        raise BackendError(error("Q273", f"`transform spinquant` cannot learn on this model: {exc}", spans.transform,
                                 "no learned rotation here", help="use `transform quarot`, or leave the rotation "
                                 "out")) from None
    model.materialize(list(model.keys))
    schemes = {job.module: job.scheme for job in jobs_of(model, assignment)}
    hidden, head, down, block = op.rotation
    feeds = data.calibration_batches(op.calibration.data, assignment.model, op.calibration.chunk)
    return learn_rotation(model.module, Rotation.seeded(hidden, head, down=down, block=block), schemes, feeds,
                          op.iters, op.lr, op.batch, advance, identity=op.start is RotationStart.IDENTITY)


def _refuse_other_shapes(module: Any) -> None:
    """RotationRefused unless `module` is a Llama-style decoder whose blocks have the projections and RMSNorms the
    learning folds and rotates (rotation.py's own checks, and each of READERS and WRITERS a Linear)."""
    base = decoder_of(module)
    for layer in base.layers:
        refuse_other_norms(layer)
        for part in READERS + WRITERS:
            found = getattr(layer.get_submodule(part.split(".")[0]), part.split(".")[1], None)
            if not isinstance(found, nn.Linear):
                raise RotationRefused(f"its blocks have no Linear `{part}` (fused or other projections)")


def learn_rotation(module: Any, start: Rotation, schemes: dict[str, Scheme], feeds: Iterable[dict],
                   iters: int, rate: float, batch: int, advance: Callable[[], None] = lambda: None,
                   identity: bool = False) -> Learned:
    """R1 and the R2's of `module` (a Llama-family transformers causal LM, typed Any: reached by attribute; float,
    every weight resident; folded in place: its norms become ones, its head untied) learned from `start` (QuaRot's seeded rotation, widths and online R4
    included) over `iters` steps of `batch` calibration samples from `feeds` ({input_ids, attention_mask}
    chunks); `schemes`: each quantized Linear's scheme by module path. `identity`: R1 and the R2's start as the
    identity instead (`start` still gives the widths, the online R4 and the names). A block-diagonal `start`
    (`block N`) stays block-diagonal: each step turns every block of R1 within itself (its Cayley generator
    masked to the blocks), so each block learns its own rotation."""
    samples, held = _split(_samples(feeds))
    base = module.model
    folded = _fold_norms(module, start.down)
    eye = torch.eye(base.embed_tokens.weight.shape[1])
    q = nn.Parameter(eye if identity else start.q.right(eye))
    within = _block_mask(eye.shape[0], start.block) if start.block else None
    heads: list[torch.Tensor] = [nn.Parameter(torch.eye(start.h.shape[0]) if identity else start.h.clone())
                                 for _ in base.layers] if start.h is not None else []
    if start.down is not None:
        attach_online(module, start.down)
    embed = base.embed_tokens.weight.detach()
    head_float = "lm_head" not in schemes
    if head_float:  # the norm commutes with Q, so the float head (its norm folded) reads norm(h·Q)·Qᵀ = norm(h):
        # no vocabulary-wide W·Q is formed
        module.lm_head.register_forward_pre_hook(lambda _, args: (args[0] @ q.t().to(args[0].dtype),))
    for name, scheme in schemes.items():
        if scheme.activations is not None:
            module.get_submodule(name).register_forward_pre_hook(_input_quantizer(scheme.activations))
    precision = step_precision("cpu")

    def loss_on(ids: torch.Tensor, mask: torch.Tensor, weights: dict[str, torch.Tensor]) -> torch.Tensor:
        """The next-token loss of these samples through the model with these (rotated, rounded) weights."""
        with precision:
            out = torch.func.functional_call(module, weights, (), {
                "inputs_embeds": embed[ids] @ q, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100),
                "use_cache": False}, tie_weights=False, strict=False)
        return out.loss.float()

    def validation() -> float:
        """The loss on the held-out samples as rotated now, one sample at a time (no gradient)."""
        with torch.no_grad():
            weights = _rotated_weights(folded, q, heads, schemes, head_float)
            return sum(float(loss_on(held[0][k:k + 1], held[1][k:k + 1], weights)) for k in range(len(held[0]))) \
                / len(held[0])

    parameters = [q, *heads]
    kept = [p.detach().clone() for p in parameters]
    first = best = validation()
    best_step, every = 0, max(1, iters // VALIDATIONS)
    began = time.perf_counter()
    for step in range(iters):
        ids, mask = _batch(samples, step, batch)
        loss_on(ids, mask, _rotated_weights(folded, q, heads, schemes, head_float)).backward()
        alpha = rate * (1.0 - step / iters)
        with torch.no_grad():
            for r in parameters:
                if r.grad is not None:
                    r.copy_(_cayley_step(r.detach(), r.grad, alpha, within if r is q else None))
                    r.grad = None
        if (step + 1) % every == 0 or step + 1 == iters:
            value = validation()
            if value < best:  # the rotation of the lowest held-out loss so far, copied into the same buffers
                best, best_step = value, step + 1
                torch._foreach_copy_(kept, [p.detach() for p in parameters])
        advance()
    # `block` kept: the online R4's D is block-diagonal too (the folder's transform_config says so)
    rotation = Rotation(Dense(kept[0]), None, start.base, start.down, start.block,
                        tuple(kept[1:]) if heads else None)
    return Learned(rotation, first, best, iters, time.perf_counter() - began,
                   "no rotation" if identity else "QuaRot's rotation", best_step, len(held[0]))


def _split(samples: tuple[torch.Tensor, torch.Tensor]) -> tuple[tuple[torch.Tensor, torch.Tensor],
                                                                  tuple[torch.Tensor, torch.Tensor]]:
    """(the samples the steps run, the ones held out to choose the rotation kept): the last of every HELD_OUT,
    at least one; a single sample is both."""
    ids, mask = samples
    count = ids.shape[0]
    if count < 2:
        return samples, samples
    held = max(1, count // HELD_OUT)
    return (ids[:-held], mask[:-held]), (ids[-held:], mask[-held:])


def _block_mask(width: int, block: int) -> torch.Tensor:
    """1 within the diagonal blocks of order `block`, 0 between them (float64 [width, width])."""
    index = torch.arange(width) // block
    return (index[:, None] == index[None, :]).double()


def _cayley_step(r: torch.Tensor, grad: torch.Tensor, alpha: float, within: torch.Tensor | None = None) -> torch.Tensor:
    """One Cayley SGD step of the orthogonal R against its gradient: (I + a/2·A)⁻¹(I − a/2·A)·R with A = G·Rᵀ − R·Gᵀ
    and a = min(alpha, 1/‖A‖). `within`: A kept inside those blocks, so a block-diagonal R stays block-diagonal
    (the Cayley transform of a block-diagonal skew matrix is block-diagonal and orthogonal)."""
    g = grad.double()
    r64 = r.double()
    a = g @ r64.t() - r64 @ g.t()
    if within is not None:
        a = a * within
    norm = float(torch.linalg.matrix_norm(a))
    if norm == 0.0 or alpha <= 0.0:
        return r
    step = min(alpha, 1.0 / norm)
    eye = torch.eye(r.shape[0], dtype=torch.float64)
    return torch.linalg.solve(eye + step / 2 * a, (eye - step / 2 * a) @ r64).float()


def _samples(feeds: Iterable[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    """Every calibration sample's token ids and attention mask (int64 [samples, tokens])."""
    ids, masks = [], []
    for feed in feeds:
        chunk = torch.as_tensor(np.asarray(feed["input_ids"]), dtype=torch.long)
        ids.append(chunk)
        mask = feed.get("attention_mask")
        masks.append(torch.as_tensor(np.asarray(mask), dtype=torch.long) if mask is not None else torch.ones_like(chunk))
    return torch.cat(ids), torch.cat(masks)


def _batch(samples: tuple[torch.Tensor, torch.Tensor], step: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step `step`'s samples: the next `batch` in order, round and round."""
    ids, mask = samples
    rows = torch.arange(step * batch, (step + 1) * batch) % ids.shape[0]
    return ids[rows], mask[rows]


@dataclass(frozen=True)
class _Folded:
    """The float weights with each norm's γ folded into the layers it feeds (float32), by parameter name."""

    weights: dict[str, torch.Tensor]
    head_dim: int


def _fold_norms(module: Any, down: Kronecker | None) -> _Folded:
    """Each RMSNorm's weights into the Linears after it (the final norm's into the head, untied first), the norms
    made ones, in `module` itself: the learning reads the folded weights, the model runs with norms of ones (an
    online R4's D is folded into the down projections too)."""
    base = module.model
    if module.lm_head.weight is base.embed_tokens.weight:
        module.lm_head.weight = nn.Parameter(module.lm_head.weight.detach().clone())
    for parameter in module.parameters():
        parameter.requires_grad_(False)  # the gradient goes to the rotations alone
    weights: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for n, layer in enumerate(base.layers):
            for part in READERS + WRITERS:
                linear = layer.get_submodule(part)
                w = linear.weight.float()
                if part in READERS:
                    w = w * layer.get_submodule(NORM_OF[part.split(".")[0]]).weight.float()[None, :]
                elif part == "mlp.down_proj" and down is not None:  # R4's W·D, fixed (its D is not learned)
                    w = down.right(w)
                weights[f"model.layers.{n}.{part}.weight"] = w
                linear.weight = nn.Parameter(w, requires_grad=False)  # one copy: the module's is this one
            for norm in NORM_OF.values():
                layer.get_submodule(norm).weight.fill_(1.0)
        weights["lm_head.weight"] = module.lm_head.weight.float() * base.norm.weight.float()[None, :]
        module.lm_head.weight.copy_(weights["lm_head.weight"])
        base.norm.weight.fill_(1.0)
    config = module.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return _Folded(weights, head_dim)


def _rotated_weights(folded: _Folded, q: torch.Tensor, heads: list[torch.Tensor], schemes: dict[str, Scheme],
                     head_float: bool) -> dict[str, torch.Tensor]:
    """Every rotated weight of this step (readers W·Q, writers Qᵀ·W, each layer's values and output per head by
    its H; an online D is already in the down projections' weights), rounded where a scheme quantizes it."""
    out: dict[str, torch.Tensor] = {}
    for name, w in folded.weights.items():
        if name == "lm_head.weight":
            rotated = w if head_float else w @ q
        elif any(name.endswith(f"{p}.weight") for p in WRITERS):
            rotated = q.t() @ w
        else:
            rotated = w @ q
        layer = int(name.split(".")[2]) if name.startswith("model.layers.") else None
        if heads and layer is not None and name.endswith("v_proj.weight"):
            rows = rotated.reshape(-1, folded.head_dim, rotated.shape[1])
            rotated = torch.einsum("ji,kjc->kic", heads[layer], rows).reshape(rotated.shape)
        if heads and layer is not None and name.endswith("o_proj.weight"):
            rotated = (rotated.reshape(rotated.shape[0], -1, folded.head_dim) @ heads[layer]).reshape(rotated.shape)
        scheme = schemes.get(name.removesuffix(".weight"))
        out[name] = _through(rotated, _weight_rounding(scheme)) if scheme is not None else rotated
    return out


def _through(x: torch.Tensor, rounded: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """`rounded(x)`'s value with x's gradient (straight through the rounding)."""
    return x + (rounded(x.detach()) - x.detach())


def _weight_rounding(scheme: Scheme) -> Callable[[torch.Tensor], torch.Tensor]:
    """The weight as the scheme rounds it to nearest, back in float32 ([out, in])."""
    spec = scheme.quantized_weights
    if spec.qtype.is_float:
        def floating(w: torch.Tensor) -> torch.Tensor:
            rounded = float_formats.quantize_scheme(w, scheme, torch.float32).dequantized
            assert rounded is not None  # kept: rounded without `measure`
            return rounded
        return floating
    return lambda w: torch.from_numpy(quantize_weight(w.numpy(), spec, Rounding.RTN, 0, 1, Convention.TORCH)
                                      .dequantize())


def _input_quantizer(act: ActivationQuant) -> Callable:
    """A forward pre-hook rounding a Linear's input as the scheme's inputs are, straight through. NVFP4's global
    scale and static ranges are not calibrated while this learns: per tensor from the input itself."""
    if act.qtype.fixed_group:  # NVFP4, MXFP4: compressed-tensors' own dynamic block scales and rounding
        def fp4(x: torch.Tensor) -> torch.Tensor:
            absmax = float(x.abs().amax())
            scale = float_formats.nvfp4_input_global_scale(-absmax, absmax) if act.qtype is QType.NVFP4 else None
            return float_formats.fp4_input_hook(input_args(act), scale)(None, (x,))[0]
        rounded = fp4
    elif act.qtype.is_float:
        rounded = lambda x: float_formats.dynamic_fp8(x, act)  # noqa: E731
    else:  # a static range per tensor from the input itself (layers.py: what a dynamic input computes)
        rounded = lambda x: dynamic_integer(x, act)  # noqa: E731
    return lambda _, args: (_through(args[0], rounded),) + tuple(args[1:])

