"""A file-to-file run's config and load check in a process of its own (check_worker.py is the child).

Why a process and not a thread: the check imports compressed-tensors and transformers and has transformers
open the staged folder, seconds of Python that hold the interpreter's lock. On a thread beside the rounding,
the main thread and the rounding threads, which need that lock between two slices of a weight, waited for
it: on a 5.9 GiB bfloat16 Llama (2 cores), W4A16 took 18.4-19.4 s with the check on a thread against 13.8-14.8
with it in a child started before this process imports torch (bench/data_free_floor.py). The child costs
its own interpreter and torch (about 450 MiB, which the plan counts: torch/cost.py CHECK_PROCESS, and the
measured peak includes: rss.following), and it is started once the plan is known, before torch is imported
here (`prepared`, which `qrc compile` enters), or else when the run opens the model (`adopt`).

Every failure of the child (it could not start, it died, it answered nonsense or not in time) makes `prefix`
or `check` return None, and the run checks in its own process instead: the same checks, only slower. So does a
run in a process that has imported both packages already (`imported_here`), which starts no child."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator

from compiler.backends.rss import following
from compiler.backends.torch.formats import torch_format
from compiler.models import ModelError, builtin, model_dir, resolve_path
from compiler.plan import ops

WORKER = (sys.executable, "-m", "compiler.backends.torch.check_worker")  # the child's command, then the class
_STARTED: dict[str, CheckProcess] = {}  # model reference → the child started for it, until a run adopts it
# the longest the run waits for one answer before it ends the child and checks in its own process: the imports
# take about 9 s on 2 cores and the meta-device load of a staged folder seconds, so a child this late is stuck
# (a lock, a stalled file system), and waiting on would hang the compile after its weights are written
ANSWER_SECONDS = 300.0


class CheckProcess:
    """The child for one model: its class's base-model prefix, then one check of a staged folder."""

    def __init__(self, architecture: str):
        self._prefix: str | None = None
        self._read_prefix = False
        self._followed = contextlib.ExitStack()
        self._stopping = threading.Lock()  # the run's thread and the main thread may both stop it
        self._child: subprocess.Popen | None = None
        if imported_here():  # no child: the run checks in its own process (prefix() is None)
            return
        # one OpenMP thread: the child loads on the meta device, so a team's idle workers would only spin on the
        # cores the rounding uses
        try:
            self._child = subprocess.Popen(
                [*WORKER, architecture], env={**os.environ, "OMP_NUM_THREADS": "1"},
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:  # no process could be started: the run checks in its own
            self._child = None

    def follow(self) -> None:
        """From now on the compile's memory samplers count the child's RSS (rss.following)."""
        if self._child is not None and self._child.poll() is None:
            self._followed.enter_context(following(self._child.pid))

    def prefix(self) -> str | None:
        """The base-model prefix the child found ('' for none), once its imports are done; None if it failed."""
        if not self._read_prefix:
            self._read_prefix = True
            answer = self._line()
            self._prefix = answer.get("prefix") if answer is not None else None
        return self._prefix if isinstance(self._prefix, str) else None

    def check(self, request: dict) -> dict | None:
        """Send the request (check_worker.py), return the answer; None if the child failed."""
        if self.prefix() is None or self._child is None or self._child.stdin is None:
            return None
        try:
            self._child.stdin.write(json.dumps(request) + "\n")
            self._child.stdin.flush()
        except OSError:
            return None
        answer = self._line()
        return answer if answer is not None and "raised" in answer else None

    def stop(self) -> None:
        """End the child (at once if it is still working: the run stopped early) and stop following it."""
        with self._stopping:
            if self._child is not None:
                if self._child.poll() is None:
                    self._child.kill()
                self._child.wait()
                for stream in (self._child.stdin, self._child.stdout):
                    if stream is not None:
                        with contextlib.suppress(OSError, ValueError):
                            stream.close()
            self._followed.close()

    def _line(self) -> dict | None:
        """The child's next answer; None if it failed, or gave none within ANSWER_SECONDS (then it is ended)."""
        child = self._child
        if child is None or child.stdout is None:
            return None
        deadline = threading.Timer(ANSWER_SECONDS, child.kill)  # its stdout then ends: readline returns ''
        deadline.daemon = True
        deadline.start()
        try:
            answer = json.loads(child.stdout.readline() or "null")
        except (OSError, ValueError):
            return None
        finally:
            deadline.cancel()
        return answer if isinstance(answer, dict) else None


def imported_here() -> bool:
    """compressed-tensors and transformers are imported in this process already (a compile through the API in a
    Python session that uses them: a notebook, a script that loaded a model, the tests). A child would import them
    again (about 6 s of CPU and 440 MiB) to save this process only the meta-device load of the staged folder, so
    the run checks here, on its check thread (early_check.py), as where no child could start. The plan still counts
    the child: such a run peaks below it."""
    return "compressed_tensors" in sys.modules and "transformers" in sys.modules


def architecture_of(config: dict) -> str:
    """The class config.json names ('' for none)."""
    names = config.get("architectures") or []
    return names[0] if names and isinstance(names[0], str) else ""


def class_prefix(cls) -> str:
    """The base-model prefix under which a folder saved from `cls` (a transformers class) names its base model:
    the class's `base_model_prefix`, unless AutoModel's class for its config names another (Llama4ForCausalLM
    and MllamaForCausalLM say `language_model` and hold their base model as `model`, the prefix AutoModel
    strips on load). '' for no class."""
    prefix = getattr(cls, "base_model_prefix", "") or ""
    model_type = getattr(getattr(cls, "config_class", None), "model_type", None)
    if not isinstance(model_type, str):  # not a transformers model (a file-to-file run's stand-in): no import
        return prefix
    try:
        from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES
    except ImportError:
        return prefix
    base_name = MODEL_MAPPING_NAMES.get(model_type)
    base = getattr(sys.modules.get("transformers"), base_name, None) if isinstance(base_name, str) else None
    return getattr(base, "base_model_prefix", "") or prefix


def adopt(model: str, config: dict) -> CheckProcess:
    """The child started for `model` by `prepared`, or one started now."""
    started = _STARTED.pop(model, None)
    return started if started is not None else CheckProcess(architecture_of(config))


@contextlib.contextmanager
def prepared(plan: ops.Plan, writes: bool) -> Iterator[None]:
    """Around a compile: a plan that rounds a folder file to file and writes it (the first rank) gets its
    check process now, before the backend imports torch, so that the child's imports overlap this one's.
    Whatever the run did not adopt and stop is stopped when the compile ends."""
    model = _checked_model(plan) if writes else None
    if model is not None and model not in _STARTED:
        _STARTED[model] = CheckProcess(architecture_of(_config(model)))
    try:
        yield
    finally:
        if model is not None and model in _STARTED:
            _STARTED.pop(model).stop()


def _checked_model(plan: ops.Plan) -> str | None:
    """The model reference of a file-to-file plan whose output transformers opens (a folder; formats.py)."""
    load, emit = plan.first(ops.LoadModel), plan.first(ops.Emit)
    if not isinstance(load, ops.LoadModel) or not isinstance(emit, ops.Emit):
        return None
    if load.access is not ops.ModelAccess.FILES or not torch_format(emit.format).opened_by_transformers:
        return None
    return load.model


def _config(model: str) -> dict:
    """config.json of a folder reference ({} for a built-in or an unreadable file: the child then imports
    only, and the run's own reading reports what is wrong)."""
    if model.startswith(builtin.PREFIX):
        return {}
    try:
        config = json.loads(((model_dir(model) or resolve_path(model)) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, ModelError):
        return {}
    return config if isinstance(config, dict) else {}
