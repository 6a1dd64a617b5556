"""Which *.safetensors files of an HF-style folder hold its weights: the ones transformers loads. A folder can hold
others beside them: Mistral's repositories ship `consolidated.safetensors` (the same weights under Mistral's own
names) beside the HF shards, a fine-tune keeps its `adapter_model.safetensors`, a download over an older one leaves
the shards of the older layout. Read as weights, such a file's tensors were listed, planned and quantized as layers
of the model, and the compile stopped at its end (Q426) on tensors transformers does not load, or, under the same
names, one file's values silently replaced the other's."""

from __future__ import annotations

from pathlib import Path

from compiler.models.errors import ModelError
from compiler.safe_files import UnsafePath, read_json

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
_MAX_INDEX_BYTES = 64 << 20  # an index names each tensor once: a few MB for the largest models
_INDEX_HELP = (f"fix or remove {INDEX}: transformers reads its `weight_map` (tensor name → shard file of this folder) "
               "to find the shards")


def weight_files(folder: Path, ref: str) -> list[Path]:
    """The files transformers loads the folder's weights from (its modeling_utils: `model.safetensors`, else the
    shards `model.safetensors.index.json`'s weight_map names), else every *.safetensors of the folder (a layout
    transformers does not load by itself: qrc reads what is there). The callers check each file (a folder or a
    FIFO by a weight file's name is Q250 there). Q250 for an index that is not a JSON object with a weight_map of
    names, or that names a file outside the folder or one that is not there."""
    single = folder / SINGLE
    if single.exists() or single.is_symlink():
        return [single]
    index = folder / INDEX
    if index.exists() or index.is_symlink():
        return [folder / name for name in _shard_names(index, ref)]
    return sorted(folder.glob("*.safetensors"))


def _shard_names(index: Path, ref: str) -> list[str]:
    """The shard file names the index's weight_map names, each a file of the index's folder."""
    try:  # a FIFO or a device by the index's name is refused, never waited on
        parsed = read_json(index, _MAX_INDEX_BYTES)
    except UnsafePath as exc:
        raise ModelError("Q250", exc.reason, _INDEX_HELP) from None
    except (OSError, ValueError) as exc:  # too large, not UTF-8, not JSON
        raise ModelError("Q250", f"`{ref}/{INDEX}` is not valid JSON ({exc})", _INDEX_HELP) from None
    weight_map = parsed.get("weight_map") if isinstance(parsed, dict) else None
    if not isinstance(weight_map, dict) or not weight_map or \
            not all(isinstance(name, str) for name in weight_map.values()):
        raise ModelError("Q250", f"`{ref}/{INDEX}` has no `weight_map` of tensor names to shard files", _INDEX_HELP)
    names = sorted(set(weight_map.values()))
    for name in names:
        if "/" in name or "\\" in name or name in ("", ".", ".."):  # transformers joins it to the folder's path
            raise ModelError("Q250", f"`{ref}/{INDEX}` names `{name[:80]}` as a shard, which is not a file name "
                             "in the folder", _INDEX_HELP)
        path = index.parent / name
        if not (path.exists() or path.is_symlink()):
            raise ModelError("Q250", f"`{ref}/{INDEX}` names the shard `{name[:80]}`, which is not in the folder",
                             "download or copy the missing shard (a download cut short leaves some out)")
    return names
