"""A GGUF file's tensors read as a checkpoint's (shards.Shards' interface): each one dequantized when it is read
(models/gguf_source.read_tensor: the gguf package's dequantizers, float32, transformers' names and row order).
One tensor at a time: the file is never loaded whole, so GGUF sources stream file to file and block by block as
safetensors do."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from compiler.backends import BackendError
from compiler.backends.torch.shards import Entry
from compiler.diagnostics import error
from compiler.models import gguf_file, gguf_source


class GgufShards:
    """Every tensor of one GGUF file, by transformers name."""

    def __init__(self, path: Path, ref: str):
        self.header = gguf_source.read_header(path, ref)
        self.path = path
        self.block = (128, 128)
        self.scaled: dict[str, str] = {}  # no block-scaled FP8 pairs: every tensor decodes alone
        self.scales: frozenset[str] = frozenset()
        self.tensors: dict[str, gguf_source.GgufTensor] = {}
        self.entries: dict[str, Entry] = {}
        for tensor in self.header.tensors:
            name = gguf_source.hf_name(self.header, tensor)
            if name is not None:  # index_model refused a file with any other tensor before any work
                self.tensors[name] = tensor
                self.entries[name] = Entry(path, "F32", tensor.shape, tensor.start, tensor.start + tensor.nbytes)

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def stored_as_is(self, name: str) -> bool:
        """Never: a tensor's bytes in the file are GGML blocks, not the float32 it reads as."""
        return False

    def read(self, name: str) -> torch.Tensor:
        """One tensor, dequantized to float32."""
        with self._decoding(name):
            values = gguf_source.read_tensor(self.header, self.tensors[name], name)
        return torch.from_numpy(np.ascontiguousarray(values))

    def slices(self, name: str) -> Iterator[tuple[int, torch.Tensor]]:
        """One tensor dequantized to float32 a slice of rows at a time, as (first row, rows): copied to the output
        so, it is never whole in memory."""
        with self._decoding(name):
            for start, values in gguf_source.row_slices(self.header, self.tensors[name], name):
                yield start, torch.from_numpy(np.ascontiguousarray(values))

    @contextlib.contextmanager
    def _decoding(self, name: str) -> Iterator[None]:
        """The gguf package's failures as diagnostics: Q271 for a type it cannot dequantize, Q404 for a file that
        ends inside the tensor."""
        from gguf.constants import GGMLQuantizationType

        try:
            yield
        except NotImplementedError:
            kind = GGMLQuantizationType(self.tensors[name].ggml_type).name
            raise BackendError(error("Q271", f"`{self.path.name}`: tensor `{name}` is GGML {kind}, which the gguf "
                                     "package cannot dequantize", None, "cannot be read",
                                     help="update the gguf package, or requantize the file to a type it reads")) from None
        except OSError as exc:
            raise BackendError(error("Q404", str(exc), None, "truncated file",
                                     help="the GGUF file is incomplete; download or convert it again")) from None

    def mapped(self, name: str) -> torch.Tensor:
        """As `read`: a GGUF tensor has to be decoded, there is nothing to map as it is."""
        return self.read(name)


def single_file_shards(ref: str) -> GgufShards | None:
    """The tensors of the GGUF file `ref` names (the file, or the one .gguf of a folder without config.json), else
    None: the model is a folder of safetensors."""
    path = gguf_file(ref)
    return GgufShards(path, ref) if path is not None else None
