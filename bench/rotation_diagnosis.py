"""Why QuaRot's rotations make 4-bit weights worse on the real SmolLM2 (bench/README.md, Rotations), measured in
memory on the float model, with qrc's own rotation (compiler/backends/torch/rotation.py) and plain round to
nearest (symmetric int4, groups of 64, the largest magnitude on the grid's negative end), nothing written:

1. the file's weights and Q4_1: they round onto Q4_1's grid (asymmetric, groups of 32) with no error, but the
   weights the rows quantize (symmetric, groups of 64) round with more error unrotated than rotated, so the grid
   does not explain the loss;
2. perplexity on held-out windows of Python's reference text, every Linear but the head rounded, unrotated and
   rotated, then one projection at a time: which layers lose;
3. the values of the attention-sink tokens (the few whose residual stream is many times the median): rotating
   folds each RMSNorm's weights into the layers after it, so the small weights that kept those tokens' inputs
   small no longer scale the rounding error of their values.

    python bench/rotation_diagnosis.py [--windows 4] [--tokens 256]"""

from __future__ import annotations

import argparse
import copy
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from real_quality import MODEL, texts, windows  # noqa: E402

PROJECTIONS = (("q_proj", "k_proj"), ("v_proj",), ("o_proj",), ("gate_proj", "up_proj"), ("down_proj",))


def rounded(w, group: int = 64, symmetric: bool = True):
    """`w` rounded to int4 in groups along its rows: symmetric (levels -8..7, scale amax / 7.5) or asymmetric
    (16 levels from the group's min to its max: Q4_1's grid with groups of 32)."""
    blocks = w.reshape(-1, group)
    if symmetric:
        scale = blocks.abs().amax(-1, keepdim=True) / 7.5
        return ((blocks / scale).round().clamp(-8, 7) * scale).reshape(w.shape)
    low, high = blocks.amin(-1, keepdim=True), blocks.amax(-1, keepdim=True)
    scale = (high - low) / 15
    return (((blocks - low) / scale).round().clamp(0, 15) * scale + low).reshape(w.shape)


def relative(approx, exact) -> float:
    return float((approx - exact).detach().norm() / exact.detach().norm())


def with_rounded(model, parts: tuple[str, ...] | None):
    """A copy of `model` with the Linears named by `parts` (None: every one but the head) rounded."""
    import torch

    copied = copy.deepcopy(model)
    with torch.no_grad():
        for name, module in copied.named_modules():
            if isinstance(module, torch.nn.Linear) and "lm_head" not in name and \
                    (parts is None or any(p in name for p in parts)):
                module.weight.copy_(rounded(module.weight))
    return copied


def perplexity(model, pieces) -> float:
    import torch

    with torch.no_grad():
        return sum(math.exp(model(ids, labels=ids).loss.item()) for ids in pieces) / len(pieces)


def grid_figures(base, rotated) -> None:
    print("1. weight rounding error (relative Frobenius), layers 2, 15, 28:")
    for i in (2, 15, 28):
        for name in ("self_attn.q_proj", "mlp.gate_proj"):
            plain = base.get_submodule(f"model.layers.{i}.{name}").weight
            turned = rotated.get_submodule(f"model.layers.{i}.{name}").weight
            print(f"   layer {i:2d} {name:16s} Q4_1 grid (asym g32) {relative(rounded(plain, 32, False), plain):.4f}"
                  f"   sym g64 unrotated {relative(rounded(plain), plain):.4f}"
                  f"   rotated {relative(rounded(turned), turned):.4f}")


def perplexity_figures(base, rotated, pieces) -> None:
    print(f"2. perplexity, {len(pieces)} held-out windows: float {perplexity(base, pieces):.2f}, "
          f"rotated float {perplexity(rotated, pieces):.2f}")
    for parts in (None, *PROJECTIONS):
        label = "every Linear" if parts is None else " + ".join(parts)
        print(f"   int4 g64 rtn, {label:20s} unrotated {perplexity(with_rounded(base, parts), pieces):7.2f}"
              f"   rotated {perplexity(with_rounded(rotated, parts), pieces):7.2f}")


def sink_figures(base, rotated, ids) -> None:
    import torch

    print("3. v_proj's rounding error per token (relative), the 3 tokens of largest residual norm vs the rest:")
    with torch.no_grad():
        streams = {name: m(ids, output_hidden_states=True).hidden_states for name, m in
                   (("unrotated", base), ("rotated", rotated))}
        for layer in (3, 15):
            norms = streams["unrotated"][layer][0].norm(dim=-1)
            top = norms.topk(3).indices
            rest = torch.ones(len(norms), dtype=torch.bool)
            rest[top] = False
            print(f"   layer {layer}: tokens {top.tolist()} residual norms {[round(v) for v in norms[top].tolist()]}"
                  f" (median {norms.median():.0f})")
            for name, model in (("unrotated", base), ("rotated", rotated)):
                block = model.model.layers[layer]
                inputs = block.input_layernorm(streams[name][layer][0])
                weight = block.self_attn.v_proj.weight
                values = inputs @ weight.T
                error = (inputs @ rounded(weight).T - values).norm(dim=-1) / values.norm(dim=-1)
                print(f"     {name:9s} sinks {[round(e, 3) for e in error[top].tolist()]}  "
                      f"others' median {error[rest].median():.3f}  (|v| sinks "
                      f"{[round(v, 2) for v in values.norm(dim=-1)[top].tolist()]}, others' median "
                      f"{values.norm(dim=-1)[rest].median():.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--windows", type=int, default=4, help="held-out windows of 512 tokens for perplexity")
    parser.add_argument("--tokens", type=int, default=256, help="calibration tokens for the per-token figures")
    args = parser.parse_args()

    import numpy as np
    import torch
    import transformers

    from compiler.backends.torch.rotation import rotate
    from compiler.models import resolve_path

    path = resolve_path(MODEL)
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(str(path.parent), gguf_file=path.name)
    base = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                             dtype=torch.float32).eval()
    rotated = copy.deepcopy(base)
    rotate(rotated)
    grid_figures(base, rotated)
    perplexity_figures(base, rotated, windows(tokenizer, texts()[1], args.windows, 512))
    calibration = Path(__file__).resolve().parents[1] / "recipes" / "data" / "smollm2-reference.npz"
    ids = torch.from_numpy(np.load(calibration)["input_ids"][:1, :args.tokens]).long()
    sink_figures(base, rotated, ids)


if __name__ == "__main__":
    main()
