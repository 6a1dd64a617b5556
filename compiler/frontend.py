"""The front end as one call: read → parse → `--set` → elaborate → model-free checks."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from compiler.backends.registry import backend_facts, spec_for
from compiler.data.batches import path_problems, runtime_problems, unsynthesisable
from compiler.data.npz import npz_problems
from compiler.diagnostics import Diagnostic, DiagnosticError, Diagnostics, error, has_errors, warning
from compiler.ir.checks import run_checks
from compiler.ir.elaborate import elaborate
from compiler.ir.runtimes import RuntimeCell, check_target
from compiler.ir.types import NONE, DataKind, EmitFormat, RecipeIR
from compiler.models import ModelError, index_model
from compiler.outputs import output_conflict, read_paths
from compiler.overrides import apply_overrides
from compiler.plan import Plan, build_plan
from compiler.plan.timing import REFERENCE, Rates, machine_speed, scaled
from compiler.plan.workload import workload
from compiler.plugins import FAILED
from compiler.resolve import Assignment, resolve
from compiler.source import Source, Span
from compiler.syntax import ast, parse_recipe

MAX_RECIPE_BYTES = 1 << 20  # recipes are small text files; anything larger is a wrong path


@dataclass(frozen=True)
class CheckResult:
    """What the front end found: the IR (None when the recipe could not be parsed), the assignment of
    schemes to the model's layers (None when the model was not checked), and all diagnostics."""

    ir: RecipeIR | None
    diagnostics: tuple[Diagnostic, ...]
    assignment: Assignment | None = None
    judged: ModelView | None = None  # the recipe as the model checks saw it (None when the model was not checked)
    runtimes: tuple[RuntimeCell, ...] = ()  # where the output runs (`qrc check` with a plan that fits)

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


def _plugin_warnings() -> list[Diagnostic]:
    """Q450 for each installed plug-in that could not be imported (compiler/plugins.py load_installed)."""
    return [warning("Q450", f"the qrc plug-in `{point}` could not be loaded: {why}", None, "not loaded",
                    help="fix or uninstall the package that declares it (entry-point group `qrc.plugins`); "
                    "until then what it registers is unknown")
            for point, why in FAILED]


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
    diags = Diagnostics(list(override_diags) + _plugin_warnings())
    ir = elaborate(parsed, diags, backend_facts())
    run_checks(ir, diags)
    spec_for(ir.backend).check_text(ir, diags)
    assignment, judged = None, None
    if with_model and ir.model:
        judged = _judged_against_model(ir, parsed, diags.items)
        if judged is not None:
            assignment = resolve_model(judged.recipe, diags, judged.data_checked)
    return CheckResult(ir, tuple(diags.items), assignment, judged)


@dataclass(frozen=True)
class ModelView:
    """The recipe as the model checks see it (its items in error left out), whether its data is checked and
    whether it can be planned (its `calibrate` and `memory` have no errors)."""
    recipe: RecipeIR
    data_checked: bool
    plannable: bool


_OPTIONAL_ITEMS = {ast.EmitDecl: "emit", ast.KvCacheDecl: "kv_cache", ast.TransformDecl: "transform"}
_OPTIONAL_BLOCKS = {"mixed_precision": "mixed_precision", "verify": "verify"}


def _judged_against_model(ir: RecipeIR, parsed: ast.Recipe, found: list[Diagnostic]) -> ModelView | None:
    """The model is checked beside the recipe's own mistakes, so that one run reports them all (the README's
    promise); but an item already in error is not judged again against the model (one mistake, one
    diagnostic): a rule whose scheme is undefined or has an error assigns `none`, a rule with a bad pattern
    and a group, `emit`, `kv_cache`, `transform`, `mixed_precision` or `verify` with an error are left out,
    and a `calibrate` block with an error has its data left unchecked. None: the model or backend itself
    is in error, so nothing can be checked against it."""
    errors = [d.span for d in found if d.is_error and d.span is not None]

    def in_error(span: Span | None) -> bool:
        return span is not None and any(e.source is span.source and span.start <= e.start < span.end for e in errors)

    if not errors:
        return ModelView(ir, True, True)
    faulty = [item for item in parsed.items if in_error(item.span)]
    # a `--set KEY=VALUE` in error puts its item in error (its span is in the override's own source)
    overridden = {e.source.name.split(" ")[1].split(".")[0] for e in errors if e.source.name.startswith("--set ")}
    if overridden & {"model", "backend"} or any(isinstance(item, ast.ModelDecl | ast.BackendDecl) for item in faulty):
        return None
    known = {s.name for s in ir.schemes} | {NONE.name}
    broken = {item.name.value for item in faulty if isinstance(item, ast.SchemeDecl)}
    rules = tuple(replace(r, scheme=NONE.name) if r.scheme in broken or r.scheme not in known else r
                  for r in ir.rules if not any(in_error(s.span) for s in r.selectors))
    dropped = {_OPTIONAL_ITEMS[type(item)] for item in faulty if type(item) in _OPTIONAL_ITEMS}
    dropped |= {_OPTIONAL_BLOCKS[item.kind] for item in faulty
                if isinstance(item, ast.Block) and item.kind in _OPTIONAL_BLOCKS} | overridden
    blocks = {item.kind for item in faulty if isinstance(item, ast.Block)} | overridden
    judged = replace(ir, rules=rules, groups=tuple(g for g in ir.groups if not in_error(g.span)),
                     emit=None if "emit" in dropped else ir.emit,
                     kv_cache=None if "kv_cache" in dropped else ir.kv_cache,
                     transform=None if "transform" in dropped else ir.transform,
                     mixed_precision=None if "mixed_precision" in dropped else ir.mixed_precision,
                     verify=None if "verify" in dropped else ir.verify)
    return ModelView(judged, "calibrate" not in blocks, not blocks & {"calibrate", "memory"})


def resolve_model(ir: RecipeIR, diags: Diagnostics, data_checked: bool = True) -> Assignment | None:
    """Index the recipe's model (metadata only: no weight bytes) and resolve the recipe against it, then
    ask the recipe's backend what it cannot compile; a model that cannot be read is a diagnostic.
    `data_checked`: also check the calibration data (False when the recipe's `calibrate` is in error)."""
    try:
        index = index_model(ir.model, ir.emit is not None and ir.emit.format is EmitFormat.GGUF)
    except ModelError as exc:
        diags.error(exc.code, exc.message, ir.model_span, "model", help=exc.help)
        return None
    assignment = resolve(ir, index, diags)
    if assignment is not None:
        spec_for(ir.backend).check(ir, assignment, diags)
        if data_checked:
            _check_data(ir, assignment, diags)
        _check_output(ir, diags, data_checked)
    return assignment


def _check_data(ir: RecipeIR, assignment: Assignment, diags: Diagnostics) -> None:
    """What the samples need, at check time, when a stage uses samples: every integer input fillable by
    synthetic data (Q253: never zeros instead, which would calibrate on one constant sequence and verify
    nothing), or the data file and tokenizer there (Q401/Q216: they used to surface at compile)."""
    if not (ir.verify or workload(ir, assignment).calibrate):
        return
    data = ir.calibration.data
    span = data.span_of("data") or ir.calibration.span_of("data") or ir.span
    problems = path_problems(data, ir.model) + npz_problems(data, assignment.model)
    if data.kind is DataKind.SYNTHETIC:
        problems = unsynthesisable(assignment.model) + problems
    diags.items.extend(problem.at(data, span) for problem in problems)
    chunks = (ir.calibration.chunk,) + ((min(ir.calibration.chunk, ir.verify.samples),) if ir.verify else ())
    diags.items.extend(problem.at(ir.calibration, span) for problem in runtime_problems(data, assignment.model, chunks))


def _check_output(ir: RecipeIR, diags: Diagnostics, with_data: bool) -> None:
    """Q416: the emit path would replace the model or another input (or is a symlink)."""
    if ir.emit is None:
        return
    problem = output_conflict(Path(ir.emit.path), ir.model, read_paths(ir, with_data))
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
    diags = Diagnostics(list(checked.diagnostics))
    plan = _plan(checked.recipe, checked.assignment, detected_free, diags, ranks, rates or _this_machine())
    return PlanResult(checked, plan, tuple(diags.items))


def _plan(ir: RecipeIR, assignment: Assignment, detected_free: int | None, diags: Diagnostics, ranks: int | None,
          rates: Rates) -> Plan | None:
    """The plan of a resolved recipe; `detected_free` (for recipes without `ram`) is measured when None."""
    if detected_free is None:
        import psutil

        detected_free = psutil.virtual_memory().available
    spec = spec_for(ir.backend)
    planned = spec.planned(ir, assignment)
    plan = build_plan(ir, planned, detected_free, diags, spec.costs, spec.lowering, ranks, rates)
    table = spec.runtimes(ir, planned)
    check_target(ir.emit, table, diags)
    return None if plan is None else replace(plan, runtimes=table)


def check_before_work(path: str | Path, overrides: tuple[str, ...] = (), overwrite: bool = False,
                      output: Path | None = None) -> CheckResult:
    """`qrc check`: the recipe against its model (as `check_file`), then every check `qrc plan` and `qrc compile`
    run before any work, reported together: whether the plan fits the memory budget (Q301) and whether the
    output path can be written (compiler/destination.py). Reads no weights and no data rows; the plan's times
    are not estimated (no speed probe), so this stays a check's cost."""
    from compiler.destination import check_destination

    checked = check_file(path, overrides, with_model=True)
    view, assignment = checked.judged, checked.assignment
    if view is None or assignment is None or not view.plannable:
        return checked
    diags = Diagnostics(list(checked.diagnostics))
    plan = _plan(view.recipe, assignment, None, diags, None, REFERENCE)
    needed = output_bytes(plan) if plan is not None else 0
    diags.items.extend(check_destination(view.recipe, output, needed, overwrite, emit_required=False).problems)
    return replace(checked, diagnostics=tuple(diags.items), runtimes=plan.runtimes if plan is not None else ())


def output_bytes(plan: Plan) -> int:
    """What the plan says the emitted model takes."""
    from compiler.plan.ops import Emit

    emit = plan.first(Emit)
    return emit.bytes if isinstance(emit, Emit) else 0


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
