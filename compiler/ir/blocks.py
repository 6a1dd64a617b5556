"""Elaboration of the settings blocks: calibrate, mixed_precision, memory, verify, emit."""

from __future__ import annotations

from typing import Any

from compiler.diagnostics import Diagnostics, did_you_mean, expected_help
from compiler.ir.methods import configure_method
from compiler.ir.runtimes import Device, Runtime, RuntimeTarget
from compiler.ir.types import (
    AttentionKernel,
    Bound,
    Calibration,
    DataKind,
    DatasetRows,
    DataSource,
    Emit,
    EmitFormat,
    ExpertRouting,
    Memory,
    MemoryMode,
    MixedPrecision,
    RowPolicy,
    SensitivityMetric,
    Verify,
    VerifyMetric,
)
from compiler.ir.values import size_bytes, whole_number
from compiler.plugins import EMIT_FORMATS
from compiler.source import Span
from compiler.syntax import ast

DEFAULT_SAMPLES = 128
DEFAULT_SEQLEN = 128
DEFAULT_CHUNK = 16
DEFAULT_BINS = 2048
PASSTHROUGH_OPS = ("Reshape", "Transpose", "MaxPool", "Split", "Slice", "Squeeze", "Unsqueeze", "Gather",
                   "Flatten", "Identity", "Expand")
# Default bound and the valid range of each verify metric.
VERIFY_DEFAULTS = {
    VerifyMetric.COSINE: (Bound.AT_LEAST, 0.99, (-1.0, 1.0)),
    VerifyMetric.SQNR: (Bound.AT_LEAST, 20.0, (float("-inf"), float("inf"))),
    VerifyMetric.TOP1: (Bound.AT_LEAST, 0.9, (0.0, 1.0)),
    VerifyMetric.KLD: (Bound.AT_MOST, 0.05, (0.0, float("inf"))),
    VerifyMetric.EMBEDDING_COSINE: (Bound.AT_LEAST, 0.99, (-1.0, 1.0)),
    VerifyMetric.PERPLEXITY: (Bound.AT_MOST, 5.0, (-100.0, float("inf"))),  # percent above the float model's
}


def settings_by_key(items, diags: Diagnostics) -> dict[str, Any]:
    """key → the item that set it; a key given twice is Q215 at the second one."""
    found: dict[str, Any] = {}
    for item in items:
        key = setting_key(item)
        if key in found:
            diags.error("Q215", f"`{key}` given twice", _key_span(item), "second one",
                        help=f"keep one `{key}`; the first is at line {_key_span(found[key]).line}")
            continue
        found[key] = item
    return found


def setting_key(item) -> str:
    """The key a block item sets (`at_least`/`at_most` both set the bound)."""
    if isinstance(item, ast.DataDecl):
        return "data"
    if isinstance(item, ast.MethodDecl):
        return "method"
    return "bound" if item.key in ("at_least", "at_most") else item.key


def _key_span(item) -> Span:
    return item.key_span if isinstance(item, ast.Setting) else item.span


def spans_of(found: dict[str, Any]) -> tuple[tuple[str, Span], ...]:
    """Each found setting's span, by key."""
    return tuple((key, item.span) for key, item in found.items())


def _count(found, key, what, default, diags, minimum=1):
    if key not in found:
        return default
    value = whole_number(found[key].value, what, diags, minimum)
    return default if value is None else value


# ---- calibrate -----------------------------------------------------------------------------------

def elaborate_calibration(block: ast.Block | None, diags: Diagnostics) -> Calibration:
    """The `calibrate` block with every default written out."""
    found = settings_by_key(block.items if block else (), diags)
    data = _data(found.get("data"), diags)
    chunk = _count(found, "chunk", "`chunk`", min(DEFAULT_CHUNK, data.samples), diags)
    if chunk > data.samples:
        diags.warning("Q242", f"`chunk {chunk}` is larger than the {data.samples} calibration samples",
                      found["chunk"].span, f"only {data.samples} samples",
                      help=f"calibration runs one pass of {data.samples}; set `chunk` ≤ `samples`")
        chunk = data.samples
    return Calibration(
        spans=spans_of(found), data=data, chunk=chunk, method=configure_method(found.get("method"), diags),
        passthrough=_passthrough(found.get("passthrough"), diags),
        workers=_count(found, "workers", "`workers`", 1, diags),
        bins=_count(found, "bins", "`bins`", DEFAULT_BINS, diags, minimum=16),
        experts=ExpertRouting(found["experts"].value.value) if "experts" in found else ExpertRouting.ALL,
        attention=AttentionKernel(found["attention"].value.value) if "attention" in found else AttentionKernel.MODEL,
    )


_DATA_OPTIONS = {
    DataKind.SYNTHETIC: ("samples", "seqlen", "seed"),
    DataKind.NPZ: ("samples",),
    DataKind.TEXT: ("samples", "seqlen", "tokenizer"),
    DataKind.DATASET: ("samples", "seqlen", "seed", "tokenizer", "text", "messages", "image", "split", "shuffle",
                       "rows"),
}
DEFAULT_TEXT_FIELD = "text"
DEFAULT_SPLIT = "train"


def _data(decl: ast.DataDecl | None, diags: Diagnostics) -> DataSource:
    if decl is None:
        return DataSource(spans=(), kind=DataKind.SYNTHETIC, path=None, samples=DEFAULT_SAMPLES,
                          seqlen=DEFAULT_SEQLEN, seed=0, tokenizer=None)
    kind = DataKind(decl.kind)
    found = settings_by_key(decl.options, diags)
    for key, item in found.items():
        if key not in _DATA_OPTIONS[kind]:
            diags.error("Q222", f"`{key}` does not apply to `data {kind.value}`", item.key_span,
                        f"not an option of {kind.value} data",
                        help="options here: " + ", ".join(f"`{k}`" for k in _DATA_OPTIONS[kind]))
    tokenizer = found["tokenizer"].value.value if "tokenizer" in found else None  # None: the model folder's
    path = decl.path.value if decl.path else None
    if decl.path is not None and not path:
        diags.error("Q216", f"`data {kind.value}` needs a file path", decl.path.span, "empty path")
    return DataSource(
        spans=((("data", decl.span),) + spans_of(found)), kind=kind, path=path,
        samples=_count(found, "samples", "`samples`", DEFAULT_SAMPLES, diags),
        seqlen=_count(found, "seqlen", "`seqlen`", DEFAULT_SEQLEN, diags),
        seed=_count(found, "seed", "`seed`", 0, diags, minimum=0), tokenizer=tokenizer,
        rows=_dataset_rows(found, diags) if kind is DataKind.DATASET else None,
    )


def _dataset_rows(found: dict[str, Any], diags: Diagnostics) -> DatasetRows:
    """`data dataset`'s row settings: one of `text` and `messages` (a text column named `text` by default)."""
    if "text" in found and "messages" in found:
        diags.error("Q222", "`data dataset` reads one column: `text` or `messages`, not both",
                    found["messages"].key_span, "second column", help="keep `messages` for chat rows (a list of "
                    "{role, content}), `text` for plain text")
    messages = "messages" in found
    field = found["messages" if messages else "text"].value.value if messages or "text" in found else DEFAULT_TEXT_FIELD
    for key in ("text", "messages", "image", "split"):
        if key in found and not found[key].value.value:
            diags.error("Q216", f"`{key}` needs a name", found[key].span, "empty name")
    image = found["image"].value.value if "image" in found else None
    policy = RowPolicy(found["rows"].value.value) if "rows" in found else RowPolicy.PAD
    if image is not None and (messages or policy is not RowPolicy.PAD):
        bad = found["messages"] if messages else found["rows"]
        diags.error("Q222", "an `image` row is one sample: its prompt comes from `text`, and `rows` is `pad`",
                    bad.key_span, "does not apply with `image`", help="drop it: an image's tokens cannot be cut or "
                    "packed, and the prompt is rendered through the processor's own chat template")
    return DatasetRows(
        field=field, messages=messages, image=image,
        split=found["split"].value.value if "split" in found else DEFAULT_SPLIT,
        shuffle="shuffle" in found and found["shuffle"].value.value == "on",
        policy=policy,
    )


def _passthrough(setting: ast.Setting | None, diags: Diagnostics) -> tuple[str, ...]:
    if setting is None:
        return ()
    ops = []
    for name in setting.value:  # type: ignore[union-attr]  # a list setting: its value is a tuple of names
        if name.value not in PASSTHROUGH_OPS:
            diags.error("Q227", f"`{name.value}` is not a distribution-preserving op", name.span,
                        "cannot pass ranges through", help=did_you_mean(name.value, PASSTHROUGH_OPS))
        elif name.value not in ops:
            ops.append(name.value)
    return tuple(ops)


# ---- mixed precision -----------------------------------------------------------------------------

def elaborate_mixed_precision(block: ast.Block | None, diags: Diagnostics) -> MixedPrecision | None:
    """The `mixed_precision` block, or None without one."""
    if block is None:
        return None
    found = settings_by_key(block.items, diags)
    for key, example in (("choices", "choices [w4, w8]"), ("budget", "budget 4.5 bits")):
        if key not in found:
            diags.error("Q216", f"`mixed_precision` needs `{key}`", block.span, f"no `{key}`",
                        help=f"add e.g. `{example}`")
    budget = found["budget"].value if "budget" in found else None
    if budget is not None and budget.value <= 0:
        diags.error("Q217", f"budget must be a positive number of bits, not `{budget.text}`", budget.span,
                    "not a bit budget", help="bits per weight between the narrowest and widest choice, e.g. `budget 5.5`")
    return MixedPrecision(
        spans=spans_of(found),
        choices=tuple(n.value for n in found["choices"].value) if "choices" in found else (),
        metric=SensitivityMetric(found["metric"].value.value) if "metric" in found else SensitivityMetric.KLD,
        budget_bits=budget.value if budget is not None else 0.0,
        samples=_count(found, "samples", "`samples`", 16, diags),
    )


# ---- memory --------------------------------------------------------------------------------------

def elaborate_memory(block: ast.Block | None, diags: Diagnostics) -> Memory:
    """The `memory` block with every default written out."""
    found = settings_by_key(block.items if block else (), diags)
    mode = MemoryMode(found["mode"].value.value) if "mode" in found else MemoryMode.AUTO
    ram = size_bytes(found["ram"].value, "ram", diags) if "ram" in found else None
    vram: tuple[int, ...] = ()
    if "vram" in found:
        vram = _vram(found["vram"].value, diags)
    disk = found["disk"].value.value if "disk" in found else None
    if disk == "":
        diags.error("Q216", "`disk` needs a folder path", found["disk"].value.span, "empty path",
                    help='e.g. `disk "./.qrc-cache"`')
        disk = None
    if mode is MemoryMode.MULTI_GPU and not vram:
        diags.error("Q221", "`mode multi_gpu` needs `vram`", found["mode"].span, "no GPU budget",
                    help="say how much memory each GPU may use, e.g. `vram 2 x 80 GiB`")
    ranks = _count(found, "ranks", "`ranks`", 1, diags)
    return Memory(spans=spans_of(found), mode=mode, ram=ram, vram=vram, disk=disk, ranks=ranks)


def _vram(value, diags: Diagnostics) -> tuple[int, ...]:
    size = value.size if isinstance(value, ast.DeviceSize) else value
    count = whole_number(value.count, "a device count", diags) if isinstance(value, ast.DeviceSize) else 1
    per_device = size_bytes(size, "vram", diags)
    if count is None or per_device is None:
        return ()
    return (per_device,) * count


# ---- verify --------------------------------------------------------------------------------------

def elaborate_verify(block: ast.Block | None, diags: Diagnostics) -> Verify | None:
    """The `verify` block, or None without one."""
    if block is None:
        return None
    found = settings_by_key(block.items, diags)
    metric = VerifyMetric(found["metric"].value.value) if "metric" in found else VerifyMetric.COSINE
    default_bound, default_threshold, (lo, hi) = VERIFY_DEFAULTS[metric]
    bound, threshold = default_bound, default_threshold
    if "bound" in found:
        setting = found["bound"]
        given = Bound(setting.key)
        if given is not default_bound:
            better = "lower" if default_bound is Bound.AT_MOST else "higher"
            diags.error("Q219", f"`{given.value}` does not fit `{metric.value}`: {better} is better",
                        setting.key_span, "wrong direction",
                        help=f"write `{default_bound.value} {setting.value.text}` for `{metric.value}`")
        elif not lo <= setting.value.value <= hi:
            diags.error("Q218", f"`{setting.value.text}` is outside the range of `{metric.value}` "
                        f"[{lo:g}, {hi:g}]", setting.value.span, "unreachable bound",
                        help=f"`{metric.value}` lies in [{lo:g}, {hi:g}]; default `{default_bound.value} "
                        f"{default_threshold:g}`")
        threshold = setting.value.value
    return Verify(spans=spans_of(found), samples=_count(found, "samples", "`samples`", 8, diags),
                  metric=metric, bound=bound, threshold=threshold)


# ---- emit ----------------------------------------------------------------------------------------

def elaborate_emit(decl: ast.EmitDecl | None, default_format: EmitFormat, diags: Diagnostics) -> Emit | None:
    """The `emit` declaration, its format defaulting to the backend's."""
    if decl is None:
        return None
    found = settings_by_key(decl.options, diags)
    fmt = _format(found["format"], diags) if "format" in found else _by_suffix(decl.path.value, default_format)
    if not decl.path.value:
        diags.error("Q216", "`emit` needs an output path", decl.path.span, "empty path",
                    help='e.g. `emit "out/model.onnx"`')
    return Emit(spans=(("path", decl.path.span),) + spans_of(found), path=decl.path.value, format=fmt,
                accuracy_level=_accuracy_level(found, fmt, diags), target=_target(found, diags))


def _target(found, diags: Diagnostics) -> RuntimeTarget | None:
    """`runtime NAME  device D`: where the output must run (an unknown name is Q107; `device` alone is Q275)."""
    runtime = _named(found.get("runtime"), Runtime, diags)
    device = _named(found.get("device"), Device, diags)
    if "device" in found and "runtime" not in found:
        diags.error("Q275", "`device` says where the `runtime` runs, and no `runtime` is named",
                    found["device"].span, "no runtime", help=f"add `runtime NAME` ({', '.join(r.value for r in Runtime)})")
    return None if runtime is None else RuntimeTarget(runtime, device)


def _named(setting: ast.Setting | None, kind, diags: Diagnostics):
    """The member of enum `kind` a `KEY NAME` setting names; None where absent or unknown (Q107)."""
    if setting is None:
        return None
    word = setting.value
    assert isinstance(word, ast.Name)  # the grammar's `runtime NAME` / `device NAME`
    found = next((member for member in kind if member.value == word.value), None)
    if found is None:
        diags.error("Q107", f"unknown keyword `{word.value}`", word.span, "not a keyword here",
                    help=expected_help(word.value, [member.value for member in kind]))
    return found


def _by_suffix(path: str, default_format: EmitFormat) -> EmitFormat:
    """The format a path's extension names where `format` is not written: the one registered format with that
    extension (`out.gguf` is GGUF: a folder of that name would be no file a runtime opens); the backend's default
    otherwise, an extension several formats share (`.onnx`) included."""
    if default_format.suffix is not None and path.endswith(default_format.suffix):
        return default_format
    named = [f for f in EMIT_FORMATS if f.suffix is not None and path.endswith(f.suffix)]
    return named[0] if len(named) == 1 else default_format


def _format(setting: ast.Setting, diags: Diagnostics) -> EmitFormat:
    """The registered output format a `format NAME` names; an unknown one is Q107 (the recipe's other settings are
    still checked, with the first registered format standing in)."""
    word = setting.value
    assert isinstance(word, ast.Name)  # the grammar's `format NAME`
    found = EMIT_FORMATS.get(word.value)
    if found is not None:
        return found
    diags.error("Q107", f"unknown keyword `{word.value}`", word.span, "not a keyword here",
                help=expected_help(word.value, EMIT_FORMATS.names()))
    return next(iter(EMIT_FORMATS))


ACCURACY_LEVELS = (0, 1, 2, 3, 4)  # onnxruntime's MatMulNBits: unset, fp32, fp16, bf16, int8 activations


def _accuracy_level(found, fmt: EmitFormat, diags: Diagnostics) -> int:
    """MatMulNBits' `accuracy_level`: the type its activations are computed in. The default 4 (int8, in
    blocks) is what onnxruntime-genai's builder writes for CPU int4: several times faster than 0."""
    if "accuracy_level" not in found:
        return 4
    setting = found["accuracy_level"]
    value = whole_number(setting.value, "`accuracy_level`", diags, minimum=0)
    if value is not None and value not in ACCURACY_LEVELS:
        diags.error("Q254", f"`accuracy_level {value}` is not one of onnxruntime's levels", setting.span,
                    "0 … 4", help="0 unset, 1 fp32, 2 fp16, 3 bf16, 4 int8 activations (fastest on CPU)")
        return 4
    if "accuracy_level" not in fmt.settings:
        diags.warning("Q254", f"`accuracy_level` applies to MatMulNBits only; format {fmt.name} ignores it",
                      setting.span, "ignored", help="use it with `format matmul_nbits`, or remove it")
    return 4 if value is None else value
