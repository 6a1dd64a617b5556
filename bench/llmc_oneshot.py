"""Run by bench/float_formats.py with the interpreter of a venv that has llm-compressor (its pins clash with
qrc's): llm-compressor's `oneshot` with one of its preset schemes on every Linear but lm_head, saved
compressed. Data-free schemes only (what the float_formats bench compares).

    VENV/bin/python bench/llmc_oneshot.py MODEL_FOLDER SCHEME OUT_FOLDER
"""

from __future__ import annotations

import sys
import time


def main() -> None:
    model_folder, scheme, out = sys.argv[1:4]
    import transformers
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier

    model = transformers.AutoModelForCausalLM.from_pretrained(model_folder, dtype="auto")
    start = time.perf_counter()
    oneshot(model=model, recipe=QuantizationModifier(targets="Linear", scheme=scheme, ignore=["lm_head"]))
    model.save_pretrained(out, save_compressed=True)
    print(f"seconds {time.perf_counter() - start:.2f}")


if __name__ == "__main__":
    main()
