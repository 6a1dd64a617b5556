"""qrc's own verification figure and peak, checked outside qrc: compile the tiny-llama W8A8 example, then
run the float and emitted models in a default onnxruntime session on the same held-out samples, and read
the kernel's high-water mark of this process. With `--torch-gptq`: compile a random HF Llama (2 blocks,
hidden 512) with GPTQ W4A16 on the torch backend, and run the float and emitted folders in transformers
(compressed-tensors dequantizing) on the held-out rows qrc verified on.

    python bench/check_verify.py [--torch-gptq]
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import onnxruntime as ort
from rich.console import Console
from work_folder import work_folder

from compiler.compile_run import compile_recipe
from compiler.data import verify_batches
from compiler.models import builtin

GPTQ_RECIPE = """recipe check {{
    model "{model}"
    backend torch
    quantize {{ type Linear -> s  "lm_head" -> none }}
    scheme s = W4A16 {{ rounding gptq }}
    calibrate {{ data npz "{npz}"  chunk 8 }}
    memory {{ mode offload }}
    verify {{ samples 8  metric cosine  at_least 0.9 }}
    emit "{out}"
}}
"""


def _peak_line(result, planned) -> str:
    hwm = int(re.search(r"VmHWM:\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) * 1024
    return (f"peak: qrc sampled {result.peak_rss / 2**20:.1f} MiB, kernel VmHWM {hwm / 2**20:.1f} MiB, "
            f"planned {planned.plan.peak_bytes / 2**20:.1f} MiB")


def torch_gptq() -> None:
    """The torch backend's verification figures (cosine, top-1, KL) against transformers on the same rows."""
    import numpy as np
    import torch
    import transformers

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from float_formats import model_folder

    folder = model_folder(512, 2)
    tmp = work_folder("qrc-check-")
    ids = np.random.default_rng(3).integers(0, 8192, (40, 128), dtype=np.int64)  # 32 calibration + 8 held out
    np.savez(tmp / "data.npz", input_ids=ids, attention_mask=np.ones_like(ids))
    recipe = tmp / "check.recipe"
    recipe.write_text(GPTQ_RECIPE.format(model=folder, npz=tmp / "data.npz", out=tmp / "out"))
    result, planned = compile_recipe(recipe, (), tmp / "out", Console(quiet=True))
    peak = _peak_line(result, planned)  # before transformers loads anything into this process
    reference = transformers.AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    quantized = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp / "out"), quantization_config=transformers.CompressedTensorsConfig(dequantize=True)).eval()
    held_out = torch.from_numpy(ids[32:])
    with torch.no_grad():
        a, b = reference(held_out).logits.float(), quantized(held_out).logits.float()
    cosine = torch.nn.functional.cosine_similarity(a.flatten(1), b.flatten(1), dim=1).mean()  # per sample
    p, q = a.log_softmax(-1), b.log_softmax(-1)
    kl = (p.exp() * (p - q)).sum(-1).mean()
    top1 = (a.argmax(-1) == b.argmax(-1)).float().mean()
    mine = result.verify
    print(f"cosine: qrc {mine['cosine']:.5f}, transformers {float(cosine):.5f}")
    print(f"top-1: qrc {mine['top1']:.4f}, transformers {float(top1):.4f}")
    print(f"kld: qrc {mine['kld']:.5f}, transformers {float(kl):.5f}")
    print(peak)


def main() -> None:
    if "--torch-gptq" in sys.argv[1:]:
        torch_gptq()
        return
    out = work_folder("qrc-check-") / "m.onnx"
    result, planned = compile_recipe(Path("recipes/tiny-llama-w8a8.recipe"), (), out, Console(quiet=True))
    ir = planned.check.ir
    batches, _ = verify_batches(ir.calibration.data, planned.check.assignment.model, ir.verify.samples, 1)
    reference = ort.InferenceSession(str(builtin.onnx_path(ir.model)), providers=["CPUExecutionProvider"])
    candidate = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    names = {i.name for i in reference.get_inputs()}
    same = total = 0
    for feed in batches:
        feed = {k: v for k, v in feed.items() if k in names}
        a, b = reference.run(None, feed)[0], candidate.run(None, feed)[0]
        same += int((a.argmax(-1) == b.argmax(-1)).sum())
        total += a.shape[0] * a.shape[1]
    print(f"top-1: qrc {result.verify['top1']:.4f}, onnxruntime {same / total:.4f}")
    print(_peak_line(result, planned))


if __name__ == "__main__":
    main()
