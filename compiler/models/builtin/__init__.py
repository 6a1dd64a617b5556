"""Built-in models, generated in code (no downloads), deterministic, cached on disk.

`builtin:NAME?key=value&…` — same parameters, byte-identical ONNX file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path
from types import ModuleType

from compiler.models.errors import ModelError

PREFIX = "builtin:"
_MODULES = {"tiny-llama": "tiny_llama", "tiny-bert": "tiny_bert", "tiny-cnn": "tiny_cnn"}
_SPECS = {"tiny-llama": "LlamaSpec", "tiny-bert": "BertSpec", "tiny-cnn": "CnnSpec"}
NAMES = tuple(_MODULES)


def module(name: str) -> ModuleType:
    """The module that builds the built-in `name`."""
    import importlib

    return importlib.import_module(f"compiler.models.builtin.{_MODULES[name]}")


def parse_ref(ref: str):
    """`builtin:tiny-llama?layers=8` → ("tiny-llama", LlamaSpec(layers=8, …))."""
    from compiler.diagnostics import did_you_mean

    body = ref[len(PREFIX):]
    name, _, query = body.partition("?")
    if name not in _MODULES:
        raise ModelError("Q251", f"no built-in model `{name}`", f"{did_you_mean(name, NAMES)} (built-ins: {', '.join(NAMES)})")
    spec_type = getattr(module(name), _SPECS[name])
    fields = {f.name for f in dataclasses.fields(spec_type)}
    values = {}
    for pair in filter(None, query.split("&")):
        key, _, value = pair.partition("=")
        if key not in fields:
            raise ModelError("Q251", f"`{name}` has no parameter `{key}`",
                             f"{did_you_mean(key, sorted(fields))} (parameters: {', '.join(sorted(fields))})")
        if not value.isdigit() or (int(value) < 1 and key != "seed"):
            raise ModelError("Q251", f"`{key}={value}` must be a positive whole number", f"e.g. `{key}=8`")
        limit = SEED_LIMIT if key == "seed" else SIZE_LIMIT
        if len(value) > 12 or int(value) > limit:
            raise ModelError("Q251", f"`{key}={value[:24]}` is above {limit:,}", f"built-ins are test models: e.g. `{key}=8`")
        values[key] = int(value)
    spec = spec_type(**values)
    if spec.problems():
        raise ModelError("Q251", f"invalid `{name}` parameters: {'; '.join(spec.problems())}",
                         "adjust the parameters in the `?key=value` part")
    weights = _weights_estimate(spec)
    if weights > WEIGHTS_LIMIT:
        raise ModelError("Q251", f"`{ref[:80]}` would have about {weights:,} weights, above the built-ins' "
                         f"{WEIGHTS_LIMIT:,}", "built-ins are generated in memory for tests: use smaller sizes, or an HF "
                         "folder for a large model")
    return name, spec


SIZE_LIMIT = 1 << 16  # any one size of a built-in
SEED_LIMIT = (1 << 32) - 1  # numpy's legacy seeding takes 32 bits
WEIGHTS_LIMIT = 1 << 30  # 4 GiB of float32: built-ins are generated whole in memory


def _weights_estimate(spec) -> int:
    """About how many weights a built-in of these sizes has (decoders, encoders: blocks plus embeddings;
    the CNN: its convolutions and dense layers)."""
    get = lambda key: int(getattr(spec, key, 0) or 0)  # noqa: E731
    hidden, inter = get("hidden"), get("intermediate")
    blocks = get("layers") * (4 * hidden * hidden + 3 * hidden * inter)
    tables = (2 * get("vocab") + get("max_positions")) * hidden
    flat = int(getattr(spec, "flat", 0) or 0)
    cnn = 9 * get("channels") ** 2 + flat * hidden + hidden * get("classes")
    return blocks + tables + cnn


def cache_dir() -> Path:
    """The cache folder: $QRC_CACHE, else ~/.cache/qrc. Q250 (a ModelError) when it is something other than a
    folder, or cannot be made, or when $QRC_CACHE_LIMIT is no size: built-ins and exports are kept there."""
    from compiler.models.cache_entries import cache_limit
    from compiler.models.errors import ModelError

    cache_limit()  # a QRC_CACHE_LIMIT that is no size stops here, before any work (Q250)
    path = Path(os.environ.get("QRC_CACHE") or Path.home() / ".cache" / "qrc")
    try:
        path.mkdir(parents=True, exist_ok=True)
        if not path.is_dir():
            raise NotADirectoryError(20, "not a folder", str(path))
    except OSError as exc:
        raise ModelError("Q250", f"qrc's cache folder `{path}` cannot be used ({exc.strerror or exc})",
                         "set QRC_CACHE to a folder you can write (it keeps built-in models and exports), or unset "
                         "it for ~/.cache/qrc") from None
    return path


def cached_name(ref: str, version: str) -> str:
    """`NAME-DIGEST`: a built-in's cache entry, one per parameter set and format version."""
    name, spec = parse_ref(ref)
    key = ",".join(f"{f.name}={getattr(spec, f.name)}" for f in dataclasses.fields(spec))
    return f"{name}-{hashlib.sha256(f'{name}|{key}|{version}'.encode()).hexdigest()[:16]}"


def onnx_path(ref: str) -> Path:
    """The cached ONNX file of a built-in, generated (atomically) on first use."""
    name, spec = parse_ref(ref)
    path = cache_dir() / "builtin" / f"{cached_name(ref, 'v2')}.onnx"
    if not path.exists():
        write_onnx(module(name).build_onnx(spec), path)
    return path


def write_onnx(model, path: Path) -> None:
    """Cache a built-in atomically, weights as external data (`<name>.onnx.data`): a compile then reads
    each weight from disk only when it needs it."""
    from compiler.models.onnx_write import write_atomically

    write_atomically(model, path, external=True)
