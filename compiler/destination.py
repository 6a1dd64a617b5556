"""Where a compile writes, checked before any work: the same checks for `qrc compile` (which stops on them)
and `qrc check` (which reports them beside the recipe's other mistakes). Every problem is collected, so one
run names all of them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from compiler.backends.registry import spec_for
from compiler.backends.spec import OutputKind
from compiler.diagnostics import Diagnostic, error
from compiler.ir.types import RecipeIR
from compiler.ir.values import human_bytes
from compiler.outputs import foreign_destination, normalized_output, output_conflict, read_paths, unwritable
from compiler.safe_files import unnameable


@dataclass(frozen=True)
class Destination:
    """The output path a compile would write (None when there is none) and what is wrong with it."""
    path: Path | None
    problems: tuple[Diagnostic, ...]


def check_destination(ir: RecipeIR, given: Path | None, needed: int, overwrite: bool,
                      report: Path | None = None, emit_required: bool = True) -> Destination:
    """The output path (`given`, else the recipe's emit path) and every reason a compile could not write
    `needed` bytes there without losing something: no path (Q412, only when `emit_required`), a path with no
    name (Q413), one that would replace an input (Q416) or whose report would (Q239), the wrong kind of file
    for the format (Q413), files qrc did not write without `overwrite` (Q440), or too little room (Q417)."""
    if given is None and ir.emit is None:
        problems = (error("Q412", f"recipe `{ir.name}` says nowhere to write the model", ir.span, "no `emit`",
                          help='add `emit "out/model.onnx"` or pass `-o PATH`'),) if emit_required else ()
        return Destination(None, problems)
    span = (ir.emit.span_of("path") if ir.emit is not None and given is None else None) or ir.span
    path = given if given is not None else Path(ir.emit.path) if ir.emit is not None else Path()
    bad_name = unnameable(path)
    if bad_name:
        return Destination(None, (error("Q413", f"output path: {bad_name}", span, "not an output path",
                                        help="give a shorter path for the quantized model (`-o out/model`)"),))
    destination = normalized_output(path)
    if destination is None:
        return Destination(None, (error("Q413", f"output `{path}` has no name of its own", span,
                                        "not an output path", help="give a new file or folder path (`-o out/model`)"),))
    problems = _problems(ir, destination, span, needed, overwrite, report, given is not None)
    return Destination(destination, tuple(problems))


def _inside_output(report: Path, destination: Path) -> str | None:
    """A report under the output's path, which is not there yet on a first compile (output_conflict asks that of
    folders that exist): the report would be written into the compiled model's folder, or the folder made where
    the model file goes."""
    if destination.resolve() in report.resolve().parents:
        return f"`{report}` is inside the compiled model `{destination}`"
    return None


def _problems(ir: RecipeIR, destination: Path, span, needed: int, overwrite: bool, report: Path | None,
              from_option: bool):
    reads = read_paths(ir)
    conflict = output_conflict(destination, ir.model, reads)
    if conflict:  # the recipe's emit path was reported with the recipe (frontend, Q416); `-o` is reported here
        if from_option:
            yield error("Q416", conflict, span, "would replace an input", help="write the quantized model to a "
                        "new path, apart from the model and the files the recipe reads")
        return  # the rest is about replacing the destination, which must not happen at all
    if report is not None:
        clash = output_conflict(report, ir.model, [*reads, ("compiled model", destination)]) or \
            _inside_output(report, destination)
        if clash:
            yield error("Q239", f"report {clash}", None, "would replace a file of the compile",
                        help="write the report to a path of its own (e.g. `--report out/report.html`)")
    spec = spec_for(ir.backend)
    wants_folder = spec.output_for(ir.emit.format if ir.emit else None) is OutputKind.FOLDER
    if destination.exists() and destination.is_dir() != wants_folder:
        what = "a folder" if destination.is_dir() else "a file"
        yield error("Q413", f"output `{destination}` is {what}", span, "wrong kind of output",
                    help=f"give {spec.output_help}")
        return  # a file where a folder goes (or the reverse) is not replaced, so nothing more to say about it
    foreign = None if overwrite else foreign_destination(destination)
    if foreign:  # a compile replaces its destination whole: only what an earlier compile wrote
        yield error("Q440", foreign, span, "would delete files qrc did not write",
                    help="write to a new path (`-o PATH`), or pass `--overwrite` to replace it and everything in "
                    "it on purpose; nothing was written")
    problem = unwritable(destination, needed)
    if problem:
        yield error("Q417", problem, span, "cannot write the output",
                    help=f"write to a folder you can write with {human_bytes(needed)} free (`-o PATH`)")
