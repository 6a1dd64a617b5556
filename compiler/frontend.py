"""The front end as one call: read → parse → `--set` → elaborate → model-free checks."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from compiler.backends.registry import spec_for
from compiler.data.batches import path_problems, runtime_problems, unsynthesisable
from compiler.data.dataset_schema import dataset_problems
from compiler.data.npz import npz_problems
from compiler.diagnostics import Diagnostic, DiagnosticError, Diagnostics, error, has_errors
from compiler.ir.checks import run_checks
from compiler.ir.elaborate import elaborate
from compiler.ir.types import DataKind, RecipeIR
from compiler.models import ModelError, index_model
from compiler.outputs import output_conflict, read_paths
from compiler.overrides import apply_overrides
from compiler.plan import Plan, build_plan
from compiler.plan.timing import REFERENCE, Rates, machine_speed, scaled
from compiler.plan.workload import workload
from compiler.resolve import Assignment, resolve
from compiler.source import Source
from compiler.syntax import parse_recipe

MAX_RECIPE_BYTES = 1 << 20  # recipes are small text files; anything larger is a wrong path


@dataclass(frozen=True)
class CheckResult:
    """What the front end found: the IR (None when the recipe could not be parsed), the assignment of
    schemes to the model's layers (None when the model was not checked), and all diagnostics."""

    ir: RecipeIR | None
    diagnostics: tuple[Diagnostic, ...]
    assignment: Assignment | None = None

    @property
    def ok(self) -> bool:
        """The recipe parsed and has no errors."""
        return self.ir is not None and not has_errors(self.diagnostics)

    @property
    def recipe(self) -> RecipeIR:
        """The IR of a recipe that parsed (check `ok`, or `ir is not None`, first)."""
        if self.ir is None:
            raise ValueError("the recipe did not parse: " + "; ".join(d.message for d in self.diagnostics[:3]))
        return self.ir


def read_source(path: str | Path) -> Source | Diagnostic:
    """Read a recipe file as UTF-8 text; unreadable, oversized or non-UTF-8 files are diagnostics."""
    name = str(path)
    try:
        data = _read_bounded(Path(path))
    except OSError as exc:
        return error("Q100", f"cannot read recipe `{name}`: {exc.strerror or exc}", None,
                     help="check the path; recipes are `.recipe` text files (see `recipes/`)")
    if data is None:
        return error("Q100", f"`{name}` is not a regular file", None,
                     help="give the path of a `.recipe` text file (not a folder, FIFO or device)")
    if len(data) > MAX_RECIPE_BYTES:
        return error("Q112", f"`{name}` is {len(data) / 2**20:.1f} MiB, too large for a recipe", None,
                     help=f"recipes are small text files (at most {MAX_RECIPE_BYTES // 1024} KiB); is this the right file?")
    return decode_source(name, data)


def _read_bounded(path: Path) -> bytes | None:
    """At most MAX_RECIPE_BYTES + 1 bytes of a regular file (None for FIFOs, devices, folders): a recipe
    path that is `/dev/zero` or a pipe must not read forever or block."""
    import os
    import stat

    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks, size = [], 0
        while size <= MAX_RECIPE_BYTES:
            chunk = os.read(fd, MAX_RECIPE_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def decode_source(name: str, data: bytes) -> Source | Diagnostic:
    """UTF-8 text (a BOM is dropped), or Q101 at the first invalid byte."""
    try:
        return Source(name, data.decode("utf-8-sig"))
    except UnicodeDecodeError as exc:
        source = Source(name, data.decode("utf-8", errors="replace"))
        offset = len(data[: exc.start].decode("utf-8", errors="replace"))
        return error("Q101", f"recipe is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})",
                     source.span(offset, offset + 1), "invalid byte",
                     help="save the recipe as UTF-8; if this is not a recipe, check the path")


def check_source(source: Source, overrides: tuple[str, ...] = (), with_model: bool = False) -> CheckResult:
    """Parse, apply overrides, elaborate and run the model-free checks on recipe text; with `with_model`,
    also index the model (no weights) and resolve every layer's scheme (model-dependent checks).

    The model is checked only when the recipe itself has no errors, so that its problems are not
    reported twice in two forms.
    """
    parsed = parse_recipe(source)
    if isinstance(parsed, Diagnostic):
        return CheckResult(None, (parsed,))
    parsed, override_diags = apply_overrides(parsed, tuple(overrides))
    diags = Diagnostics(list(override_diags))
    ir = elaborate(parsed, diags)
    run_checks(ir, diags)
    assignment = None
    if with_model and not has_errors(diags.items):
        assignment = resolve_model(ir, diags)
    return CheckResult(ir, tuple(diags.items), assignment)


def resolve_model(ir: RecipeIR, diags: Diagnostics) -> Assignment | None:
    """Index the recipe's model (metadata only: no weight bytes) and resolve the recipe against it, then
    ask the recipe's backend what it cannot compile; a model that cannot be read is a diagnostic."""
    try:
        index = index_model(ir.model)
    except ModelError as exc:
        diags.error(exc.code, exc.message, ir.model_span, "model", help=exc.help)
        return None
    assignment = resolve(ir, index, diags)
    if assignment is not None and not has_errors(diags.items):
        spec_for(ir.backend).check(ir, assignment, diags)
        _check_data(ir, assignment, diags)
        _check_output(ir, diags)
    return assignment


def _check_data(ir: RecipeIR, assignment: Assignment, diags: Diagnostics) -> None:
    """What the samples need, at check time, when a stage uses samples: every integer input fillable by
    synthetic data (Q253: never zeros instead, which would calibrate on one constant sequence and verify
    nothing), or the data file and tokenizer there (Q401/Q216: they used to surface at compile)."""
    if not (ir.verify or workload(ir, assignment).calibrate):
        return
    data = ir.calibration.data
    span = data.span_of("data") or ir.calibration.span_of("data") or ir.span
    if data.kind is DataKind.SYNTHETIC:
        for why in unsynthesisable(assignment.model):
            diags.error("Q253", why, span, "no values to draw", help="give real samples: `data npz \"FILE\"` with "
                        "an array for every model input, or `data text` with a tokenizer")
    if data.kind is DataKind.DATASET:
        for code, message, help_line, key in dataset_problems(data, ir.model):
            diags.error(code, message, data.span_of(key) or span, _DATASET_LABELS[code], help=help_line)
    else:
        for code, message, help_line in path_problems(data, ir.model):
            diags.error(code, message, span, "no tokenizer" if code == "Q216" else "not found", help=help_line)
    for code, message, help_line in npz_problems(data, assignment.model):
        diags.error(code, message, span, "missing input", help=help_line)
    chunks = (ir.calibration.chunk,) + ((min(ir.calibration.chunk, ir.verify.samples),) if ir.verify else ())
    for code, message, help_line in runtime_problems(data, assignment.model, chunks):
        diags.error(code, message, ir.calibration.span_of("chunk") or span, "samples per run", help=help_line)


_DATASET_LABELS = {"Q401": "not found", "Q434": "no such column", "Q435": "no rows", "Q216": "no tokenizer",
                   "Q436": "no chat template"}


def _check_output(ir: RecipeIR, diags: Diagnostics) -> None:
    """Q416: the emit path would replace the model or another input (or is a symlink)."""
    if ir.emit is None:
        return
    problem = output_conflict(Path(ir.emit.path), ir.model, read_paths(ir))
    if problem:
        diags.error("Q416", f"{problem}", ir.emit.span_of("path") or ir.span, "would replace an input",
                    help="write the quantized model to a new path, apart from the model and the files the recipe reads")


def check_file(path: str | Path, overrides: tuple[str, ...] = (), with_model: bool = False) -> CheckResult:
    """`check_source` on a file's text."""
    source = read_source(path)
    if isinstance(source, Diagnostic):
        return CheckResult(None, (source,))
    return check_source(source, overrides, with_model)


@dataclass(frozen=True)
class PlanResult:
    """A plan (None when the recipe or model had errors or nothing fits), with all diagnostics."""
    check: CheckResult
    plan: Plan | None
    diagnostics: tuple[Diagnostic, ...]

    @property
    def ok(self) -> bool:
        """A plan exists and there are no errors."""
        return self.plan is not None and not has_errors(self.diagnostics)

    @property
    def program(self) -> Plan:
        """The plan of a result that has one (check `ok` first)."""
        if self.plan is None:
            raise ValueError("no plan: " + "; ".join(d.message for d in self.diagnostics[:3]))
        return self.plan

    @property
    def assignment(self) -> Assignment:
        """What the recipe gives each layer of the model (a result with a plan has it)."""
        if self.check.assignment is None:
            raise ValueError("the recipe was not resolved against its model")
        return self.check.assignment


def plan_file(path: str | Path, overrides: tuple[str, ...] = (), detected_free: int | None = None,
              ranks: int | None = None, rates: Rates | None = None) -> PlanResult:
    """Check a recipe against its model and lower it to a Plan (the dry run). Reads no weights.

    Args:
        detected_free: free host memory in bytes for recipes without `ram`; measured when None.
        ranks: the torchrun ranks the compile runs as, when it plans for them rather than for the recipe's
            `ranks` (the recipe's canonical text, the output's provenance, stays as written).
        rates: the machine's speed the ops' times are estimated at; this machine's when None.
    """
    checked = check_file(path, overrides, with_model=True)
    if not checked.ok or checked.assignment is None:
        return PlanResult(checked, None, checked.diagnostics)
    if detected_free is None:
        import psutil

        detected_free = psutil.virtual_memory().available
    diags = Diagnostics(list(checked.diagnostics))
    ir = checked.recipe
    spec = spec_for(ir.backend)
    plan = build_plan(ir, spec.planned(ir, checked.assignment), detected_free, diags, spec.costs, spec.lowering,
                      ranks, rates or _this_machine())
    return PlanResult(checked, plan, tuple(diags.items))


def _this_machine() -> Rates:
    """The cost model's rates scaled to this machine's speed (measured once, kept in qrc's cache folder)."""
    from compiler.models.builtin import cache_dir

    try:
        cache = cache_dir()
    except ModelError:  # an unusable QRC_CACHE: measured each time (the model's own check says why)
        cache = None
    return scaled(REFERENCE, machine_speed(cache))


def load_recipe(recipe: str | Path | Source, overrides: tuple[str, ...] = ()) -> RecipeIR:
    """The elaborated recipe, from a path or a Source (model-free checks only).

    Raises:
        DiagnosticError: the recipe has errors (all of them are attached).
    """
    result = check_source(recipe, overrides) if isinstance(recipe, Source) else check_file(recipe, overrides)
    if not result.ok:
        raise DiagnosticError(result.diagnostics)
    return result.recipe
