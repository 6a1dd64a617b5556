"""What a backend returns from a compile, and the verdict on its verification figures (shared by the
ONNX and torch backends)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from compiler.backends import BackendError
from compiler.backends.agreement import Agreement, passes
from compiler.backends.products import Product, Verification
from compiler.backends.sensitivity import SearchResult
from compiler.diagnostics import Diagnostic, error, warning
from compiler.ir.types import VerifyMetric
from compiler.plan.ops import Buffer, CaptureReference, HeldOut, Plan, PlanOp, Verify
from compiler.resolve.assignment import Assignment
from compiler.safe_files import read_json, replace_file
from compiler.source import Span


@dataclass
class CompileResult:
    """What a backend returns from a compile (also when verification failed: the report shows it)."""

    output: Path
    files: list[Path]
    plan: Plan
    peak_rss: int = 0
    peak_with_children: bool = False  # peak_rss adds the child processes the compile ran (an export, a load check)
    rank_peaks: tuple[int, ...] = ()  # under torchrun: each rank's measured peak, in rank order
    calibration_seconds: float = 0.0
    total_seconds: float = 0.0  # from the first op to the last
    wall_seconds: float = 0.0  # the whole compile, from its process's start where the CLI runs it (compile_run.py)
    verify: dict[str, float] | None = None
    verify_passed: bool | None = None
    verified_on: str = ""  # what verification ran: the emitted artifact through its loader, or qrc's own model
    verify_failure: Diagnostic | None = None  # Q501, raised once the model is in place (program.py)
    warnings: list[Diagnostic] = field(default_factory=list)
    rss_samples: list[tuple[float, int, PlanOp | None]] = field(default_factory=list)  # (s, bytes, op running)
    executed: list[PlanOp] = field(default_factory=list)  # the plan's ops, each once its handler returned
    op_seconds: list[tuple[PlanOp, float]] = field(default_factory=list)  # each op's wall time, as it ran
    notes: list[str] = field(default_factory=list)  # what the run decided that the plan could not know
    transform: str | None = None  # what the outlier transform did (folded mappings, AWQ's error reduction)
    learned: str | None = None  # what learned rounding cost (its steps' time) and bought (the blocks' output error)
    assignment: Assignment | None = None  # what was compiled (both backends set it): the plan's, or the search's
    search: SearchResult | None = None
    weight_sqnr: dict[str, float] = field(default_factory=dict)  # layer → weight SQNR in dB
    input_ranges: dict[str, tuple[float, float]] = field(default_factory=dict)  # layer → its input's quantized range
    layer_errors: dict[str, float] = field(default_factory=dict)  # when verification failed: error each layer adds
    skipped: frozenset[str] = frozenset()  # op kinds that ran without their work (an export taken from the cache)
    reads: list[tuple[PlanOp, Buffer]] = field(default_factory=list)  # each op and the buffers its handler read

    def absorb(self, op: PlanOp, product: Product | None) -> None:
        """What one op reported (compiler/backends/products.py), added to the result."""
        if product is None:
            return
        self.warnings.extend(product.warnings)
        self.notes.extend(product.notes)
        if product.assignment is not None:
            self.assignment = product.assignment
        if product.search is not None:
            self.search = product.search
        if product.transform is not None:
            self.transform = product.transform
        if product.learned is not None:
            self.learned = product.learned
        if product.calibration_seconds is not None:
            self.calibration_seconds = product.calibration_seconds
        self.weight_sqnr.update(product.weight_sqnr)
        self.input_ranges.update(product.input_ranges)
        if product.files:
            self.files = list(product.files)
        if product.from_cache:
            self.skipped |= {op.kind.value}
        v = product.verification
        if v is not None:
            self.verify, self.verify_passed, self.verified_on = dict(v.figures), v.passed, v.measured_on
            self.layer_errors, self.verify_failure = dict(v.layer_errors), v.failure

    @property
    def planned_seconds(self) -> float:
        """The plan's time over the ops that did their work (an export found in the cache took none), and the
        start: what the measured wall time is held against."""
        return self.plan.start_seconds + sum(op.seconds for op in self.plan.ops if op.kind.value not in self.skipped)

    @property
    def planned_peak(self) -> int:
        """The plan's peak over the ops that did their work: what the measured peak is held against (an
        export found in the cache costs nothing, so its estimate does not count)."""
        return max((op.peak_bytes for op in self.plan.ops if op.kind.value not in self.skipped), default=0)


def judge(v: Verify, span: Span | None, output: Path, agreement: Agreement, measured_on: str,
          layer_errors: dict[str, float], writes: bool = True) -> Verification:
    """The verdict on the figures; below the op's bound, a `.verify.json` report beside the output and Q501
    (pointing at `span`), which the program raises after the model went into place (the last step of a run).
    `layer_errors`: what each layer adds, measured when the bound was missed. `writes`: False on torchrun's
    ranks but the first, which judge the same figures but write nothing."""
    figures = agreement.figures()
    value = agreement.value(v.metric)
    passed = passes(value, v.bound, v.threshold)
    report = output.with_name(output.name + ".verify.json")
    failure = None
    if not writes:
        pass
    elif passed:
        if _own_report(report):  # an earlier failed compile's figures no longer hold
            report.unlink()
    else:
        foreign = report.is_file() and not report.is_symlink() and not _own_report(report)
        if not foreign:  # a link or a FIFO there is refused (Q441); another program's file is left as it is
            replace_file(report, json.dumps({"metric": v.metric.value, "bound": v.bound.value, "threshold": v.threshold,
                                             "value": value, "figures": figures, "measured_on": measured_on},
                                            indent=2) + "\n")
        failure = error("Q501", f"verification failed: {_measured(v.metric, value, figures)}, the recipe asks "
                        f"{v.bound.value} {v.threshold:g}{'%' if v.metric is VerifyMetric.PERPLEXITY else ''}", span, "not met",
                        help=_q501_help(output, None if foreign else report, layer_errors))
    return Verification(tuple(figures.items()), passed, measured_on, tuple(layer_errors.items()), failure)


def _measured(metric: VerifyMetric, value: float, figures: dict[str, float]) -> str:
    """The figure as the bound reads it: perplexity is an increase in percent, shown with both perplexities."""
    if metric is VerifyMetric.PERPLEXITY and "float_perplexity" in figures:
        return (f"perplexity rose {value:+.4g}% ({figures['float_perplexity']:.6g} float → "
                f"{figures['emitted_perplexity']:.6g} emitted)")
    return f"{metric.value} = {value:.6g}"


def _own_report(report: Path) -> bool:
    """Whether `report` is a `.verify.json` qrc wrote (a regular file of its keys), which it may replace or
    remove; anything else at that name is left as it is."""
    if not report.is_file() or report.is_symlink():
        return False
    try:
        found = read_json(report, 1 << 20, own=True)
    except (OSError, ValueError):
        return False
    return isinstance(found, dict) and {"metric", "bound", "threshold", "value", "figures"} <= found.keys()


def _q501_help(output: Path, report: Path | None, layer_errors: dict[str, float]) -> str:
    """Where the model and figures are (`report` None: a file qrc did not write is at its name, so the figures
    are only in the summary), and the layers that lose the most, when they were measured."""
    where = f"the emitted model is left at {output} with the figures in " + (
        report.name if report is not None else f"the summary (a file qrc did not write is at {output.name}.verify.json)")
    worst = [(name, err) for name, err in layer_errors.items() if err > 0][:3]
    if not worst:
        return where + "; try a wider scheme for sensitive layers"
    named = ", ".join(f"`{name}` (adds {err:.3g} relative error)" for name, err in worst)
    return f"{where}; the layers that lose the most: {named}: give them a wider scheme, e.g. `\"{worst[0][0]}\" -> W8A16`"


def refuse_nonfinite(span: Span | None, layer, values) -> None:
    """Q409: a weight with NaN or infinite values would give a NaN or infinite scale; the compile stops
    before anything is written."""
    import numpy as np

    bad = int(values.size - np.count_nonzero(np.isfinite(values)))
    if bad:
        raise BackendError(error("Q409", f"`{layer.name}` has {bad:,} non-finite weights (NaN or ±inf)", span,
                                 "non-finite weights", help=f"repair the checkpoint, or give `{layer.name}` `-> none` "
                                 "to keep it as it is"))


# Relative change of the float output a transform's fold may cause: float32 rounding is ~1e-6, half-precision
# compute ~1e-3; a mapping whose source also feeds something outside its targets changes it by far more.
FOLD_TOLERANCE = {True: 1e-3, False: 2e-2}  # by whether the model computes in float32


def output_change(before, after) -> float:
    """‖after − before‖ / ‖before‖ of a model's output, computed in float32."""
    import numpy as np

    before, after = np.asarray(before, np.float32), np.asarray(after, np.float32)
    return float(np.linalg.norm(after - before)) / max(float(np.linalg.norm(before)), 1e-12)


def refuse_changed_output(span: Span | None, before, after, float32: bool, sources: list[str]) -> None:
    """Q422: a transform's fold must leave the float output (`before`, `after`: one chunk's) as it was; the
    compile stops before anything is written."""

    # in the outputs' own precision: a change is compared with 1e-3 at the least, far above float32's rounding,
    # and a float64 copy of a language model's logits (rows x positions x vocabulary) cost more than the forwards
    change = output_change(before, after)
    if change <= FOLD_TOLERANCE[float32]:
        return
    raise BackendError(error(
        "Q422", f"folding the transform's scales changed the float output by {change:.2%} "
        f"({', '.join(sources[:3])}): a mapping's source feeds something its targets do not cover",
        span, "not an equivalent transform",
        help="check the `map` lines against the model (every reader of a source must be a target), or remove "
        "them to use the inferred mappings"))


def held_out_batches(op: Verify | CaptureReference | HeldOut, index, warnings: list[Diagnostic], chunk: int | None = None):
    """The op's held-out samples (in its chunks, or `chunk`), never calibration's; Q406 into `warnings` when a
    data file too short for both made calibration take fewer (Q448 when it cannot give one of each)."""
    from compiler import data

    batches, total = data.verify_batches(op.data, index, op.samples, chunk or op.chunk)
    if total is not None:
        warnings.append(warning(
            "Q406", f"`{op.data.path}` gives {total} samples: verification holds out its last {batches.samples}"
            f", so calibration used {batches.start} of the {op.data.samples} the recipe asks", op.data.span_of("data"),
            "calibration shortened", help=f"give the file {op.data.samples + op.samples} samples to calibrate on all "
            f"{op.data.samples} and verify on {op.samples} others"))
    return batches


OVER_PLAN = 1.10  # a measured peak this far above its plan is said, not only shown


def over_plan(result: CompileResult, span: Span | None) -> Diagnostic | None:
    """Q447 (a warning) when the run's measured peak went more than 10% past its plan: by how much, in percent,
    and the op that was running at the highest sample (the one whose estimate missed)."""
    planned = result.planned_peak
    if not planned or result.peak_rss <= planned * OVER_PLAN:
        return None
    from compiler.ir.values import human_bytes

    top = max(result.rss_samples, key=lambda sample: sample[1], default=None)
    op = top[2] if top is not None else None
    during = f", during `{op.kind.value}` (planned {human_bytes(op.peak_bytes)})" if op is not None else ""
    return warning("Q447", f"the run went past its memory plan: {human_bytes(result.peak_rss)} measured against "
                   f"{human_bytes(planned)} planned, +{(result.peak_rss / planned - 1) * 100:.0f}%{during}", span,
                   "over the plan", help="the plan underestimated this run: give `ram` some room above `qrc plan`'s "
                   "figure, and please report the recipe and model so the estimate can be fixed")
