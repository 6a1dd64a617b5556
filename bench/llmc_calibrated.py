"""Run by bench/transforms.py with the interpreter of a venv that has llm-compressor (its pins clash with
qrc's): `oneshot` with AWQModifier (W4A16, group 128, grid 20, duo scaling: its defaults) or
SmoothQuantModifier(strength ALPHA) + QuantizationModifier(W8A8), or the plain scheme, on every Linear but
lm_head, calibrated on the token ids of an npz (the samples qrc calibrates on), saved compressed.

    VENV/bin/python bench/llmc_transforms.py MODEL_FOLDER CALIBRATION.npz awq|rtn|smoothquant|w8a8 OUT [ALPHA]
"""

from __future__ import annotations

import sys
import time


def main() -> None:
    model_folder, npz, method, out = sys.argv[1:5]
    alpha = float(sys.argv[5]) if len(sys.argv) > 5 else 0.5
    import torch
    import transformers
    from llmc_data import dataset_and_processor
    from llmcompressor import oneshot
    from llmcompressor.modifiers.awq import AWQModifier
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from llmcompressor.modifiers.smoothquant import SmoothQuantModifier

    if not torch.cuda.is_available():  # its AWQ pins cached activations, which needs an accelerator (0.14.0.1)
        torch.Tensor.pin_memory = lambda self, *args, **kwargs: self  # type: ignore[method-assign]
    dataset, processor, ids = dataset_and_processor(npz)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_folder, dtype="auto")
    recipe = {
        "awq": [AWQModifier(targets=["Linear"], scheme="W4A16", ignore=["lm_head"], n_grid=20, duo_scaling=True)],
        "rtn": [QuantizationModifier(targets="Linear", scheme="W4A16", ignore=["lm_head"])],
        "smoothquant": [SmoothQuantModifier(smoothing_strength=alpha),
                        QuantizationModifier(targets="Linear", scheme="W8A8", ignore=["lm_head"])],
        "w8a8": [QuantizationModifier(targets="Linear", scheme="W8A8", ignore=["lm_head"])],
    }[method]
    start = time.perf_counter()
    oneshot(model=model, processor=processor, dataset=dataset, recipe=recipe, num_calibration_samples=len(ids),
            max_seq_length=ids.shape[1])
    print(f"seconds {time.perf_counter() - start:.2f}")
    model.save_pretrained(out, save_compressed=True)


if __name__ == "__main__":
    main()
