"""qrc's verify cosine against the one transformers measures on the emitted folder (same held-out samples,
transformers' default load: compressed-tensors' forward, activations quantized as the folder says), per zoo
family, for the plain recipe (`type Linear -> W4A16 { group 16 }`, or `--scheme`) in full and offload mode;
and the keys transformers reports missing or unexpected when it loads the folder with the task class.

    python bench/zoo_verify_agreement.py llama llava qwen2_vl gemma4_text gemma4 gemma4_moe mixtral bert
    python bench/zoo_verify_agreement.py --scheme W8A8 llama
"""

from __future__ import annotations

import sys
from pathlib import Path

from work_folder import work_folder

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import transformers  # noqa: E402
from compiling import compile_program  # noqa: E402
from zoo import build, transformers_cosines  # noqa: E402

from compiler.data import verify_batches  # noqa: E402

RECIPE = '''recipe plain {{
    model "{model}"
    backend torch
    scheme s = {scheme}
    quantize {{ type Linear -> s }}
    calibrate {{ data synthetic {{ samples 8  seqlen 32 }}  chunk 4 }}
    memory {{ mode {mode} }}
    verify {{ samples 4  metric cosine  at_least 0.5 }}
    emit "{out}"
}}
'''
TASK = {"bert": "AutoModel", "llava": "AutoModelForImageTextToText", "qwen2_vl": "AutoModelForImageTextToText",
        "gemma4": "AutoModelForImageTextToText"}


def main() -> None:
    args = sys.argv[1:]
    scheme = "W4A16 { group 16 }"
    if args[:1] == ["--scheme"]:
        scheme, args = args[1], args[2:]
    print("| family | scheme | mode | qrc verify cosine | transformers' cosine | missing / unexpected keys |")
    print("|---|---|---|---:|---:|---|")
    for family in args:
        for mode in ("full", "offload"):
            print(_row(family, mode, scheme), flush=True)


def _row(family: str, mode: str, scheme: str) -> str:
    root = work_folder("qrc-bench-")
    folder = build(family, root / family)
    (root / "r.recipe").write_text(RECIPE.format(model=folder, out=root / "out", mode=mode, scheme=scheme))
    result, planned = compile_program(str(root / "r.recipe"), root / "out")
    task = getattr(transformers, TASK.get(family, "AutoModelForCausalLM"))
    batches, _ = verify_batches(planned.check.ir.calibration.data, planned.check.assignment.model, 4, 4)
    cosines, _ = transformers_cosines(folder, root / "out", task, batches, dequantize=False)
    _, info = task.from_pretrained(str(root / "out"), output_loading_info=True)
    return (f"| {family} | {scheme.split()[0]} | {mode} | {result.verify['cosine']:.6f} | "
            f"{sum(cosines) / len(cosines):.6f} | "
            f"{len(info['missing_keys'])} / {len(info['unexpected_keys'])} |")


if __name__ == "__main__":
    main()
