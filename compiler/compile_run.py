"""`qrc compile`: plan, then execute on the backend with progress bars, then a closing summary."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from compiler.backends.ranks import Ranks, all_gathered, from_environment, joined, lost_ranks_message
from compiler.backends.registry import spec_for
from compiler.backends.result import over_plan
from compiler.destination import check_destination
from compiler.diagnostics import Diagnostic, StageError, error, printable, warning
from compiler.frontend import PlanResult, output_bytes, plan_file
from compiler.inspect_table import totals
from compiler.ir.checks import unshared_error
from compiler.ir.printer import recipe_hash
from compiler.ir.values import human_bytes
from compiler.models.cache_entries import release_held
from compiler.models.names import compress
from compiler.outputs import destination_lock
from compiler.plan.render import human_seconds
from compiler.plan.workload import workload
from compiler.quant.parallel import cannot_start_thread
from compiler.safe_files import UnsafePath


class CompileFailed(Exception):
    """A compile stopped with diagnostics (the result is kept when a model was written but failed verification)."""
    def __init__(self, diagnostics: tuple[Diagnostic, ...], result=None, planned: PlanResult | None = None,
                 running: bool = False):
        super().__init__(len(diagnostics))
        self.diagnostics = diagnostics
        self.result, self.planned = result, planned  # set when a model was written but failed verification
        self.running = running  # raised while the backend ran: under torchrun, possibly this rank's alone


def quiet_third_party_bars() -> None:
    """transformers', compressed-tensors' and the hub's tqdm bars ("Loading weights", "Compressing model") would
    print between qrc's own rows: tqdm and the hub read these variables (a user's own setting is kept)."""
    os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


@contextmanager
def terminate_as_interrupt():
    """SIGTERM unwinds like Ctrl-C, so temporary files are removed on the way out. The CLI holds it for the whole
    command (a SIGTERM before the run's work must not kill the process uncleanly either); the run holds it again
    for callers of the API."""
    def handler(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def compile_recipe(recipe: Path, overrides: tuple[str, ...], output: Path | None, console: Console,
                   report: Path | None = None, overwrite: bool = False, started: float | None = None):
    """Run a compile; returns (result, planned). Raises CompileFailed with the diagnostics on errors.
    `report`: where the CLI will write its report, checked against every path the compile reads and writes.
    `overwrite`: replace a destination qrc did not write (else Q440 before any work).
    `started`: when the compile began (time.time()): the CLI's process start, whose interpreter and imports the
    plan's time counts too; this call's start when None. The result's `wall_seconds` are measured from it.

    The plan is the program: the recipe's backend (from the registry) runs its ops in order. Under torchrun
    it is planned for the ranks torchrun started (each rank's share), whatever `ranks` the recipe gives."""
    started = time.time() if started is None else started
    try:
        ranks = from_environment()
    except StageError as exc:  # RANK / WORLD_SIZE that name no rank
        raise CompileFailed((exc.diagnostic,)) from None
    quiet_third_party_bars()
    try:
        return _compiled(recipe, overrides, output, console, report, overwrite, started, ranks)
    finally:
        release_held()  # the cache entries it used may be pruned by later runs (models/cache_entries.py)


def _compiled(recipe: Path, overrides: tuple[str, ...], output: Path | None, console: Console, report: Path | None,
              overwrite: bool, started: float, ranks: Ranks):
    """compile_recipe's body, once the ranks are known."""
    planned = _planned_for(recipe, overrides, ranks.world)
    if not planned.ok:
        raise CompileFailed(planned.diagnostics)
    ir = planned.check.recipe
    spec = spec_for(ir.backend)
    needed = output_bytes(planned.program)
    checked = check_destination(ir, output, needed, overwrite, report)
    if checked.problems or checked.path is None:
        raise CompileFailed(checked.problems)
    destination = checked.path

    with spec.prepare(planned.program, ranks.first):  # before the backend's imports, what can run beside them
        execute = spec.load_executor()
        result, planned = _locked(execute, ir, planned, destination, console, needed, ranks)
    result.wall_seconds = time.time() - started
    return result, planned


def _locked(execute, ir, planned: PlanResult, destination: Path, console: Console, needed: int, ranks: Ranks):
    """The compile with the destination held: one rank holds it, the others write nothing
    (compiler/backends/ranks.py)."""
    try:
        return _joined(execute, ir, planned, destination, console, needed, ranks)
    except StageError as exc:  # the ranks could not form their process group (Q444), before any work
        raise CompileFailed(planned.diagnostics + (exc.diagnostic,), None, planned, running=True) from None


def _joined(execute, ir, planned: PlanResult, destination: Path, console: Console, needed: int, ranks: Ranks):
    with joined(ranks) as peers, _held_by_first(ranks, destination, ir, needed):
        _same_run_on_every_rank(ranks, planned, destination)
        before = _identity(destination)
        try:
            return _execute(execute, ir, planned, destination, console, needed)
        except KeyboardInterrupt:
            if ranks.world > 1 and any(p.gone() for p in peers):  # torchrun ends the others when one dies
                raise _rank_lost(ranks, peers, planned, None) from None
            raise Interrupted(destination if _identity(destination) != before else None) from None
        except RuntimeError as exc:  # a merge whose peer died or timed out (torch.distributed's errors)
            if ranks.world > 1 and _distributed(exc):
                raise _rank_lost(ranks, peers, planned, exc) from None
            raise


@contextmanager
def _held_by_first(ranks: Ranks, destination: Path, ir, needed: int) -> Iterator[None]:
    """The first rank holds the destination for the run (the others write nothing). Taken once the ranks have
    joined, and its refusal (a link planted where the lock goes, another compile writing there) is every rank's:
    taken before, a refused first rank left the others waiting in the process group's rendezvous, where torchrun's
    SIGTERM cannot reach Python, until its SIGKILL 30 s later."""
    with ExitStack() as stack:
        refused: tuple[Diagnostic, ...] | None = None
        if ranks.first:
            try:
                held = stack.enter_context(_held(destination, ir, needed))
            except CompileFailed as exc:
                refused = exc.diagnostics
            else:
                if held is not None:
                    refused = (error("Q429", f"another qrc compile is writing `{destination}` ({held})", ir.span,
                                     "destination busy", help="wait for it to finish, or write to another path "
                                     "(`-o PATH`); this run wrote nothing"),)
        if ranks.world > 1:
            refused = all_gathered(ranks, refused)[0]
        if refused is not None:
            raise CompileFailed(refused)
        yield


@contextmanager
def _held(destination: Path, ir, needed: int) -> Iterator[str | None]:
    """outputs.destination_lock, with a failure to take it (the disk filled after the free-space check, before
    the lock file took this process's id) a Q417 like the check's own rather than a traceback."""
    with ExitStack() as stack:
        try:
            held = stack.enter_context(destination_lock(destination))
        except UnsafePath as exc:
            raise CompileFailed((unsafe_path_error(exc, ir.span),)) from None
        except OSError as exc:
            raise CompileFailed((error("Q417", f"`{destination}` could not be taken for this compile: "
                                       f"{exc.strerror or exc}", ir.span, "cannot write the output",
                                       help=f"write to a folder you can write with {human_bytes(needed)} free "
                                       "(`-o PATH`); nothing was written"),)) from None
        yield held


def unsafe_path_error(exc: UnsafePath, span) -> Diagnostic:
    """Q441: a path the compile writes holds a link, a FIFO or a device; what it points to was not touched."""
    return error("Q441", exc.reason, span, "refused to write through it",
                 help="remove it (it was not written by this compile, and what it points to is untouched), or "
                 "write to another path (`-o PATH`)")


def _same_run_on_every_rank(ranks: Ranks, planned: PlanResult, destination: Path) -> None:
    """Q446 on every rank when torchrun's ranks were given different recipes, settings or outputs: each would
    plan its own share of another run, and the first rank's writer would meet tensors of another layout."""
    if ranks.world == 1:
        return
    mine = (recipe_hash(planned.program.recipe_text), str(destination.resolve()))
    every = all_gathered(ranks, mine)
    if len(set(every)) > 1:
        differ = [rank for rank, theirs in enumerate(every) if theirs != every[0]]
        raise CompileFailed((error(
            "Q446", f"torchrun's ranks were given different runs: rank(s) {', '.join(map(str, differ))} differ from "
            "rank 0 in the recipe, its settings or the output path", planned.check.recipe.span, "ranks disagree",
            help="start every rank with the same command (torchrun does); nothing was written"),), None, planned)


def _distributed(exc: BaseException) -> bool:
    """Whether `exc` is torch.distributed's: a lost connection or a timeout in a merge."""
    return type(exc).__module__.startswith("torch.distributed") or type(exc).__name__.startswith("Dist") or \
        any(word in str(exc) for word in ("gloo", "Gloo", "Connection closed", "Timed out", "NCCL"))


def _rank_lost(ranks, peers, planned: PlanResult, exc: BaseException | None) -> CompileFailed:
    """Q432: the compile lost a rank; nothing was written (the first rank writes last, all or nothing)."""
    said = (str(exc).strip().splitlines() or [""])[0][:200] if exc is not None else ""
    return CompileFailed(planned.diagnostics + (error(
        "Q432", lost_ranks_message(ranks, peers) + (f" ({type(exc).__name__}: {said})" if exc is not None else ""),
        planned.check.recipe.span, "a rank stopped",
        help="nothing was written to the destination; see why that rank ended (memory, a signal, its node) in "
        "torchrun's report and compile again"),), None, planned, running=True)


def _planned_for(recipe: Path, overrides: tuple[str, ...], world: int) -> PlanResult:
    """The plan for `world` ranks (Q431 where the recipe has what they cannot share); Q433 when the recipe
    planned for another number (it runs as launched: alone, or as torchrun's ranks)."""
    planned = plan_file(recipe, overrides, ranks=world)
    if not planned.ok:
        return planned
    ir = planned.check.recipe
    refused = unshared_error(ir, world)
    if refused is not None:
        return replace(planned, diagnostics=(*planned.diagnostics, refused))
    asked = ir.memory.ranks
    if asked == world or ir.memory.span_of("ranks") is None:  # as the recipe plans, or it leaves it to the launch
        return planned
    launch = (f"launch it with `torchrun --nproc_per_node {asked} -m compiler compile {recipe}`" if world == 1
              else f"give `ranks {world}`, or start {asked} processes")
    mismatch = warning("Q433", f"the recipe plans for {asked} rank(s); this compile runs as {world}",
                       ir.memory.span_of("ranks"), f"runs as {world}",
                       help=f"the plan was made again for {world}; {launch}")
    return replace(planned, diagnostics=(mismatch, *planned.diagnostics))


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM during a compile; `written` is the destination when the compiled model had already
    moved into place (the commit is a rename: what is there is complete), else None."""

    def __init__(self, written: Path | None):
        super().__init__()
        self.written = written


def _identity(path: Path) -> tuple[int, int] | None:
    """What is at `path` (inode, change time), None when nothing: a commit replaces it."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_ino, found.st_ctime_ns


def _execute(execute, ir, planned: PlanResult, destination: Path, console: Console, needed: int):
    """The backend's run under progress bars, its failures as diagnostics."""
    with _progress(console) as progress, terminate_as_interrupt():
        try:
            result = execute(planned.program, planned.assignment, destination, progress)
            said = over_plan(result, ir.span)
            if said is not None:  # printed with the run's warnings, and first in the report
                result.warnings.append(said)
        except StageError as exc:  # a backend's failure, or its data's
            raise CompileFailed(planned.diagnostics + (exc.diagnostic,), getattr(exc, "result", None), planned,
                                running=True) from None
        except RuntimeError as exc:
            if not cannot_start_thread(exc):
                raise
            raise CompileFailed(planned.diagnostics + (error(
                "Q445", "the system refused to start a thread qrc needs (a process limit, or `ulimit -v` below what a "
                "thread's stack takes)", ir.span, "no thread", help="raise the limit (`ulimit -u`, `ulimit -v`) or run "
                "where it is higher; qrc's rounding already falls back to one thread; nothing was written"),),
                None, planned, running=True) from None
        except UnsafePath as exc:  # a link or a FIFO planted where the run writes (a lock, a state, a cache)
            raise CompileFailed(planned.diagnostics + (unsafe_path_error(exc, ir.span),), None, planned,
                                running=True) from None
        except OSError as exc:  # disk full, a folder made read-only meanwhile: the backends left no partial output
            where = exc.filename or destination
            raise CompileFailed(planned.diagnostics + (error(
                "Q417", f"cannot write `{where}`: {exc.strerror or exc}", ir.span, "write failed",
                help=f"the output needs about {human_bytes(needed)} (plus the disk caches of offload); free space "
                     "or choose another folder; nothing was left at the destination"),), None, planned, running=True) from None
    return result, planned


class EtaColumn(ProgressColumn):
    """The time a bar still needs at the pace of its steps so far (`eta 1:05`), `eta …` before the first step
    has a pace, nothing once done: each stage's bar says when it will end, not only how long it has run."""

    def render(self, task) -> Text:
        """The bar's time left, as text."""
        if task.finished:
            return Text("")
        left = task.time_remaining
        if left is None:
            return Text("eta …", style="progress.remaining")
        minutes, seconds = divmod(int(left + 0.5), 60)
        hours, minutes = divmod(minutes, 60)
        return Text(f"eta {hours}:{minutes:02d}:{seconds:02d}" if hours else f"eta {minutes}:{seconds:02d}",
                    style="progress.remaining")


@contextmanager
def _progress(console: Console):
    bars = Progress(TextColumn("{task.description:<10}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    EtaColumn(), console=console, transient=False)

    def stage(name: str, total: int):
        task = bars.add_task(name, total=total)
        return lambda: bars.advance(task)

    with bars:
        yield stage


def verify_figures(figures: dict[str, float], metric: str) -> str:
    """The verification figures as the summary lists them: the pooled-embedding cosine only when asked (it
    means nothing for a decoder's logits); perplexity as both models' figures and the relative increase."""
    perplexity = ("perplexity", "float_perplexity", "emitted_perplexity")
    shown = [f"{k} {val:.4g}" for k, val in figures.items()
             if k not in perplexity and (k != "embedding_cosine" or k == metric)]
    if "perplexity" in figures:
        shown.append(f"perplexity {figures['float_perplexity']:.4g} float → {figures['emitted_perplexity']:.4g} "
                     f"emitted ({figures['perplexity']:+.2f}%)")
    return ", ".join(shown)


class _PlainTable(Table):
    """A table whose cells are plain text: layer names, paths and notes are never read as rich markup, and their
    control characters are shown escaped."""

    def add_row(self, *cells, **options) -> None:
        super().add_row(*(Text(printable(c)) if isinstance(c, str) else c for c in cells), **options)


def summary(result, planned: PlanResult) -> Table:
    """The closing summary table of a compile."""
    table = _PlainTable(title=Text(printable(f"compiled {planned.check.recipe.name} → {result.output}")),
                        show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    for t in totals(result.assignment):
        table.add_row(f"scheme {t.scheme}", f"{t.layers} layer{'s' if t.layers != 1 else ''}, {t.params:,} params, "
                      f"{human_bytes(t.bytes_before)} → {human_bytes(t.bytes_after)}")
    before = planned.assignment.model.total_bytes
    after = sum(f.stat().st_size for f in result.files)
    table.add_row("model size", f"{human_bytes(before)} of weights → {human_bytes(after)} on disk")
    calibrates = workload(planned.check.recipe, planned.assignment).calibrate
    planned_s = result.planned_seconds
    table.add_row("time", f"{human_seconds(result.wall_seconds)} measured vs {human_seconds(planned_s)} planned "
                  f"({result.wall_seconds / planned_s if planned_s else 0:.2f}×); "
                  + (f"calibration {result.calibration_seconds:.2f} s" if calibrates else "no calibration pass"))
    planned_peak = result.planned_peak
    ratio = result.peak_rss / planned_peak if planned_peak else 0
    cached = "; export from the cache" if "export_onnx" in result.skipped else ""
    together = "; with its child processes" if result.peak_with_children else ""  # as the plan counts them
    table.add_row("peak RSS", f"{human_bytes(result.peak_rss)} measured vs {human_bytes(planned_peak)} planned "
                  f"({ratio:.2f}×), mode {planned.program.mode.value}{cached}{together}")
    if result.rank_peaks:  # each rank's, against the same per-rank plan
        table.add_row("per rank", ", ".join(f"rank {r} {human_bytes(b)} ({b / planned_peak if planned_peak else 0:.2f}×)"
                                           for r, b in enumerate(result.rank_peaks)))
    for note in result.notes:
        table.add_row("note", note)  # multi_gpu's placement, a resumed run
    if result.transform:
        table.add_row("transform", result.transform)
    if result.learned:
        table.add_row("learned rounding", result.learned)
    if result.search is not None:
        s = result.search
        table.add_row("mixed precision", f"{len(s.units)} units by {s.metric.value}: {s.average_bits:.3f} bits per weight "
                      f"(budget {s.budget_bits:g}){'; scores from the cache' if s.from_cache else ''}")
        for choice, layers in s.layers_by_choice().items():
            table.add_row(f"  → {choice}", f"{len(layers)} layers: {', '.join(compress(layers))}")
    v = planned.check.recipe.verify
    if result.verify is not None and v is not None:
        table.add_row("verify", f"{'passed' if result.verify_passed else 'FAILED'}: {v.metric.value} "
                      f"{result.verify.get(v.metric.value, float('nan')):.4g} ({v.bound.value} {v.threshold:g}); "
                      f"{verify_figures(result.verify, v.metric.value)}"
                      + (f"; measured on {result.verified_on}" if result.verified_on else ""))
    return table
