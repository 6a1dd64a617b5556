"""An emitted folder works with lm-evaluation-harness's `hf` model: HFLM loads it (compressed-tensors through
transformers) and scores loglikelihoods, and the local task in recipes/lm_eval runs on it offline."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

lm_eval = pytest.importorskip("lm_eval")
pytest.importorskip("datasets")

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "recipes" / "data"


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> tuple[Path, Path]:
    """(a random Llama folder with the shipped tokenizer, qrc's GPTQ W4A16 output of it)."""
    import torch
    import transformers
    from compiling import compile_

    root = tmp_path_factory.mktemp("lm_eval")
    folder = root / "llama"
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).eval().save_pretrained(folder)
    transformers.PreTrainedTokenizerFast.from_pretrained(str(DATA / "tokenizer")).save_pretrained(folder)
    recipe = root / "r.recipe"
    recipe.write_text(f'recipe r {{\n    model "{folder}"\n    backend torch\n'
                      '    quantize { type Linear -> w4  "lm_head" -> none }\n'
                      "    scheme w4 = W4A16 { group 32  rounding gptq }\n"
                      f'    calibrate {{ data dataset "{DATA / "corpus.jsonl"}" {{ rows pack  samples 16  seqlen 32 }} '
                      "chunk 4 }\n"
                      f'    emit "{root / "out"}"\n}}\n')
    result = compile_(str(recipe), root / "out")
    assert result.exit_code == 0, result.output
    return folder, root / "out"


REQUESTS = [("The bakery on the corner", " opens at six"), ("Rain fell for three days", " straight"),
            ("A good soup starts with onions", " cooked slowly in butter")]


def loglikelihoods(folder: Path) -> tuple[list[float], object]:
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    lm = HFLM(pretrained=str(folder), device="cpu", batch_size=2)
    requests = [Instance(request_type="loglikelihood", doc={}, arguments=pair, idx=i) for i, pair in enumerate(REQUESTS)]
    return [value for value, _ in lm.loglikelihood(requests)], lm


@pytest.mark.slow
def test_hflm_scores_the_emitted_folder(folders):
    """HFLM opens qrc's folder as a compressed-tensors model and its loglikelihoods are the quantized model's:
    finite, close to the float folder's, and not the float folder's."""
    float_folder, out = folders
    quantized, lm = loglikelihoods(out)
    reference, _ = loglikelihoods(float_folder)
    assert getattr(lm.model.config, "quantization_config", None) is not None  # loaded as qrc wrote it
    assert all(math.isfinite(v) and v < 0 for v in quantized)
    assert quantized != reference
    assert all(abs(q - r) <= 0.05 * abs(r) for q, r in zip(quantized, reference, strict=True)), (quantized, reference)


@pytest.mark.slow
def test_the_local_task_runs_offline(folders, monkeypatch):
    """recipes/lm_eval/qrc_corpus.yaml through lm-eval's own evaluator (what `lm_eval --tasks qrc_corpus
    --include_path recipes/lm_eval` runs): word and byte perplexity of the emitted folder."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    monkeypatch.chdir(ROOT)  # the task names its data file relative to the repository
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _, out = folders
    results = simple_evaluate(model="hf", model_args=f"pretrained={out}", device="cpu", batch_size=4,
                              tasks=["qrc_corpus"], task_manager=TaskManager(include_path=str(ROOT / "recipes" / "lm_eval")))
    assert results is not None
    scores = results["results"]["qrc_corpus"]
    assert math.isfinite(scores["byte_perplexity,none"]) and scores["byte_perplexity,none"] > 1, scores
