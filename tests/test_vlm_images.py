"""`data dataset … { image "COL"  text "COL" }`: a VLM calibrated on image + prompt rows through its own
processor, so that its language blocks see the image tokens' hidden states; the vision tower stays float.
Built here: a tiny LLaVA from a transformers config (random weights), a processor around the shipped tokenizer
with an `<image>` token, and generated PNG images."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("datasets")
pytest.importorskip("PIL")

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ("{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>{% if message['content'] is string %}"
            "{{ message['content'] }}{% else %}{% for part in message['content'] %}{% if part['type'] == 'image' %}"
            "<image>{% else %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}{{ eos_token }}{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
PROMPTS = ["What is in the picture?", "Describe the colours.", "Is it day or night?", "Count the shapes."]


@pytest.fixture(scope="module")
def llava(tmp_path_factory) -> Path:
    """A tiny LLaVA folder with its processor and 12 generated image rows beside it (zoo.tiny_llava)."""
    from zoo import tiny_llava

    return tiny_llava(tmp_path_factory.mktemp("vlm"), TEMPLATE, PROMPTS)


def recipe(root: Path, backend: str = "torch", data: str = 'image "image"  text "prompt"', name: str = "r",
           rows: str = "images.jsonl", samples: int = 8) -> Path:
    path = root / f"{name}-{backend}.recipe"
    path.write_text(f'recipe vlm {{\n    model "{root / "llava"}"\n    backend {backend}\n'
                    '    quantize { "language_model.model.layers.*" -> W8A8_STATIC }\n'
                    f'    calibrate {{ data dataset "{root / rows}" {{ {data}  samples {samples}  seqlen 48 }}  chunk 4 }}\n'
                    f'    verify {{ samples 4 }}\n    emit "{root / "out"}"\n}}\n')
    return path


@pytest.mark.slow
def test_a_vlm_calibrates_on_images_through_its_processor(llava):
    """The samples carry pixel values and the image's 16 tokens; the compile passes verification on held-out
    image rows (the emitted folder as transformers loads it); the vision tower stays float; and the first
    language block's static input range is the one transformers' own float model gives on the same image
    feeds (a forward hook), so the image tokens' hidden states were calibrated on."""
    import torch
    import transformers
    from compiling import compile_
    from safetensors import safe_open

    from compiler.data import calibration_batches
    from compiler.frontend import check_file
    from compiler.models import index_model

    path = recipe(llava)
    result = compile_(str(path), llava / "out")
    assert result.exit_code == 0 and "passed" in result.output, result.output
    ir = check_file(path).ir
    assert ir is not None
    feeds = list(calibration_batches(ir.calibration.data, index_model(ir.model), 4))
    image_token = transformers.AutoConfig.from_pretrained(str(llava / "llava")).image_token_index
    assert all(f["pixel_values"].shape == (4, 3, 32, 32) for f in feeds)
    assert all((f["input_ids"] == image_token).sum(axis=1).tolist() == [16] * 4 for f in feeds)

    model = transformers.AutoModelForImageTextToText.from_pretrained(str(llava / "llava")).eval()
    seen: list[tuple[float, float]] = []
    layer = model.model.language_model.layers[0].self_attn.q_proj
    hook = layer.register_forward_pre_hook(lambda _, args: seen.append((float(args[0].min()), float(args[0].max()))))
    with torch.no_grad():
        for feed in feeds:
            model(**{k: torch.from_numpy(v) for k, v in feed.items()})
    hook.remove()
    low, high = min(s[0] for s in seen), max(s[1] for s in seen)
    with safe_open(str(llava / "out" / "model.safetensors"), "pt") as f:
        scale = float(f.get_tensor("language_model.model.layers.0.self_attn.q_proj.input_scale"))
        assert not any(k.startswith("vision_tower") and k.endswith("weight_scale") for k in f.keys())
    assert scale == pytest.approx((max(high, 0) - min(low, 0)) / 255, rel=1e-4)


def test_image_rows_are_checked_before_any_work(llava):
    """A missing image column is Q434 at `image`; image rows on the ONNX backend, or packed, are refused."""
    from typer.testing import CliRunner

    from compiler.cli import app

    runner = CliRunner()
    cases = ((recipe(llava, data='image "picture"  text "prompt"', name="column"), "Q434"),
             (recipe(llava, "onnx", name="onnx"), "Q222"),
             (recipe(llava, data='image "image"  text "prompt"  rows pack', name="pack"), "Q222"))
    for path, code in cases:
        result = runner.invoke(app, ["check", str(path)])
        assert result.exit_code == 2 and f"error[{code}]" in result.output, result.output


@pytest.mark.slow  # two image pipelines through the processor: 2.4 s of the quick loop
def test_a_folder_of_images_gives_the_same_samples(llava):
    """A folder of images with a metadata.jsonl of prompts (what `datasets` reads as an imagefolder, the image
    decoded into its Image column) gives the pixel values and tokens of the JSONL that names the same files."""
    from compiler.data import calibration_batches
    from compiler.frontend import check_file
    from compiler.models import index_model

    def samples(path: Path) -> list[tuple[bytes, bytes]]:
        ir = check_file(path).ir
        assert ir is not None
        feeds = list(calibration_batches(ir.calibration.data, index_model(ir.model), 8))
        return sorted((f["pixel_values"][i].tobytes(), f["input_ids"][i].tobytes()) for f in feeds for i in range(len(f["input_ids"])))

    from_folder = samples(recipe(llava, name="folder", rows="folder", samples=12))
    from_rows = samples(recipe(llava, name="rows", samples=12))
    assert len(from_folder) == 12 and from_folder == from_rows


@pytest.mark.slow  # seconds each (tests/run.sh keeps the quick loop under 3 minutes)
@pytest.mark.parametrize("row", ["bomb", "fifo"])
def test_an_image_row_that_is_a_bomb_or_a_fifo_is_q401(llava, row, tmp_path):
    """A 40000×40000 PNG (a few hundred KB on disk, 4.8 GB decoded) and a FIFO named as an image: Q401 naming
    the row, at once, with nothing written."""
    import os
    import shutil
    import threading

    from PIL import Image
    from typer.testing import CliRunner

    from compiler.cli import app

    root = tmp_path / "root"
    root.mkdir()
    (root / "llava").symlink_to(llava / "llava")
    for i in range(12):
        shutil.copy(llava / f"{i}.png", root / f"{i}.png")
    os.remove(root / "3.png")
    if row == "bomb":
        Image.new("1", (40000, 40000)).save(root / "3.png")
    else:
        os.mkfifo(root / "3.png")
    shutil.copy(llava / "images.jsonl", root / "images.jsonl")
    release = threading.Timer(60, lambda: open(root / "3.png", "w").close()) if row == "fifo" else None  # noqa: SIM115
    if release is not None:
        release.start()
    try:
        result = CliRunner().invoke(app, ["compile", str(recipe(root, samples=12))])
    finally:
        if release is not None:
            release.cancel()
    assert result.exit_code == 2 and "Q401" in result.output and "row 3" in result.output, result.output
    assert not (root / "out").exists()


def test_the_processors_template_renders_as_transformers_does(llava):
    """Image rows' prompts go through the processor's chat template in qrc's template child (deadline, caps):
    the same text the processor's own apply_chat_template gives."""
    from transformers import AutoProcessor

    from compiler.data.templates import TemplateRenderer

    processor = AutoProcessor.from_pretrained(str(llava / "llava"), local_files_only=True)
    with TemplateRenderer(processor, llava / "llava", None, generation_prompt=True) as renderer:
        for prompt in PROMPTS:
            messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
            assert renderer.render(messages, 0) == processor.apply_chat_template(messages, add_generation_prompt=True)
