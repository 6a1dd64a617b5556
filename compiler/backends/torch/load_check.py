"""The staged output opened by transformers' own loader before it goes into place: the task class (the
folder's `architectures`) and the base class (`AutoModel`, what embedding users load), on the meta device,
so no weight is read and the check costs a fraction of a second. A key either loader finds missing or
unexpected (beyond the float folder's own, a base class's head) means the folder would load with random or
unquantized weights while verification, which measures qrc's model, passes: the compile stops with Q426
naming the keys, and nothing is written to the destination. The float folder is opened only when the staged
one reports something (to tell the folder's own gaps from qrc's): a clean report needs no comparison."""

from __future__ import annotations

import contextlib
import io
import logging
import os
from pathlib import Path

from compiler.backends import BackendError
from compiler.diagnostics import Diagnostic, error, warning
from compiler.quant.rotations import ONLINE_DOWN
from compiler.source import Span


def check_loads(staged: Path, source: Path, span: Span | None) -> Diagnostic | None:
    """Raise Q426 when transformers opens `staged` with weights missing (task or base class) or unexpected
    (task class) that `source` (the float folder) does not have; return Q427 (a warning) when the check cannot
    run here (no accelerate, which meta-device loading needs; an architecture or a stored format transformers
    cannot open), else None."""
    try:
        import accelerate  # noqa: F401  # transformers' meta-device loading needs it
        import transformers
    except ImportError:
        return _skipped(span, "accelerate is not installed", "pip install accelerate (the `hf` extra brings it)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with _alone():
        return _check(transformers, staged, source, span)


def _alone():
    """Under torchrun only the first rank loads the folder: compressed-tensors (which transformers calls) would
    otherwise share its decompression with the other ranks, which are not loading it. Its own switch for
    rank-local work turns that off."""
    try:
        import torch.distributed as dist
        from compressed_tensors.offload.utils import as_single_threaded
    except ImportError:
        return contextlib.nullcontext()
    return as_single_threaded() if dist.is_available() and dist.is_initialized() else contextlib.nullcontext()


def _check(transformers, staged: Path, source: Path, span: Span | None) -> Diagnostic | None:
    task = _task_class(transformers, staged)
    named = _architecture(staged)
    if named and task is None:  # a class of the folder's own code (auto_map): what loads it is not transformers'
        raise BackendError(error(
            "Q250", f"config.json names the architecture `{named}`, which transformers does not have: it would "
            "come from the model folder's own code (`auto_map`), and qrc never runs code from a model folder",
            span, "unknown architecture", help="name a transformers architecture of this model_type in config.json's "
            "`architectures` (e.g. what `transformers.AutoConfig` lists for it), or quantize it with the code that "
            "defines it; nothing was written to the destination"))
    for auto in (task, transformers.AutoModel):
        if auto is None:
            continue
        try:
            found = _report(auto, staged, auto is task)
        except Exception as exc:  # e.g. transformers 5 cannot fuse int8 experts back into its 3-D parameters
            return _unopened(auto, source, span, exc)
        if not found:  # nothing wrong: the float folder's own report could only take from it (a fifth of the check)
            continue
        try:
            expected = _report(auto, source, auto is task)
        except Exception as exc:  # transformers cannot build this architecture here (file-to-file runs allow it)
            return _source_unopened(auto, span, exc)
        own = sorted(k.removeprefix("missing ") for k in expected if k.startswith("missing ")) if auto is task else []
        if own:  # the float folder's weights are not its architecture's (renamed tensors, a wrong `architectures`)
            listed = ", ".join(own[:4]) + (f" and {len(own) - 4} more" if len(own) > 4 else "")
            raise BackendError(error(
                "Q250", f"transformers' {auto.__name__} (the model folder's `architectures`) opens the model folder "
                f"itself with {len(own)} weight{'s' if len(own) != 1 else ''} missing ({listed}): its weights are not that "
                "architecture's",
                span, "the model does not load", help="fix config.json's `architectures` or the tensor names; the "
                "output would load those weights random. Nothing was written to the destination"))
        wrong = found - expected
        if wrong:
            listed = ", ".join(sorted(wrong)[:4]) + (f" and {len(wrong) - 4} more" if len(wrong) > 4 else "")
            raise BackendError(error(
                "Q426", f"transformers' {auto.__name__} would open the emitted folder with {len(wrong)} weights "
                f"missing or unexpected ({listed})", span, "the output would load wrong",
                help="this is a qrc bug (its quantization_config does not name the modules transformers builds); "
                "please report it with the recipe. Nothing was written to the destination"))
    return None


def _unopened(auto, source: Path, span: Span | None, exc: Exception) -> Diagnostic:
    """Q427 for a folder `auto` cannot open: the architecture's fault where the float folder fails too."""
    try:
        _report(auto, source, False)
    except Exception as source_exc:  # transformers cannot build this architecture here (file-to-file runs allow it)
        return _source_unopened(auto, span, source_exc)
    return _skipped(span, f"{auto.__name__} cannot open it: {(str(exc).strip().splitlines() or [''])[0][:160]}",
                    "transformers' limit, not the folder's: vLLM reads such folders tensor by tensor")


def _source_unopened(auto, span: Span | None, exc: Exception) -> Diagnostic:
    return _skipped(span, f"{auto.__name__} cannot open the source folder either ({type(exc).__name__})",
                    "the folder is written as the recipe says; load it where its architecture is known")


def _skipped(span: Span | None, why: str, help: str) -> Diagnostic:
    return warning("Q427", f"the emitted folder was not opened with transformers before it went into place: {why}",
                   span, "load check skipped", help=help)


def _architecture(folder: Path) -> str | None:
    """The first class config.json's `architectures` names, if any."""
    import json

    names = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("architectures") or []
    return str(names[0]) if isinstance(names, list) and names else None


def _task_class(transformers, folder: Path):
    """The class named by config.json's `architectures`, if transformers has it."""
    named = _architecture(folder)
    return getattr(transformers, named, None) if named and named.isidentifier() else None


# compressed-tensors 0.20 hooks attention modules by a `past_key_value(s)` argument that transformers 5.24
# renamed `cache`, so transformers reports a folder's KV-cache scales unexpected (vLLM reads them); they are not
# the folder's fault
_KV_SCALES = ("k_scale", "v_scale")
# an online rotation's matrix (torch/rotation.py): transformers builds no module for it (vLLM and compressed-tensors'
# apply_transform_config do), so it reports it unexpected; the runtime table says transformers does not run it
_ONLINE_MATRIX = f".{ONLINE_DOWN}_input.weight"


def _report(auto, folder: Path, task: bool) -> set[str]:
    """What the loader reports wrong, loading on the meta device: missing and mismatched weights, and for the
    task class the unexpected ones by module (a base class has no head, so its head's tensors are unexpected
    there whatever they are). Its load report and progress bars are kept off the console."""
    quiet = logging.getLogger("transformers")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            # no hub kernels: transformers 5.25 swaps them in by default, and its kernelize refuses the meta device
            _, info = auto.from_pretrained(str(folder), device_map="meta", output_loading_info=True, use_kernels=False)
    finally:
        quiet.setLevel(level)
    unexpected = {k.rpartition(".")[0] for k in info["unexpected_keys"]
                  if k.rpartition(".")[2] not in _KV_SCALES and not k.endswith(_ONLINE_MATRIX)}
    return ({f"missing {k}" for k in info["missing_keys"]} | {f"mismatched {k}" for k, *_ in info["mismatched_keys"]}
            | ({f"unexpected {m}.*" for m in unexpected} if task else set()))
