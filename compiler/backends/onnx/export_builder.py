"""A float32 HF decoder folder exported by onnxruntime-genai's model builder, where it is installed: the graph genai
runs at its own speed (GroupQueryAttention with the rotary embedding inside, SkipSimplifiedLayerNormalization),
which the dynamo export (export_decoder.py) does not fuse: qrc's int4 of the dynamo graph decoded at 1.44-1.49
ms/token in genai against 0.46-0.63 for the builder's (issue 69). The builder is the maintained exporter of that
form, so qrc runs it rather than fusing the graph itself.

Asked for separate q/k/v MatMuls (`disable_qkv_fusion`), so every quantized layer is one of the folder's; the
builder names them `model.layers.N.attn.q_proj.MatMul`, which become the folder's `self_attn` names here (weights
and nodes), so the export quantizes exactly the layers the folder's plan did (Q423 checks). Runs in the export's
child process (export_process.py), whose memory the compile measures."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import runpy
import shutil
import sys
from pathlib import Path

from compiler.models.hf_index import MAX_CONFIG_BYTES
from compiler.plan.ops import Exporter
from compiler.safe_files import read_json

# transformers model types whose float32, untied folders the builder exports here (its CausalLM classes with
# `self_attn` modules); a tied head it writes as a MatMul of its own, which the folder's plan leaves to the
# embedding, so tied folders keep the dynamo export
BUILDER_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")


def builder_takes(folder: Path, config: dict) -> bool:
    """Whether this folder's export is the builder's, asked without importing it (the plan asks, and plans read
    no libraries): a family above, an untied head (all four classes default to untied in transformers 5, so a
    config.json without the key is untied), float32 weights, a fast tokenizer (`tokenizer.json`: the builder
    converts the folder's tokenizer for genai, and fails without one) and onnxruntime-genai installed."""
    if config.get("model_type") not in BUILDER_FAMILIES or config.get("tie_word_embeddings"):
        return False
    if not (folder / "tokenizer.json").is_file():
        return False
    if str(config.get("torch_dtype") or config.get("dtype") or "float32").removeprefix("torch.") != "float32":
        return False
    return importlib.util.find_spec("onnxruntime_genai") is not None


def builder_exports(folder: Path, config: dict) -> bool:
    """`builder_takes`, and the builder imports (the export's child process asks, before it runs it)."""
    if not builder_takes(folder, config):
        return False
    try:
        import onnxruntime_genai.models.builder  # noqa: F401
    except ImportError:
        return False
    return True


def planned_exporter(folder: Path | None) -> Exporter:
    """The exporter an export of `folder` will run, from its config.json as written (no library imported)."""
    if folder is None:
        return Exporter.TORCH_ONNX
    try:
        config = read_json(folder / "config.json", MAX_CONFIG_BYTES)
    except (OSError, ValueError):
        return Exporter.TORCH_ONNX
    return Exporter.GENAI_BUILDER if isinstance(config, dict) and builder_takes(folder, config) else Exporter.TORCH_ONNX


def export_with_builder(folder: Path, out: Path) -> None:
    """The builder's fp32 CPU export of `folder` as `out` (+ `model.onnx.data`, `genai_config.json` and the
    tokenizer files beside it), the layers named as in the folder."""
    work = out.parent / "builder"
    argv = ["builder", "-i", str(folder), "-o", str(work), "-p", "fp32", "-e", "cpu", "-c", str(out.parent / "hf"),
            "--extra_options", "disable_qkv_fusion=true"]
    saved = sys.argv
    sys.argv = argv
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # it prints its progress; the child reports on stdout
            runpy.run_module("onnxruntime_genai.models.builder", run_name="__main__")
    except BaseException:  # noqa: BLE001  # what it left goes; the caller exports with the dynamo exporter
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(out.parent / "hf", ignore_errors=True)
        raise
    finally:
        sys.argv = saved
    _rename(work / "model.onnx", out)
    (work / "model.onnx").unlink()
    os.replace(work / "model.onnx.data", out.with_name("model.onnx.data"))
    for entry in work.iterdir():  # genai_config.json and the tokenizer files it wrote
        if entry.is_file():
            os.replace(entry, out.parent / entry.name)
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(out.parent / "hf", ignore_errors=True)
    config = out.parent / "genai_config.json"
    if config.is_file():  # the decoder's file keeps its name: model.onnx
        data = json.loads(config.read_text())
        data["model"]["decoder"]["filename"] = out.name
        config.write_text(json.dumps(data, indent=4) + "\n")


def _rename(graph: Path, out: Path) -> None:
    """The builder's `attn` modules named as the folder's `self_attn`, in weight and node names; the graph
    written as `out` (its weights stay in the data file beside it, which the names do not touch)."""
    import onnx

    model = onnx.load(str(graph), load_external_data=False)
    renamed = {t.name: t.name.replace(".attn.", ".self_attn.") for t in model.graph.initializer}
    for tensor in model.graph.initializer:
        tensor.name = renamed[tensor.name]
    for node in model.graph.node:
        node.name = node.name.replace("/attn/", "/self_attn/")
        node.input[:] = [renamed.get(name, name) for name in node.input]
    onnx.save(model, str(out))
