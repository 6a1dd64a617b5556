"""The files onnxruntime-genai reads beside a decoder: `genai_config.json` (which graph inputs are the ids,
the mask and the cache, the model's numbers, search defaults) and the tokenizer. A model from
onnxruntime-genai's builder carries its own, which is kept true (its `filename` becomes the emitted
model's); a decoder exported elsewhere (optimum, torch.onnx, qrc's own export) gets one written from
its config.json and its graph's input names, so `og.Model(folder)` loads qrc's output either way."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from compiler.models.inputs import InputRole, has_cache, role_of
from compiler.models.onnx_index import json_object
from compiler.models.side_files import copyable

# what onnxruntime-genai needs or reads beside the model, copied when the source folder has them
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                   "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja")  # transformers 5's own file
# transformers model types onnxruntime-genai runs as decoders (its `model.type`)
GENAI_TYPES = ("llama", "mistral", "granite", "qwen2", "qwen3", "olmo", "gemma2", "gemma3_text", "phi3")


def side_files(source: Path, output_name: str, index) -> dict[str, bytes]:
    """File name → bytes to write beside the emitted model (empty when the model is not a decoder that
    onnxruntime-genai can run)."""
    folder = source.parent
    config = _genai_config(folder, output_name, index)
    if config is None:
        return {}
    files = {"genai_config.json": (json.dumps(config, indent=4) + "\n").encode()}
    # regular files resolving inside the model's folder only: a link to a secret is never read (side_files.py)
    files.update({name: (folder / name).read_bytes() for name in TOKENIZER_FILES if copyable(folder, folder / name)})
    return files


def others_beside(destination: Path, files: dict[str, bytes]) -> list[str]:
    """The files of `files` already beside `destination` that another model owns: they differ from what this
    compile would write, and the folder's `genai_config.json` does not name `destination` (an earlier compile
    of this output wrote the set, and replacing it is this compile's to do). onnxruntime-genai loads one
    decoder a folder, so a second decoder emitted there would repoint the first one's `genai_config.json`
    and swap its tokenizer; those files are then kept and none of this output's is written."""
    folder = destination.parent
    config = folder / "genai_config.json"
    decoder = _decoder(json_object(config)) if config.is_file() and not config.is_symlink() else None
    if decoder is not None and decoder.get("filename") == destination.name:
        return []
    return sorted(name for name, data in files.items() if _differs(folder / name, data))


def _differs(path: Path, data: bytes) -> bool:
    """Whether `path` holds something other than `data` (a link or a special file always does: never read)."""
    if not os.path.lexists(path):
        return False
    if path.is_symlink() or not path.is_file() or path.stat().st_size != len(data):
        return True
    return path.read_bytes() != data


def _genai_config(folder: Path, output_name: str, index) -> dict | None:
    carried = json_object(folder / "genai_config.json")
    decoder = _decoder(carried)
    if decoder is not None:
        decoder["filename"] = output_name
        return carried
    return _written(json_object(folder / "config.json"), output_name, index)


def _decoder(config: dict) -> dict | None:
    """A genai_config.json's `model.decoder` section (the graph's file name, inputs, outputs), if it has one."""
    model = config.get("model")
    return model["decoder"] if isinstance(model, dict) and isinstance(model.get("decoder"), dict) else None


def _positive(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _runs_as_decoder(hf: dict, cached: bool) -> bool:
    """Whether genai runs a decoder of this config.json: a type it runs, a key/value cache, the numbers it reads."""
    return (hf.get("model_type") in GENAI_TYPES and cached and _positive(hf.get("num_attention_heads"))
            and _positive(hf.get("hidden_size")) and _positive(hf.get("num_hidden_layers")))


def _written(hf: dict, output_name: str, index) -> dict | None:
    """A genai_config.json for a decoder with a cache whose config.json names a type genai runs."""
    if not _runs_as_decoder(hf, has_cache(index)):
        return None
    heads, hidden = hf.get("num_attention_heads"), hf.get("hidden_size")
    assert isinstance(hidden, int) and isinstance(heads, int)  # _positive: whole numbers above 0
    numbers = {"head_size": hf.get("head_dim") or hidden // heads, "hidden_size": hidden,
               "num_attention_heads": heads, "num_hidden_layers": hf.get("num_hidden_layers"),
               "num_key_value_heads": hf.get("num_key_value_heads") or heads}
    decoder = {"session_options": {"log_id": "onnxruntime-genai", "provider_options": []}, "filename": output_name,
               **numbers, "inputs": _inputs(index), "outputs": _outputs(index)}
    context = hf.get("max_position_embeddings", 2048)
    model = {"bos_token_id": _token(hf, "bos_token_id"), "context_length": context, "decoder": decoder,
             "eos_token_id": _token(hf, "eos_token_id"), "pad_token_id": hf.get("pad_token_id") or 0,
             "type": hf["model_type"].removesuffix("_text"), "vocab_size": hf.get("vocab_size")}
    return {"model": model, "search": {"do_sample": False, "max_length": context, "num_beams": 1,
                                       "past_present_share_buffer": False}}


def _token(hf: dict, key: str):
    """A special token id (a list for several end tokens); 0 where the config has none (genai needs one)."""
    value = hf.get(key)
    return value if isinstance(value, (int, list)) else 0


def _inputs(index) -> dict[str, str]:
    fields = {InputRole.TOKENS: "input_ids", InputRole.MASK: "attention_mask", InputRole.POSITIONS: "position_ids"}
    found: dict[str, str] = {}
    for info in index.inputs:
        field = fields.get(role_of(info))
        if field:
            found.setdefault(field, info.name)
    found.update(_cache_patterns([i.name for i in index.inputs], "past_key_names", "past_value_names"))
    return found


def _outputs(index) -> dict[str, str]:
    names = [o.name for o in index.outputs]
    return {"logits": names[0], **_cache_patterns(names, "present_key_names", "present_value_names")}


def _cache_patterns(names: list[str], key_field: str, value_field: str) -> dict[str, str]:
    """`past_key_values.0.key` … → `past_key_values.%d.key` (genai's printf pattern for layer N)."""
    out = {}
    for kind, field in (("key", key_field), ("value", value_field)):
        first = next((n for n in names if re.search(rf"\.0\.{kind}$", n)), None)
        if first:
            out[field] = first[: -len(f".0.{kind}")] + f".%d.{kind}"
    return out


def genai_runs(folder: Path, index, exported_with_cache: bool | None = None) -> bool:
    """Whether a decoder read from `folder` gets onnxruntime-genai's files (its own genai_config.json carried
    over, or one written from config.json): JSON only, no weights (`qrc check`'s runtime table).
    `exported_with_cache`: qrc's own export of an HF folder, not made yet, will have a key/value cache."""
    if _decoder(json_object(folder / "genai_config.json")) is not None:
        return True
    cached = has_cache(index) if exported_with_cache is None else exported_with_cache
    return _runs_as_decoder(json_object(folder / "config.json"), cached)
