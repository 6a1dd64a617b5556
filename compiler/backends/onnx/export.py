"""An HF-style folder compiled with `backend onnx` is exported to ONNX first (float32 Llama, Mistral and Qwen
decoders with onnxruntime-genai's model builder where it is installed, export_builder.py; other decoders with
torch.onnx's dynamo exporter and a key/value cache, export_decoder.py), once: the export is cached under
$QRC_CACHE/exported/<content hash>/ and reused by later compiles."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path

from compiler.backends import BackendError
from compiler.backends.onnx.export_builder import builder_exports, export_with_builder
from compiler.backends.onnx.export_decoder import DECODER_FAMILIES, export_decoder
from compiler.backends.onnx.export_process import export_in_child
from compiler.backends.onnx.genai import TOKENIZER_FILES
from compiler.diagnostics import error
from compiler.models import cache_entries
from compiler.models.exports import cached_export, export_path, metadata_key
from compiler.models.side_files import copyable
from compiler.safe_files import copy_regular, own_folder, read_json, replace_file

_OUTPUTS = {"bert": ["last_hidden_state", "pooler_output"]}


STAMP = cache_entries.MARKERS["exported"]  # beside a cached export: what it was made from, a digest of what was written


def export_folder(folder: Path, span=None) -> Path:
    """The ONNX export of `folder`, made now if it is not cached (or if the cached one is damaged, was
    swapped for another model's, or links outside its entry: such an entry is removed and made again)."""
    found = cached_export(folder)
    if found is not None:
        if not _reusable(found, folder):
            shutil.rmtree(found.parent, ignore_errors=True)
        elif cache_entries.use(found.parent):  # held until the compile ends: no other run's pruning removes it
            return found
    target = export_path(folder)
    # staged beside the entries, not in the system's temp folder: the moves below are renames, which fail across
    # file systems (a tmpfs /tmp, a cache on a scratch disk); a killed export's staging is pruned (cache_entries.py)
    staging = Path(tempfile.mkdtemp(dir=own_folder(target.parent.parent), prefix=cache_entries.STAGING_PREFIX))
    try:
        export_in_child(folder, staging / "model.onnx", span)
        own_folder(target.parent)
        for name in ("config.json", *TOKENIZER_FILES):  # what genai_config.json and the cache shapes read
            if copyable(folder, folder / name):  # a link to a file outside the model is never read
                copy_regular(folder / name, target.parent / name)  # nor one planted in the cache written through
        if (staging / "genai_config.json").is_file():  # the builder's (export_builder.py): genai's own settings
            os.replace(staging / "genai_config.json", target.parent / "genai_config.json")
        os.replace(staging / "model.onnx.data", target.parent / "model.onnx.data")
        os.replace(staging / "model.onnx", target)
        replace_file(target.parent / STAMP, json.dumps(_stamp(folder, target)))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    cache_entries.made(target.parent)
    return target


def _stamp(folder: Path, export: Path) -> dict:
    """The folder's cache key, the graph's digest, and the data file's size and a digest of its first and last
    MiB: a damaged entry, or one swapped for another model's export, does not match its folder's stamp."""
    data = export.with_name("model.onnx.data")
    size = data.stat().st_size
    digest = hashlib.sha256()
    with data.open("rb") as handle:
        digest.update(handle.read(1 << 20))
        handle.seek(max(size - (1 << 20), 0))
        digest.update(handle.read(1 << 20))
    return {"key": metadata_key(folder), "graph": hashlib.sha256(export.read_bytes()).hexdigest(),
            "data_bytes": size, "data_ends": digest.hexdigest()}


def _reusable(found: Path, folder: Path) -> bool:
    """Whether a cached export is the one made from `folder`, intact: regular files (no link out of the
    entry), its stamp matching, onnx's checks passing, and its weights of the folder's shapes."""
    from compiler.models import ModelError
    from compiler.models.hf_index import tensor_shapes
    from compiler.models.onnx_index import index_onnx

    data = found.with_name("model.onnx.data")
    if found.is_symlink() or data.is_symlink() or not data.is_file():
        return False
    try:
        if read_json(found.parent / STAMP, 64 << 20, own=True) != _stamp(folder, found):
            return False
        index_onnx(found, str(folder))
        shapes = tensor_shapes(folder, str(folder))
    except (OSError, ValueError, ModelError):
        return False
    import onnx

    graph = onnx.load(str(found), load_external_data=False).graph
    return all(sorted(t.dims) == sorted(shapes[t.name]) for t in graph.initializer if t.name in shapes)


@contextlib.contextmanager
def _quiet():
    """The export runs under qrc's progress bars: transformers' own bar and the tracer's warnings (about
    indexing patterns BERT does not use) would print into them."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            from transformers.utils import logging as hf_logging
        except ImportError:
            yield
            return
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        try:
            yield
        finally:
            hf_logging.set_verbosity(verbosity)
            hf_logging.enable_progress_bar()


def export_now(folder: Path, out: Path, span=None) -> None:
    """Export `folder` to `out` in this process (export_process runs it in a child), quietly."""
    with _quiet():
        _export(folder, out, span)


def _export(folder: Path, out: Path, span) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach a hub: the folder has everything
    try:
        import torch
        from transformers import AutoConfig, AutoModel
    except ImportError:
        raise BackendError(error("Q400", "exporting an HF folder to ONNX needs transformers", span, "backend onnx",
                                 help="pip install -e '.[hf]'")) from None
    config = AutoConfig.from_pretrained(folder)
    if builder_exports(folder, config.to_dict()):  # the class's defaults too (a head tied by default)
        try:
            export_with_builder(folder, out)
            _store_symbolic_shapes(out)
            return
        except (Exception, SystemExit):  # noqa: BLE001  # a folder the builder cannot export: the dynamo graph is
            pass  # as correct, only slower in onnxruntime-genai (its own failure, if any, is the diagnostic)
    if config.model_type in DECODER_FAMILIES:
        try:
            import onnxscript  # noqa: F401  (torch.onnx's dynamo exporter writes the graph with it)
        except ImportError:
            raise BackendError(error("Q400", "exporting a decoder folder to ONNX needs onnxscript (torch.onnx's "
                                     "dynamo exporter)", span, "backend onnx", help="pip install -e '.[hf]'")) from None
        export_decoder(folder, out)
        return
    if config.model_type not in _OUTPUTS:  # qrc check refuses these first (support.EXPORTABLE_FAMILIES)
        raise BackendError(error("Q415", f"the ONNX backend cannot export `{config.model_type}` folders to ONNX yet",
                                 span, "not exportable", help="use `backend torch` for this folder"))
    model = AutoModel.from_pretrained(folder, use_kernels=False).eval()  # the exporter traces transformers' modules

    class Wrapper(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.m = inner

        def forward(self, input_ids, attention_mask, token_type_ids):
            result = self.m(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            return result.last_hidden_state, result.pooler_output

    names = ["input_ids", "attention_mask", "token_type_ids"]
    example = tuple(torch.ones(1, 8, dtype=torch.long) for _ in names)
    axes = {n: {0: "batch", 1: "sequence"} for n in names}
    axes.update({"last_hidden_state": {0: "batch", 1: "sequence"}, "pooler_output": {0: "batch"}})
    raw = out.with_name("raw.onnx")
    with torch.no_grad():
        torch.onnx.export(Wrapper(model), example, str(raw), input_names=names, output_names=_OUTPUTS["bert"],
                          dynamic_axes=axes, opset_version=17, dynamo=False)
    _finish(raw, out)


def _finish(raw: Path, out: Path) -> None:
    """Drop the wrapper's `m.` prefix (names then match the folder's), move to opset 21 (blocked int4),
    and store the weights as external data."""
    import onnx
    from onnx import version_converter

    model = onnx.load(str(raw))
    rename = {t.name: t.name[2:] for t in model.graph.initializer if t.name.startswith("m.")}
    for t in model.graph.initializer:
        t.name = rename.get(t.name, t.name)
    for node in model.graph.node:
        node.name = "/" + node.name[3:] if node.name.startswith("/m/") else node.name
        node.input[:] = [rename.get(i, i) for i in node.input]
    model = version_converter.convert_version(model, 21)
    model.ir_version = min(model.ir_version, 10)
    onnx.save(model, str(out), save_as_external_data=True, all_tensors_to_one_file=True, location="model.onnx.data",
              size_threshold=1024)
    raw.unlink()
    del model
    _store_symbolic_shapes(out)


def _store_symbolic_shapes(out: Path) -> None:
    """Name every intermediate value's dims in the stored graph, with onnxruntime's symbolic shape inference:
    onnx's own leaves an attention's reshaped dims unknown in the TorchScript exporter's graphs (MiniLM's scores
    were `unk__31 × unk__32 × unk__20 × unk__24`), which the plan's liveness walk then sized as the sequence length
    each (64 MiB a chunk where they take 3; `batch × 12 × sequence × sequence` once named). It reads the small
    initializers (biases, constants: loaded into a weight-free copy of the graph), never the matrices. A failure
    leaves the graph as exported: the plan then over-counts, nothing else changes."""
    import math

    import onnx
    from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data

    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
    except ImportError:
        return
    light = onnx.load(str(out), load_external_data=False)
    probe = onnx.ModelProto()
    probe.CopyFrom(light)
    try:
        for tensor in probe.graph.initializer:
            if uses_external_data(tensor) and len(tensor.dims) <= 1 and math.prod(tensor.dims) <= 1 << 16:
                load_external_data_for_tensor(tensor, str(out.parent))
                tensor.data_location = onnx.TensorProto.DEFAULT
                del tensor.external_data[:]
        inferred = SymbolicShapeInference.infer_shapes(probe, auto_merge=True, guess_output_rank=False, verbose=0)
    except Exception:  # noqa: BLE001  # any failure of a best-effort annotation: the graph stays as exported
        return
    del light.graph.value_info[:]
    light.graph.value_info.extend(inferred.graph.value_info)
    onnx.save(light, str(out))
