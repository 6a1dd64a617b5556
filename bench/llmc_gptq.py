"""Run by bench/gptq_llmc.py with the interpreter of a venv that has llm-compressor: its `oneshot` with a
GPTQModifier (W4A16, group 128, dampening 0.01, blocks of 128 columns, no act_order: qrc's defaults) on
every Linear but lm_head, calibrated on the token ids of an npz (the samples qrc calibrates on), saved
compressed.

    VENV/bin/python bench/llmc_gptq.py MODEL_FOLDER CALIBRATION.npz OUT_FOLDER
"""

from __future__ import annotations

import sys


def main() -> None:
    model_folder, npz, out = sys.argv[1:4]
    import transformers
    from llmc_data import dataset_and_processor
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import GPTQModifier

    dataset, processor, ids = dataset_and_processor(npz)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_folder, dtype="auto")
    recipe = GPTQModifier(targets="Linear", scheme="W4A16", ignore=["lm_head"], dampening_frac=0.01, block_size=128,
                          actorder=None)
    oneshot(model=model, processor=processor, dataset=dataset, recipe=recipe, num_calibration_samples=len(ids),
            max_seq_length=ids.shape[1])
    model.save_pretrained(out, save_compressed=True)


if __name__ == "__main__":
    main()
