"""The model on disk during a compile: a weight-free ModelProto in memory, weights read one at a time
from external data. A model whose weights are inside the .onnx file is first split into a temporary
model + data pair, so that no phase holds a second copy of the weights in Python."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from compiler.models.onnx_write import INLINE_LIMIT, inline_size
from compiler.safe_files import own_folder


@dataclass
class ModelFiles:
    """The model being compiled: its path and its weight-free graph."""
    path: Path  # the .onnx file whose initializers are external
    light: onnx.ModelProto  # the graph with initializer headers only
    _scratch: Path | None = None

    @property
    def base_dir(self) -> Path:
        """The folder the external data is read from."""
        return self.path.parent

    def array(self, tensor: onnx.TensorProto) -> np.ndarray:
        """One initializer's values, read from the data file."""
        return numpy_helper.to_array(tensor, base_dir=str(self.base_dir))

    def close(self) -> None:
        """Remove the scratch copy made for a model whose weights were inside the .onnx."""
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)


def new_scratch(prefix: str, where: Path | None) -> Path:
    """A new folder for a copy of the model: under `where` (the recipe's `memory { disk }`, made if missing), else
    in the temporary folder."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=own_folder(where) if where is not None else None))


def open_model(source: Path, where: Path | None = None) -> ModelFiles:
    """Open `source` graph-only; a model with inline weights is first split into model + data in a scratch folder
    (under `where`: the recipe's `memory { disk }`; else the temporary folder)."""
    light = onnx.load(str(source), load_external_data=False)
    if not any(inline_size(t) > INLINE_LIMIT for t in light.graph.initializer):
        return ModelFiles(source, light)
    scratch = new_scratch("qrc-model-", where)
    split = scratch / source.name
    onnx.save(light, split, save_as_external_data=True, all_tensors_to_one_file=True,
              location=source.name + ".data", size_threshold=INLINE_LIMIT)
    del light
    return ModelFiles(split, onnx.load(str(split), load_external_data=False), scratch)


def load_remaining(model: onnx.ModelProto, base_dir: Path) -> None:
    """Bring the still-external initializers (the float ones kept as they were) into the proto."""
    from onnx.external_data_helper import load_external_data_for_model

    load_external_data_for_model(model, str(base_dir))
