"""Why Gemma 4 lands at a lower cosine than other families under the same W4A16 recipe (issue 68): the tiny random
models of tests/zoo.py compiled by qrc (`type Linear -> W4A16 { group 16 }`, its folder loaded by transformers,
compressed-tensors dequantizing) beside the same rounding done independently in memory (symmetric int4, groups of
16, absmax / 7.5, every Linear the recipe quantizes), then Gemma 4 with one kind of layer rounded at a time.

    python bench/gemma4_sensitivity.py [--families gemma4_text gemma4_moe llama qwen3]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from work_folder import work_folder

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
RECIPE = """recipe g {{
    model "{model}"
    backend torch
    scheme s = W4A16 {{ group 16 }}
    quantize {{ type Linear -> s }}
    emit "{out}"
}}
"""


def rounded_in_memory(model, only: str | None = None) -> None:
    """Round every Linear qrc's recipe rounds (a tied head is the embedding, which `type Linear` leaves), or only the
    layers whose last name is `only`, as compressed-tensors' symmetric int4 groups of 16 do."""
    import torch

    tied = model.config.get_text_config().tie_word_embeddings
    with torch.no_grad():
        for name, module in model.named_modules():
            if not isinstance(module, torch.nn.Linear) or (tied and name.endswith("lm_head")):
                continue
            if only is not None and name.rsplit(".", 1)[-1] != only:
                continue
            groups = module.weight.reshape(module.weight.shape[0], -1, 16)
            scale = groups.abs().amax(-1, keepdim=True).clamp(min=1e-12) / 7.5
            module.weight.copy_((torch.clamp(torch.round(groups / scale), -8, 7) * scale).reshape_as(module.weight))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="*", default=["gemma4_text", "gemma4_moe", "gemma3_text", "llama", "qwen3"])
    args = parser.parse_args()
    import torch
    import transformers
    import zoo

    work = work_folder("qrc-gemma4-")
    ids = torch.randint(0, 300, (4, 32), generator=torch.Generator().manual_seed(0))
    auto = transformers.AutoModelForCausalLM

    def cosine(folder: Path, change=None, **load) -> float:
        model = auto.from_pretrained(folder, **load).eval()
        if change:
            change(model)
        with torch.no_grad():
            logits = model(ids).logits
        return torch.nn.functional.cosine_similarity(reference.flatten(1).double(), logits.flatten(1).double(),
                                                     dim=1).mean().item()

    alone: dict[str, float] = {}
    print("| family | qrc's folder in transformers | rounded in memory |\n|---|---:|---:|")
    for family in args.families:
        folder = zoo.build(family, work / family)
        recipe = work / f"{family}.recipe"
        recipe.write_text(RECIPE.format(model=folder, out=work / f"{family}-out"))
        subprocess.run([sys.executable, "-m", "compiler", "compile", str(recipe)], cwd=ROOT, check=True,
                       capture_output=True)
        with torch.no_grad():
            reference = auto.from_pretrained(folder).eval()(ids).logits
        qrc = cosine(work / f"{family}-out", quantization_config=transformers.CompressedTensorsConfig(dequantize=True))
        print(f"| {family} | {qrc:.4f} | {cosine(folder, rounded_in_memory):.4f} |", flush=True)
        if family == "gemma4_text":
            kinds = sorted({n.rsplit(".", 1)[-1] for n, m in auto.from_pretrained(folder).named_modules()
                            if isinstance(m, torch.nn.Linear) and not n.endswith("lm_head")})
            alone = {kind: cosine(folder, lambda m, k=kind: rounded_in_memory(m, k)) for kind in kinds}
    if alone:
            print("\nGemma 4 text, one kind of layer rounded: " + ", ".join(
            f"{k} {v:.4f}" for k, v in sorted(alone.items(), key=lambda kv: kv[1])))


if __name__ == "__main__":
    main()
