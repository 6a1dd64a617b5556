"""A dense HF decoder folder exported with torch.onnx's dynamo exporter (torch.export + onnxscript), the
exporter PyTorch maintains, with a key/value cache: the graph takes what optimum and onnxruntime-genai
graphs take (`input_ids`, `attention_mask`, `position_ids`, `past_key_values.N.key/value`) and returns
`logits` and `present.N.key/value`, so the quantized model decodes with a cache in any runtime.

transformers' own modules run inside the export (its cache class included): qrc only flattens the cache
to tensors at the graph boundary, which the exporter needs."""

from __future__ import annotations

from pathlib import Path

# Families whose tiny random models export and match transformers' logits with an empty and a filled
# cache (tests/test_onnx_decoders.py). MoE and MLA decoders and VLMs are refused at `check` (Q415).
DECODER_FAMILIES = ("llama", "mistral", "granite", "qwen2", "qwen3", "olmo2", "gemma2", "gemma3_text", "phi3")
WRAPPER = "m."  # the prefix the flattening wrapper gives every parameter name
EXAMPLE = dict(batch=2, sequence=5, past=3)  # the traced shapes; all three axes are exported as dynamic


def cache_names(layers: int, prefix: str) -> list[str]:
    """`prefix.N.key`, `prefix.N.value` for every layer, in the order the graph takes them."""
    return [f"{prefix}.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]


def export_decoder(folder: Path, out: Path, dtype: str = "float32") -> None:
    """Export the decoder in `folder` to `out` (opset 21, weights named as in the folder, as external data
    in `out`.data), its weights and activations in `dtype` (float32, float16 or bfloat16)."""
    import torch
    from transformers import AutoModelForCausalLM

    # transformers' own modules, which the exporter traces: not the hub kernels transformers 5.25 swaps in by default
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype), use_kernels=False).eval()
    config = model.config.get_text_config()
    layers = config.num_hidden_layers
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    wrapper = _flattened(model, layers)
    b, s, p = EXAMPLE["batch"], EXAMPLE["sequence"], EXAMPLE["past"]
    example = (torch.randint(0, config.vocab_size, (b, s)), torch.ones(b, p + s, dtype=torch.long),
               torch.arange(p, p + s).expand(b, s).contiguous(),
               # distinct tensors: the tracer treats one object passed twice as one input
               [torch.randn(b, kv_heads, p, head_dim, dtype=model.dtype) for _ in range(2 * layers)])
    batch, sequence = torch.export.Dim("batch"), torch.export.Dim("sequence")
    past, total = torch.export.Dim("past_sequence_length"), torch.export.Dim("total_sequence_length")
    shapes = {"input_ids": {0: batch, 1: sequence}, "attention_mask": {0: batch, 1: total},
              "position_ids": {0: batch, 1: sequence}, "past": [{0: batch, 2: past}] * (2 * layers)}
    names = ["input_ids", "attention_mask", "position_ids", *cache_names(layers, "past_key_values")]
    outputs = ["logits", *cache_names(layers, "present")]
    with torch.no_grad():
        program = torch.onnx.export(wrapper, example, dynamic_shapes=shapes, dynamo=True, input_names=names,
                                    output_names=outputs, opset_version=21, verbose=False)
    import onnx

    # the program's proto is renamed in memory and written once, in its final form: loading it again to
    # rename or convert it held the model two to three more times (5.7 GiB for a 0.6 GiB decoder)
    assert program is not None  # the dynamo exporter returns its program (or raises)
    model = program.model_proto
    del program
    _name_weights(model, wrapper)
    _name_nodes(model)
    model.ir_version = min(model.ir_version, 10)  # onnxruntime's highest
    onnx.save(model, str(out), save_as_external_data=True, all_tensors_to_one_file=True, location=out.name + ".data",
              size_threshold=1024)


def _name_weights(model, wrapper) -> None:
    """The dynamo exporter folds each Linear's transposed weight into a new initializer (`val_90`), losing the
    parameter's name, and merges parameters of equal values (the norms of a freshly initialised model) into
    one initializer read by several nodes. Both would cost the recipe its names (and a transform its
    per-norm weights): each initializer equal to parameters (or their transposes) takes their names back,
    and a merged one is split again, its readers taking the parameters in the order the forward pass runs
    them (graph order is execution order)."""
    import numpy as np
    from onnx import numpy_helper

    by_value: dict[str, list[str]] = {}
    for name, param in wrapper.named_parameters():  # module order: the order the forward pass uses them
        name = name.removeprefix(WRAPPER)
        values = param.detach().cpu()
        if values.dim() not in (1, 2):
            continue
        by_value.setdefault(_digest(_bytes(values), values.shape, values.element_size()), []).append(name)
        if values.dim() == 2:
            by_value.setdefault(_digest(_bytes(values.T), values.T.shape, values.element_size()), []).append(name)
    readers: dict[str, list] = {}
    for node in model.graph.node:
        for i, value in enumerate(node.input):
            readers.setdefault(value, []).append((node, i))
    copies = []
    for tensor in model.graph.initializer:
        if tensor.dims and len(tensor.dims) <= 2:
            array = np.ascontiguousarray(numpy_helper.to_array(tensor))
            names = by_value.get(_digest(array.tobytes(), array.shape, array.itemsize), [])
            copies += _rename(tensor, names, readers.get(tensor.name, []))
    model.graph.initializer.extend(copies)
    for tensor in model.graph.initializer:  # what matched no parameter (buffers) loses the wrapper's prefix too
        if tensor.name.startswith(WRAPPER):
            _point(readers.get(tensor.name, []), tensor.name, tensor.name[len(WRAPPER):])
            tensor.name = tensor.name[len(WRAPPER):]


def _name_nodes(model) -> None:
    """Each node's name gets the module it runs in, as the TorchScript exporter names them
    (`/model/layers.0/self_attn/node_MatMul_239`): the dynamo exporter's names (`node_MatMul_239`) say no
    block, and offload cuts the graph into blocks by node name (plan/activations.py `segment_runs`): without
    this, a qrc-exported decoder ran whole in offload, every weight in one session. The module is the
    innermost of the wrapper's scopes the exporter records in each node's metadata."""
    import ast

    for node in model.graph.node:
        scopes = next((p.value for p in node.metadata_props if p.key == "pkg.torch.onnx.name_scopes"), "[]")
        try:
            found = ast.literal_eval(scopes)
        except (ValueError, SyntaxError):  # metadata of another exporter version: the name is left as it was
            continue
        modules = [s for s in found if isinstance(s, str) and s.startswith(WRAPPER)] if isinstance(found, list) else []
        if modules:  # the scopes run outermost first
            node.name = "/" + modules[-1][len(WRAPPER):].replace(".", "/") + "/" + node.name


def _digest(data: bytes, shape, itemsize: int) -> str:
    """Values compared by their bytes (bfloat16 has no numpy type on the torch side)."""
    import hashlib

    return f"{hashlib.sha256(data).hexdigest()}{tuple(shape)}{itemsize}"


def _bytes(tensor) -> bytes:
    import torch

    return tensor.contiguous().view(torch.uint8).numpy().tobytes()


def _rename(tensor, names: list[str], readers: list) -> list:
    """Name `tensor` after its parameter; where one tensor stands for as many parameters as it has readers,
    each reader gets a copy named after its own. Returns the copies."""
    import onnx

    if len(names) == 1:
        _point(readers, tensor.name, names[0])
        tensor.name = names[0]
    if len(names) <= 1 or len(readers) != len(names):  # no parameter, one, or readers qrc cannot pair
        return []
    copies = []
    for (node, index), name in zip(readers, names, strict=True):
        node.input[index] = name
        if name != names[0]:
            copy = onnx.TensorProto()
            copy.CopyFrom(tensor)
            copy.name = name
            copies.append(copy)
    tensor.name = names[0]
    return copies


def _point(readers: list, old: str, new: str) -> None:
    for node, index in readers:
        if node.input[index] == old:
            node.input[index] = new


def _flattened(model, layers: int):
    """`model` with its cache as a flat list of tensors in and out (the graph's inputs and outputs)."""
    import torch
    from transformers import DynamicCache

    class CacheFlattened(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model  # `m.` is dropped from the weight names after export (WRAPPER, _name_weights)

        def forward(self, input_ids, attention_mask, position_ids, past):
            cache = DynamicCache(config=model.config)
            for i in range(layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.m(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=cache, use_cache=True)
            present = [t for layer in out.past_key_values.layers[:layers] for t in (layer.keys, layer.values)]
            return (out.logits, *present)

    return CacheFlattened()
