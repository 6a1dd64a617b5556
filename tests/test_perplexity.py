"""`verify { metric perplexity }`: the float model's and the emitted model's perplexity on the same held-out
windows, checked outside qrc: transformers' own loss on the emitted folder (torch backend) and a numpy
next-token loss on onnxruntime's logits (ONNX backend) give the same figures within 0.5%."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from compiler.data import verify_batches
from compiler.frontend import check_file
from compiler.models import index_model

pytest.importorskip("datasets")
ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "recipes" / "data"
DATASET = (f'data dataset "{DATA / "corpus.jsonl"}" {{ tokenizer "{DATA / "tokenizer"}"  rows pad  samples 16  '
           "seqlen 32 }")


def recipe(tmp_path: Path, model: str, backend: str, out: Path, bound: str = "at_most 50") -> Path:
    path = tmp_path / f"{backend}.recipe"
    path.write_text(f'recipe r {{\n    model "{model}"\n    backend {backend}\n'
                    '    quantize { type Linear -> W8A8_STATIC  "lm_head" -> none }\n'
                    f"    calibrate {{ {DATASET}  chunk 4 }}\n"
                    f"    verify {{ samples 8  metric perplexity  {bound} }}\n    emit \"{out}\"\n}}\n")
    return path


def compiled(path: Path, out: Path) -> dict[str, float]:
    from compiling import compile_program

    result, _ = compile_program(str(path), out)
    assert result.verify is not None and result.verify_passed, result.verify
    return result.verify


def held_out(path: Path) -> list[dict[str, np.ndarray]]:
    """The held-out windows qrc verified on (its public data API), to score outside it."""
    ir = check_file(path).ir
    assert ir is not None and ir.verify is not None
    batches, _ = verify_batches(ir.calibration.data, index_model(ir.model), ir.verify.samples, 4)
    return list(batches)


def numpy_perplexity(logits: list[np.ndarray], windows: list[dict[str, np.ndarray]]) -> float:
    """exp of the mean next-token loss over positions whose next token is not padding."""
    total, count = 0.0, 0
    for out, feed in zip(logits, windows, strict=True):
        x = out[:, :-1].astype(np.float64)
        logp = x - x.max(-1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
        target, keep = feed["input_ids"][:, 1:], feed["attention_mask"][:, 1:] == 1
        chosen = np.take_along_axis(logp, target[..., None], -1)[..., 0]
        total -= float(chosen[keep].sum())
        count += int(keep.sum())
    return math.exp(total / count)


@pytest.mark.slow
def test_perplexity_agrees_with_transformers_own_loss(tmp_path):
    """A random Llama folder (the tokenizer's 512 tokens), W8A8_STATIC on the torch backend, windows padded and
    masked: transformers' loss (labels -100 under the padding) on the float folder and on the emitted folder
    as transformers loads it gives qrc's two perplexities within 0.5%."""
    import torch
    import transformers

    folder = tmp_path / "llama"
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).eval().save_pretrained(folder)
    out = tmp_path / "out"
    path = recipe(tmp_path, str(folder), "torch", out)
    figures = compiled(path, out)
    windows = held_out(path)
    theirs = {}
    for side, where in (("float_perplexity", folder), ("emitted_perplexity", out)):
        model = transformers.AutoModelForCausalLM.from_pretrained(str(where)).eval()
        total, count = 0.0, 0
        with torch.no_grad():
            for feed in windows:
                ids, mask = torch.from_numpy(feed["input_ids"]), torch.from_numpy(feed["attention_mask"])
                labels = ids.masked_fill(mask == 0, -100)
                predicted = int((labels[:, 1:] != -100).sum())
                total += float(model(input_ids=ids, attention_mask=mask, labels=labels).loss) * predicted
                count += predicted
        theirs[side] = math.exp(total / count)
    for side, value in theirs.items():
        assert figures[side] == pytest.approx(value, rel=0.005), (side, figures[side], value)
    increase = 100 * (theirs["emitted_perplexity"] / theirs["float_perplexity"] - 1)
    assert figures["perplexity"] == pytest.approx(increase, abs=0.05)


def test_perplexity_agrees_with_onnxruntime(tmp_path):
    """The built-in Llama's ONNX form and qrc's QDQ output, both run by onnxruntime on the held-out windows,
    scored in numpy: qrc's two perplexities within 0.5%."""
    import onnxruntime as ort

    from compiler.models.builtin import onnx_path

    out = tmp_path / "out.onnx"
    path = recipe(tmp_path, "builtin:tiny-llama", "onnx", out)
    figures = compiled(path, out)
    windows = held_out(path)
    for side, model in (("float_perplexity", onnx_path("builtin:tiny-llama")), ("emitted_perplexity", out)):
        session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
        first = session.get_outputs()[0].name
        logits = [session.run([first], feed)[0] for feed in windows]
        assert figures[side] == pytest.approx(numpy_perplexity(logits, windows), rel=0.005), side


def test_a_perplexity_increase_over_the_bound_fails_verification(tmp_path):
    """W8A8_STATIC on the tiny Llama held to +0.01% perplexity: verification fails with Q501 and names the metric."""
    from compiling import runner

    from compiler.cli import app

    out = tmp_path / "out.onnx"
    path = recipe(tmp_path, "builtin:tiny-llama", "onnx", out, bound="at_most 0.01")
    result = runner.invoke(app, ["compile", str(path)])
    assert result.exit_code != 0 and "Q501" in result.output and "perplexity" in result.output, result.output
    assert (tmp_path / "out.onnx.verify.json").is_file()


def test_a_decoders_mask_over_its_cache_and_padding_is_not_predicted():
    """With a cache, the attention mask covers the past then the new tokens: only the new tokens' part says
    which next tokens are predicted (padding is not); the figure is the mean loss over those positions."""
    from compiler.backends.agreement import Agreement
    from compiler.ir.types import VerifyMetric

    rng = np.random.default_rng(0)
    logits = rng.standard_normal((1, 4, 10)).astype(np.float32)
    ids = np.array([[1, 2, 3, 0]])
    mask = np.array([[1] * 6 + [1, 1, 1, 0]])  # 6 cached tokens, then 3 tokens and one pad
    agreement = Agreement()
    agreement.update(logits, logits + 0.5 * rng.standard_normal(logits.shape).astype(np.float32), mask, ids)
    x = logits[0].astype(np.float64)
    logp = x - np.log(np.exp(x).sum(-1, keepdims=True))
    expected = math.exp(-(logp[0, 2] + logp[1, 3]) / 2)  # position 2's next token is padding
    assert agreement.predicted == 2
    assert agreement.perplexities()[0] == pytest.approx(expected, rel=1e-6)
    assert not math.isnan(agreement.value(VerifyMetric.PERPLEXITY))
