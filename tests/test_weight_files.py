"""Which safetensors files of an HF-style folder are its weights: those transformers loads (`model.safetensors`,
else the shards `model.safetensors.index.json` names). Files beside them (Mistral's `consolidated.safetensors`, a
fine-tune's `adapter_model.safetensors`, the shards of an older layout) are neither listed, planned nor read; an
index that is broken, names a shard outside the folder or one that is missing is Q250 at check, nothing written."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from compiler.cli import app

pytest.importorskip("transformers")
runner = CliRunner()


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    from zoo import build

    return build("llama", tmp_path_factory.mktemp("weights") / "llama")


def _sharded(llama: Path, folder: Path) -> Path:
    """The Llama as two shards and their index, as `save_pretrained` writes a model past its shard size."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(llama, folder)
    tensors = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for file, part in halves.items():
        save_file({name: tensors[name] for name in part}, str(folder / file), metadata={"format": "pt"})
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {name: file for file, part in halves.items() for name in part}}))
    return folder


def _inspected(folder: Path) -> dict:
    result = runner.invoke(app, ["inspect", str(folder), "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def _recipe(tmp_path: Path, folder: Path, scheme: str = "W8A16") -> Path:
    path = tmp_path / "r.recipe"
    path.write_text(f'recipe r {{\n    model "{folder}"\n    backend torch\n'
                    f'    quantize {{ type Linear -> {scheme}  "lm_head" -> none }}\n    emit "{tmp_path / "out"}"\n}}\n')
    return path


def _beside(folder: Path, name: str, rename, scale: float = 3.0) -> None:
    """Another safetensors file in `folder`: the model's tensors renamed by `rename`, their values scaled."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(folder / "model.safetensors"))
    save_file({rename(k): v * scale for k, v in tensors.items()}, str(folder / name))


@pytest.mark.parametrize("sharded", [False, True], ids=["one-file", "sharded"])
def test_other_safetensors_beside_the_weights_are_not_layers(llama, sharded, tmp_path):
    """Mistral's own names in consolidated.safetensors and a LoRA adapter beside the weights: the layers and
    bytes `qrc inspect` lists are the model's alone, as transformers loads it."""
    alone = _inspected(llama)
    folder = tmp_path / "m"
    shutil.copytree(llama, folder)
    _beside(folder, "consolidated.safetensors", lambda k: k.replace("model.layers.", "layers.")
            .replace("self_attn.q_proj", "attention.wq"))
    _beside(folder, "adapter_model.safetensors", lambda k: "base_model.model." + k.replace(".weight", ".lora_A.weight"))
    if sharded:
        shards = _sharded(llama, tmp_path / "sharded")
        for name in ("consolidated.safetensors", "adapter_model.safetensors"):
            shutil.copyfile(folder / name, shards / name)
        folder = shards
    found = _inspected(folder)
    assert [layer["name"] for layer in found["layers"]] == [layer["name"] for layer in alone["layers"]]
    assert found["total_bytes"] == alone["total_bytes"]


@pytest.mark.slow  # a compile and two transformers loads: about 10 s
def test_a_stale_shard_beside_an_index_is_not_read(llama, tmp_path):
    """The shards of an older layout left beside the index (same tensor names, other values, sorted after the
    current ones): the compile reads the shards the index names, so the output computes what transformers' load
    of the folder computes."""
    import transformers
    from zoo import transformers_cosines

    folder = _sharded(llama, tmp_path / "m")
    shutil.copyfile(llama / "model.safetensors", tmp_path / "model.safetensors")
    _beside(tmp_path, "model-00003-of-00003.safetensors", lambda k: k, scale=-2.0)
    shutil.move(tmp_path / "model-00003-of-00003.safetensors", folder / "model-00003-of-00003.safetensors")
    result = runner.invoke(app, ["compile", str(_recipe(tmp_path, folder))])
    assert result.exit_code == 0, result.output
    ids = np.random.default_rng(0).integers(0, 320, (2, 16))
    cosines, _ = transformers_cosines(folder, tmp_path / "out", transformers.AutoModelForCausalLM,
                                      [{"input_ids": ids, "attention_mask": np.ones_like(ids)}])
    assert min(cosines) > 0.99, cosines


INDEXES = {
    "not JSON": ("{", "is not valid JSON"),
    "a list": ("[]", "no `weight_map`"),
    "no weight_map": ('{"metadata": {}}', "no `weight_map`"),
    "files not names": ('{"weight_map": {"lm_head.weight": 3}}', "no `weight_map`"),
    "a shard outside the folder": ('{"weight_map": {"lm_head.weight": "../secret.safetensors"}}', "not a file name"),
    "a missing shard": ('{"weight_map": {"lm_head.weight": "model-00009-of-00009.safetensors"}}', "not in the folder"),
    "nested deep": ('{"weight_map": ' + "[" * 100_000 + "]" * 100_000 + "}", "nests deeper"),
    "a FIFO": (None, "is a FIFO, not a file"),
}


@pytest.mark.parametrize("case", list(INDEXES))
def test_a_broken_index_is_q250_at_check(llama, case, tmp_path):
    """An index that is not a JSON object with a weight_map of shard file names in the folder: Q250 naming the
    index, at `qrc check` (a FIFO is refused, not waited on), nothing written."""
    text, said = INDEXES[case]
    folder = _sharded(llama, tmp_path / "m")
    index = folder / "model.safetensors.index.json"
    index.unlink()
    release = None
    if text is None:
        os.mkfifo(index)
        release = threading.Timer(60, lambda: open(index, "w").close())  # noqa: SIM115
        release.start()
    else:
        index.write_text(text)
    try:
        result = runner.invoke(app, ["check", str(_recipe(tmp_path, folder))])
    finally:
        if release is not None:
            release.cancel()
    assert result.exit_code == 2 and "Q250" in result.output and "model.safetensors.index.json" in result.output, \
        result.output
    assert said in result.output and "Traceback" not in result.output, result.output
    assert not (tmp_path / "out").exists()
