"""A folder the plan counts as disk that lies on a tmpfs: `qrc check` says its files are held in RAM (Q453).
The mount table is a file written here, so the cases do not depend on how this machine mounts /tmp."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from compiler import ram_folders
from compiler.cli import app

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


@pytest.fixture
def ram(tmp_path, monkeypatch) -> Path:
    """A folder the mount table says is a tmpfs (its name with a space, escaped as mountinfo writes it), a disk
    mounted inside it, and the root a disk."""
    folder = tmp_path / "in memory"
    (folder / "disk").mkdir(parents=True)
    real = str(folder.resolve())
    table = tmp_path / "mountinfo"
    table.write_text("22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
                     f"40 22 0:40 / {real.replace(' ', chr(92) + '040')} rw,nosuid shared:9 - tmpfs tmpfs rw\n"
                     f"41 40 8:2 / {real.replace(' ', chr(92) + '040')}/disk rw - xfs /dev/sdb1 rw\n")
    monkeypatch.setattr(ram_folders, "MOUNTINFO", table)
    return folder


def test_the_deepest_mount_decides(ram, tmp_path):
    assert ram_folders.memory_filesystem(ram) == "tmpfs"
    assert ram_folders.memory_filesystem(ram / "not yet made" / "below") == "tmpfs"  # where it would be made
    assert ram_folders.memory_filesystem(ram / "disk" / "cache") is None
    assert ram_folders.memory_filesystem(tmp_path) is None


def test_an_unreadable_mount_table_says_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(ram_folders, "MOUNTINFO", tmp_path / "missing")
    assert ram_folders.memory_filesystem(tmp_path) is None


def _check(*sets: str, recipe: Path = ROOT / "recipes" / "tiny-llama-torch-w4a16.recipe"):
    args = ["check", str(recipe)]
    for item in sets:
        args += ["--set", item]
    return runner.invoke(app, args)


def test_disk_on_a_tmpfs_is_q453(ram):
    result = _check("memory.mode=offload", f'memory.disk="{ram / "cache"}"')
    assert result.exit_code == 0, result.output
    assert "warning[Q453]" in result.output and "is on a tmpfs" in result.output, result.output
    assert "give `disk` a folder on a disk" in result.output


def test_disk_on_a_disk_says_nothing(ram):
    result = _check("memory.mode=offload", f'memory.disk="{ram / "disk" / "cache"}"')
    assert result.exit_code == 0 and "Q453" not in result.output, result.output


@pytest.fixture
def smoothed_recipe(tmp_path) -> Path:
    text = (ROOT / "recipes" / "tiny-llama-w8a8.recipe").read_text()
    path = tmp_path / "smoothed.recipe"
    path.write_text(text.replace("    quantize {", "    transform smoothquant { alpha 0.5 }\n\n    quantize {", 1))
    return path


def test_the_onnx_copy_in_a_tmpfs_temporary_folder_is_q453(ram, smoothed_recipe, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(ram))
    result = _check(recipe=smoothed_recipe)
    assert result.exit_code == 0, result.output
    assert "warning[Q453]" in result.output and "the smoothed copy of the model" in result.output, result.output
    assert "held in RAM" in result.output and "set TMPDIR" in result.output
    elsewhere = _check(f'memory.disk="{ram / "disk" / "copies"}"', recipe=smoothed_recipe)  # the copy goes there
    assert elsewhere.exit_code == 0 and "Q453" not in elsewhere.output, elsewhere.output


def _inline_model(folder: Path) -> Path:
    """A one-MatMul model whose 16 KiB weight is inside the .onnx file."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.RandomState(0).standard_normal((64, 64)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "fc1.weight"], ["y"], name="/fc1/MatMul")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64])],
                              [numpy_helper.from_array(w, "fc1.weight")])
    path = folder / "inline.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), str(path))
    return path


def test_the_split_of_inline_weights_in_a_tmpfs_temporary_folder_is_q453(ram, tmp_path, monkeypatch):
    recipe = tmp_path / "inline.recipe"
    recipe.write_text(f'recipe inline {{\n    model "{_inline_model(tmp_path)}"\n'
                      f'    quantize {{ type Linear -> W8A16 }}\n    emit "{tmp_path / "out.onnx"}"\n}}\n')
    monkeypatch.setattr(tempfile, "tempdir", str(ram))
    result = _check(recipe=recipe)
    assert result.exit_code == 0, result.output
    assert "warning[Q453]" in result.output and "the split of the model's weights" in result.output, result.output
    assert "16.0" in result.output  # its 16 KiB (64 x 64 float32) and a few bytes of header
    monkeypatch.setattr(tempfile, "tempdir", str(ram / "disk"))
    assert "Q453" not in _check(recipe=recipe).output
