"""`data dataset … { image "COL" }`: image + prompt rows for a vision-language model, run through the model
folder's own processor (transformers' AutoProcessor), so that the language blocks are calibrated on the image
tokens the vision tower produces, as in serving.

Each row is one sample: its prompt is rendered by the processor's chat template around one image, and the
processor's outputs (token ids with the image's placeholder tokens expanded, the mask, pixel values, …) are
padded to `seqlen`. Processors that give one row per sample (LLaVA's, Gemma 3's) are batched; one that
flattens every image's patches into one array (Qwen2-VL's) is refused with a coded error rather than fed
wrongly. The image column holds what `datasets` gives for an Image feature (a decoded image, or its bytes and
path) or a path, relative to the dataset's folder."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from compiler.data.dataset_schema import TEMPLATE_FILES, local_folder, tokenizer_location
from compiler.data.rows import TokenRows, no_template
from compiler.data.templates import TemplateRenderer
from compiler.diagnostics import StageError, error
from compiler.ir.types import DataSource
from compiler.models.side_files import linked_outside
from compiler.safe_files import regular_input


def image_rows(source: DataSource, model_ref: str, rows: Iterator[tuple[Any, Any]], needed: int) -> TokenRows:
    """The first `needed` (image, prompt) rows through the processor, padded to seqlen."""
    processor = load_processor(source, model_ref)
    where = local_folder(source)  # image paths in the rows are relative to the dataset's folder
    folder = where if where is not None and where.is_dir() else where.parent if where is not None else Path(".")
    found: list[dict[str, np.ndarray]] = []
    location = tokenizer_location(source, model_ref)
    assert location is not None  # load_processor found it
    with TemplateRenderer(processor, location, source.span_of("image") or source.span_of("data"),
                          generation_prompt=True) as renderer:
        for number, (image, prompt) in enumerate(rows):
            if len(found) >= needed:
                break
            found.append(_encoded(source, processor, renderer, _image(source, image, number, folder),
                                  _prompt(source, prompt, number), number))
    if not found:
        return TokenRows(np.zeros((0, source.seqlen), np.int64), np.zeros((0, source.seqlen), np.int64))
    stacked = {name: np.concatenate([row[name] for row in found]) for name in found[0]}
    ids, mask = stacked.pop("input_ids").astype(np.int64), stacked.pop("attention_mask").astype(np.int64)
    return TokenRows(ids, mask, stacked)


def load_processor(source: DataSource, model_ref: str):
    """The processor of the model folder (or of `tokenizer`, a folder), with its chat template."""
    span = source.span_of("image") or source.span_of("data")
    location = tokenizer_location(source, model_ref)
    if location is None or not location.is_dir():
        raise StageError(error("Q216", "`image` rows need the model's processor: no folder with one", span,
                               "no processor", help='give the model folder, or `tokenizer "FOLDER"` with its '
                               "processor_config.json"))
    outside = linked_outside(location, [location / name for name in (*TEMPLATE_FILES, "processor_config.json",
                                                                      "tokenizer.json", "tokenizer_config.json")])
    if outside:  # transformers would read what the link points to
        raise StageError(error("Q401", f"`{outside[0]}` links outside the processor folder `{location}`", span,
                               "links outside", help="copy the file into the folder; qrc reads no file a model "
                               "folder only links to"))
    try:
        from transformers import AutoProcessor

        processor = AutoProcessor.from_pretrained(str(location), local_files_only=True)
    except ImportError:
        raise StageError(error("Q400", "`image` rows need transformers and Pillow", span, "missing package",
                               help="pip install -e '.[hf]'")) from None
    except Exception as exc:  # transformers raises many types for a folder without a processor
        raise StageError(error("Q401", f"cannot load the processor at `{location}` ({type(exc).__name__}: "
                               f"{str(exc)[:120]})", span, "unreadable",
                               help="a VLM folder with processor_config.json (or preprocessor_config.json)")) from None
    if not hasattr(processor, "image_processor"):
        raise StageError(error("Q401", f"`{location}` has a tokenizer but no image processor", span, "not a VLM",
                               help="`image` rows calibrate vision-language models; read text with `text`"))
    if not getattr(processor, "chat_template", None):
        raise StageError(no_template(source, location))
    return processor


def _image(source: DataSource, value: Any, number: int, folder: Path):
    """A row's image as PIL: decoded by `datasets`, given as bytes, or a path (absolute, or in `folder`)."""
    from PIL import Image

    if isinstance(value, Image.Image):
        return value.convert("RGB")
    try:
        if isinstance(value, dict) and value.get("bytes"):
            return Image.open(io.BytesIO(value["bytes"])).convert("RGB")
        path = value.get("path") if isinstance(value, dict) else value
        if isinstance(path, str) and path:
            if not regular_input(folder / path):  # a FIFO would block the reader; a folder is no image
                raise OSError(f"`{path}` is not a regular file")
            return Image.open(folder / path).convert("RGB")  # an absolute path replaces `folder`
    except (OSError, Image.DecompressionBombError) as exc:  # a 40000×40000 row is refused, not decoded
        raise StageError(error("Q401", f"dataset `{source.path}`: the image of row {number} cannot be read "
                               f"({type(exc).__name__}: {str(exc)[:80]})", source.span_of("image"), "unreadable image",
                               help="a PNG/JPEG path (relative to the dataset's folder) or an Image column")) from None
    assert source.rows is not None  # image rows come from `data dataset`
    raise StageError(error("Q434", f"dataset `{source.path}`: column `{source.rows.image}` of "
                           f"row {number} holds {type(value).__name__}, not an image", source.span_of("image"),
                           "not an image", help="an image path, or a `datasets` Image column"))


def _prompt(source: DataSource, value: Any, number: int) -> str:
    if isinstance(value, str):
        return value
    assert source.rows is not None  # image rows come from `data dataset`
    raise StageError(error("Q434", f"dataset `{source.path}`: column `{source.rows.field}` of "
                           f"row {number} holds {type(value).__name__}, not a prompt", source.span_of("text"),
                           "not text", help="the text column holds each image's prompt"))


def _encoded(source: DataSource, processor, renderer: TemplateRenderer, image, prompt: str,
             number: int) -> dict[str, np.ndarray]:
    """One row through the processor: its chat template (rendered as untrusted code, data/templates.py) around
    the image and prompt, padded to seqlen."""
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
    text = renderer.render(messages, number)
    encoded = dict(processor(images=[image], text=[text], padding="max_length", max_length=source.seqlen,
                             return_tensors="np"))
    length = encoded["input_ids"].shape[-1]
    if length > source.seqlen:
        raise StageError(error("Q403", f"dataset `{source.path}`: row {number} takes {length} tokens with its image's; "
                               f"seqlen is {source.seqlen}", source.span_of("seqlen") or source.span_of("data"),
                               "image row too long", help=f"set `seqlen {length}` or more (an image's tokens "
                               "cannot be cut)"))
    uneven = [name for name, array in encoded.items() if array.ndim == 0 or array.shape[0] != 1]
    if uneven:
        rows = encoded[uneven[0]].shape[0] if encoded[uneven[0]].ndim else 0
        raise StageError(error("Q403", f"the processor gives `{uneven[0]}` with {rows} rows for one sample: qrc "
                               "batches processors that give one row per sample (LLaVA's, Gemma 3's)",
                               source.span_of("image"), "not one row a sample",
                               help="calibrate this model on text rows (`text`), which needs no processor"))
    return {name: np.asarray(array) for name, array in encoded.items()}
