"""Run by the benches that compare with llm-compressor, with the interpreter of a venv that has it (its pins
clash with qrc's): `oneshot` with one calibrated recipe on every Linear but lm_head, calibrated on the token
ids of an npz (the samples qrc calibrates on), saved compressed. Prints the seconds `oneshot` took.

    VENV/bin/python bench/llmc_calibrated.py MODEL_FOLDER CALIBRATION.npz METHOD OUT [ALPHA [GROUP]]

GROUP (default 128) is the int4 rows' group size.

METHOD:
- gptq: GPTQModifier, W4A16 group 128, dampening 0.01, blocks of 128 columns, no act_order (qrc's defaults);
- gptq-actorder: the same with its default `actorder="static"` (columns by decreasing Hessian diagonal, group
  scales from the float weight: qrc's `rounding gptq static_groups act_order`);
- gptq-mse: gptq with group scales from its `memoryless_mse` weight observer (a search over shrink factors of
  the float group's range, its defaults: 20 steps of 1%, error norm 2.4) instead of min/max;
- w8a8-static: qrc's W8A8_STATIC preset (int8 weights per channel, symmetric; int8 inputs per tensor, asymmetric,
  static), input ranges from its default `minmax` observer (a moving average of per-batch ranges);
- mse: W4A16 (group GROUP) rounded to nearest with that `memoryless_mse` observer's scales (data-free);
- imatrix: the same with its `imatrix_mse` observer (the search weighted by each input column's mean square over
  the calibration tokens; its defaults);
- awq: AWQModifier (W4A16, group 128, grid 20, duo scaling: its defaults); rtn: plain W4A16;
- smoothquant: SmoothQuantModifier(strength ALPHA) + its W8A8 (dynamic per-token inputs); w8a8: that alone;
  smoothquant-static: SmoothQuantModifier(strength ALPHA) + w8a8-static; smoothquant-static-gptq: the same with
  GPTQModifier (dampening 0.01, blocks of 128, its default act order) rounding the weights;
- w8a16: int8 weights per channel, symmetric (qrc's W8A16; compressed-tensors' preset of that name is group 128);
  FP8_DYNAMIC: that preset;
- w4a8: compressed-tensors' W4A8 (int4 weights in groups of GROUP, symmetric; int8 inputs per token, dynamic);
- NVFP4, MXFP4, W4AFP8: QuantizationModifier with that compressed-tensors preset (NVFP4's global input scales
  come from calibration); mse-PRESET, imatrix-PRESET (NVFP4A16, MXFP4A16, NVFP4): that preset with the
  `memoryless_mse` or `imatrix_mse` weight observer (its block scales searched over shrink factors of each
  block's range, the error weighted by each input column's mean square for imatrix: its defaults);
- sq-r4:METHOD: METHOD (one with a SmoothQuantModifier) with SpinQuantModifier(rotations ["R4"]) after the
  smoothing: qrc's `transform smoothquant { alpha ALPHA  online r4 }`.
"""

from __future__ import annotations

import sys
import time


def recipe(method: str, alpha: float, group: int = 128):
    """The modifiers of METHOD."""
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from llmcompressor.modifiers.awq import AWQModifier
    from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier
    from llmcompressor.modifiers.smoothquant import SmoothQuantModifier

    def plain(scheme: str):
        return QuantizationModifier(targets="Linear", scheme=scheme, ignore=["lm_head"])

    def int_weights(bits: int, strategy: str, **more) -> QuantizationArgs:
        size = {"group_size": group} if strategy == "group" else {}
        return QuantizationArgs(num_bits=bits, type="int", strategy=strategy, symmetric=True, dynamic=False,
                                **size, **more)

    def groups(name: str, weights: QuantizationArgs, inputs: QuantizationArgs | None = None) -> dict:
        """One config group: every Linear takes `weights` (and `inputs`)."""
        return {name: QuantizationScheme(targets=["Linear"], weights=weights, input_activations=inputs)}

    def quantized(name: str, weights: QuantizationArgs, inputs: QuantizationArgs | None = None):
        return QuantizationModifier(config_groups=groups(name, weights, inputs), ignore=["lm_head"])

    def gptq(name: str, weights: QuantizationArgs, inputs: QuantizationArgs | None = None, **more):
        return GPTQModifier(config_groups=groups(name, weights, inputs), ignore=["lm_head"], dampening_frac=0.01,
                            block_size=128, **more)

    if method.startswith("spinquant"):  # `spinquant[-r4][-bN]:METHOD`: its R1 + R2 (random Hadamard, QuaRot's; 576 is
        from llmcompressor.modifiers.transform import SpinQuantModifier  # no power of two) first, R4 (online) too,
        # block-diagonal R1 and R4 of order N (its transform_block_size)
        options = method.partition(":")[0].split("-")[1:]
        block = next((int(o[1:]) for o in options if o.startswith("b")), None)
        rotations = ["R1", "R2", "R4"] if "r4" in options else ["R1", "R2"]
        return [SpinQuantModifier(rotations=rotations, transform_type="random-hadamard", transform_block_size=block),
                *recipe(method.partition(":")[2], alpha, group)]
    if method.startswith("sq-r4:"):  # `sq-r4:METHOD`: METHOD's SmoothQuantModifier, then R4 alone (SpinQuantModifier
        from llmcompressor.modifiers.transform import SpinQuantModifier  # with rotations ["R4"]), then its rounding
        inner = recipe(method.partition(":")[2], alpha, group)
        turned = SpinQuantModifier(rotations=["R4"], transform_type="random-hadamard")
        at = next(i for i, m in enumerate(inner) if isinstance(m, SmoothQuantModifier)) + 1
        return [*inner[:at], turned, *inner[at:]]
    w4 = int_weights(4, "group")
    static_inputs = QuantizationArgs(num_bits=8, type="int", strategy="tensor", symmetric=False, dynamic=False)
    if method in ("gptq", "gptq-actorder"):
        return [gptq("w4", w4, actorder="static" if method == "gptq-actorder" else None)]
    if method == "gptq-mse":
        return [gptq("w4", int_weights(4, "group", observer="memoryless_mse"), actorder=None)]
    if method in ("mse", "imatrix"):
        return [quantized("w4", int_weights(4, "group", observer={"mse": "memoryless_mse",
                                                                  "imatrix": "imatrix_mse"}[method]))]
    if method in ("w8a8-static", "smoothquant-static", "smoothquant-static-gptq"):
        smooth = [SmoothQuantModifier(smoothing_strength=alpha)] if method != "w8a8-static" else []
        rounding = gptq if method == "smoothquant-static-gptq" else quantized
        return [*smooth, rounding("w8a8", int_weights(8, "channel"), static_inputs)]
    if method == "awq":
        return [AWQModifier(config_groups=groups("w4", w4), ignore=["lm_head"], n_grid=20, duo_scaling=True)]
    if method in ("NVFP4", "MXFP4", "W4AFP8", "FP8_DYNAMIC", "NVFP4A16", "MXFP4A16"):
        return [plain(method)]
    if method.partition("-")[0] in ("mse", "imatrix") and "FP4" in method:
        from compressed_tensors.quantization.quant_scheme import preset_name_to_scheme

        observer, _, preset = method.partition("-")
        scheme = preset_name_to_scheme(preset, ["Linear"])
        assert scheme.weights is not None
        scheme.weights.observer = {"mse": "memoryless_mse", "imatrix": "imatrix_mse"}[observer]
        return [QuantizationModifier(config_groups={"fp4": scheme}, ignore=["lm_head"])]
    if method in ("gptq-NVFP4", "gptq-NVFP4A16"):  # its NVFP4 GPTQ example: the preset, its defaults
        return [GPTQModifier(targets="Linear", scheme=method.removeprefix("gptq-"), ignore=["lm_head"])]
    if method == "smoothquant":
        return [SmoothQuantModifier(smoothing_strength=alpha), plain("W8A8")]
    if method == "w8a16":
        return [quantized("w8", int_weights(8, "channel"))]
    if method in ("w4a8", "gptq-w4a8"):
        per_token = QuantizationArgs(num_bits=8, type="int", strategy="token", symmetric=True, dynamic=True)
        if method == "gptq-w4a8":
            return [gptq("w4a8", w4, per_token, actorder="static")]
        return [quantized("w4a8", w4, per_token)]
    if method == "rtn":
        return [quantized("w4", w4)]
    return [plain({"w8a8": "W8A8"}[method])]


def main() -> None:
    model_folder, npz, method, out = sys.argv[1:5]
    alpha = float(sys.argv[5]) if len(sys.argv) > 5 else 0.5
    group = int(sys.argv[6]) if len(sys.argv) > 6 else 128
    import numpy as np
    import torch
    import transformers
    from datasets import Dataset
    from llmcompressor import oneshot
    from tokenizers import Tokenizer, models

    if not torch.cuda.is_available():  # its AWQ pins cached activations, which needs an accelerator (0.14.0.1)
        torch.Tensor.pin_memory = lambda self, *args, **kwargs: self  # type: ignore[method-assign]
    ids = np.load(npz)["input_ids"]
    dataset = Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": np.ones_like(ids).tolist()})
    # the dataset is tokenized already; oneshot still wants a processor, so it gets a one-word one
    processor = transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")), unk_token="[UNK]",
        pad_token="[UNK]")
    model = transformers.AutoModelForCausalLM.from_pretrained(model_folder, dtype="auto")
    start = time.perf_counter()
    oneshot(model=model, processor=processor, dataset=dataset, recipe=recipe(method, alpha, group),
            num_calibration_samples=len(ids), max_seq_length=ids.shape[1])
    print(f"seconds {time.perf_counter() - start:.2f}")
    model.save_pretrained(out, save_compressed=True)


if __name__ == "__main__":
    main()
