"""Run by bench/w8a8_llmc.py with the interpreter of a venv that has llm-compressor: `oneshot` with a
QuantizationModifier for qrc's W8A8 preset (int8 weights per channel, symmetric; int8 inputs per tensor,
asymmetric, static) on every Linear but lm_head, its input ranges from llm-compressor's default `minmax`
observer (a moving average of per-batch ranges, constant 0.01), calibrated on the npz's token ids, saved
compressed.

    VENV/bin/python bench/llmc_w8a8.py MODEL_FOLDER CALIBRATION.npz OUT_FOLDER
"""

from __future__ import annotations

import sys


def main() -> None:
    model_folder, npz, out = sys.argv[1:4]
    import transformers
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from llmc_data import dataset_and_processor
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier

    dataset, processor, ids = dataset_and_processor(npz)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_folder, dtype="auto")
    scheme = QuantizationScheme(
        targets=["Linear"],
        weights=QuantizationArgs(num_bits=8, type="int", strategy="channel", symmetric=True, dynamic=False),
        input_activations=QuantizationArgs(num_bits=8, type="int", strategy="tensor", symmetric=False, dynamic=False))
    recipe = QuantizationModifier(config_groups={"w8a8": scheme}, ignore=["lm_head"])
    oneshot(model=model, processor=processor, dataset=dataset, recipe=recipe, num_calibration_samples=len(ids),
            max_seq_length=ids.shape[1])
    model.save_pretrained(out, save_compressed=True)


if __name__ == "__main__":
    main()
