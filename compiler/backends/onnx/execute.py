"""Execute a plan on onnxruntime: calibrate → ranges → quantize and rewrite → emit → verify."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx

from compiler import data
from compiler.backends import BackendError
from compiler.backends.agreement import Agreement
from compiler.backends.onnx import emit, rewrite
from compiler.backends.onnx.calibrate import calibrate, session_from_path
from compiler.backends.onnx.files import ModelFiles, load_remaining, open_model
from compiler.backends.onnx.sensitivity import OnnxScorer
from compiler.backends.release import release_memory
from compiler.backends.result import CompileResult, held_out_batches, judge
from compiler.backends.rss import RssSampler
from compiler.backends.sensitivity import each_choice, search
from compiler.diagnostics import error, warning
from compiler.ir.printer import print_ir
from compiler.ir.types import ActivationMode, EmitFormat, Granularity, MemoryMode, RecipeIR
from compiler.models import builtin, resolve_path
from compiler.plan.ops import Plan
from compiler.plan.workload import Workload, workload
from compiler.quant import qparams
from compiler.quant.ranges import HISTOGRAM_METHODS, tensor_range
from compiler.resolve.assignment import Assignment

Progress = Callable[[str, int], Callable[[], None]]  # (stage, total) → advance-by-one


def model_path(ref: str) -> Path:
    """The .onnx file to compile: a built-in's cached file, a folder's cached export, or the path."""
    if ref.startswith(builtin.PREFIX):
        return builtin.onnx_path(ref)
    path = resolve_path(ref)
    if path.is_dir():
        from compiler.backends.onnx.export import export_folder

        return export_folder(path)
    return path


def check_supported(ir: RecipeIR, assignment: Assignment, plan: Plan) -> None:
    """What this backend cannot do yet is refused before any work, at the recipe text that asks for it."""
    for a in assignment.layers:
        act = a.scheme.activations
        if act and (act.mode is ActivationMode.DYNAMIC or act.granularity is Granularity.PER_TOKEN):
            raise BackendError(error("Q410", f"scheme `{a.scheme.name}`: dynamic or per-token activations are not "
                                     "supported by the ONNX backend", a.scheme.span or a.rule.span, "not supported",
                                     help="use static per_tensor activations, or a weight-only scheme"))


def execute(ir: RecipeIR, assignment: Assignment, plan: Plan, output: Path, progress: Progress) -> CompileResult:
    for candidate in each_choice(ir, assignment):
        check_supported(ir, candidate, plan)
    source = model_path(ir.model)
    result = CompileResult(output, [], plan, assignment=assignment)
    start, rss = time.perf_counter(), RssSampler()
    try:
        _compile(ir, assignment, plan, output, progress, result, rss, source, start)
    finally:  # also when verification fails: the report shows what was measured
        result.peak_rss, result.rss_samples = rss.peak, rss.samples
        result.total_seconds = time.perf_counter() - start
    return result


def _compile(ir, assignment, plan: Plan, output: Path, progress, result: CompileResult, rss: RssSampler, source: Path,
         start: float) -> None:
    with rss:
        files = open_model(source)
        try:
            if ir.mixed_precision is not None:
                rss.phase = "score"
                scorer = OnnxScorer(ir, assignment.model, files, source)
                assignment, result.search = search(ir, assignment, scorer, "onnx", progress)
                result.assignment = assignment
            w = workload(ir, assignment)
            rss.phase = "calibrate"
            activations = _activation_specs(ir, assignment, w, files, progress, result)
            result.calibration_seconds = time.perf_counter() - start
            release_memory()
            rss.phase = "quantize"
            jobs = {a.layer.weight: rewrite.WeightJob(a.layer, a.scheme) for a in assignment.layers if not a.scheme.is_none}
            sqnr: dict[str, float] = {}
            model = rewrite.rewrite(files.light, jobs, activations, _format(ir), files.array,
                                    progress("quantize", len(jobs)), sqnr)
            result.weight_sqnr = {a.layer.name: sqnr[a.layer.weight] for a in assignment.layers if a.layer.weight in sqnr}
            rss.phase = "emit"
            load_remaining(model, files.base_dir)
            emit.stamp(model, ir.name, print_ir(ir))
            # offload keeps the weights out of the .onnx too, so verification can open it without loading them
            external = plan.decision.mode is MemoryMode.OFFLOAD or model.ByteSize() > emit.EXTERNAL_THRESHOLD
            result.files = emit.write_atomically(model, output, external)
            # The rewrite changed `files.light` in place: put the weight-free float graph back, which
            # also lets the quantized model (and its loaded weights) go before verification.
            del model
            files.light = onnx.load(str(files.path), load_external_data=False)
            release_memory()
            if ir.verify:
                rss.phase = "verify"
                if plan.decision.mode is MemoryMode.OFFLOAD:
                    _verify_offload(ir, assignment, files, output, progress, result)
                else:
                    _verify(ir, assignment, files.path, output, progress, result)
        finally:
            files.close()


def _format(ir: RecipeIR):
    return ir.emit.format if ir.emit else EmitFormat.QDQ


def _activation_specs(ir, assignment, w: Workload, files: ModelFiles, progress, result) -> dict[str, tuple]:
    """tensor → (scale, zero point, qtype, consumer nodes) for the inputs of activation-quantized layers."""
    if not w.observed:
        return {}
    histogram = ir.calibration.method in HISTOGRAM_METHODS
    batches = data.calibration_batches(ir.calibration.data, w.index, w.chunk)
    if result.plan.decision.mode is MemoryMode.OFFLOAD:
        observers = _calibrate_offload(ir, w, files, batches, histogram, progress)
    else:
        passes_ = _passes(result.plan)
        groups = np.array_split(np.array(w.observed, dtype=object), passes_)
        advance = progress("calibrate", len(batches) * passes_)
        observers, checkpoints = {}, []
        for number, group in enumerate(groups):
            checkpoint = _checkpoint(ir, files, number, tuple(group))
            checkpoints.append(checkpoint)
            observers.update(calibrate(files.light, files.base_dir, w.index.graph, tuple(group), batches, histogram,
                                       ir.calibration.bins, advance, ir.calibration.workers, checkpoint))
        for checkpoint in filter(None, checkpoints):  # calibration is complete: nothing to resume
            checkpoint.remove()
    sources = w.source_of
    consumers = _consumers(assignment, files.light)
    specs, ranges = {}, {}
    for a in assignment.layers:
        act = a.scheme.activations
        if a.scheme.is_none or act is None or a.layer.input in specs:
            continue
        observer = observers[sources[a.layer.input]]
        bounds = tensor_range(observer, ir.calibration, act.qtype, act.symmetric)
        if bounds is None:
            result.warnings.append(warning("Q405", f"`{a.layer.input}` was never finite during calibration; "
                                           "left unquantized", a.rule.span if a.rule else None, "no range",
                                           help="check the calibration data; masks built from -inf look like this"))
            continue
        scale, zp = qparams.scale_zero_point(np.array(bounds[0]), np.array(bounds[1]), act.qtype, act.symmetric)
        specs[a.layer.input] = (scale, zp, act.qtype, consumers[a.layer.input])
        ranges[a.layer.input] = (float(bounds[0]), float(bounds[1]))
    result.input_ranges = {a.layer.name: ranges[a.layer.input] for a in assignment.layers
                           if a.scheme.activations is not None and a.layer.input in ranges}
    return specs


def _checkpoint(ir: RecipeIR, files: ModelFiles, number: int, group: tuple[str, ...]):
    if not ir.memory.disk:
        return None
    from compiler.backends.onnx.resume import ResumeState

    return ResumeState.for_run(Path(ir.memory.disk), print_ir(ir), str(files.path), str(number), *group)


def _disk(ir: RecipeIR) -> Path | None:
    return Path(ir.memory.disk) if ir.memory.disk else None


def _calibrate_offload(ir, w: Workload, files: ModelFiles, batches, histogram: bool, progress) -> dict:
    """Block by block: only one block's weights in a session at a time; boundaries cached per chunk."""
    from compiler.backends.onnx.segments import Resume, cut, run_segments
    from compiler.quant.observers import make_observer

    observers = {t: make_observer(histogram, ir.calibration.bins) for t in w.observed}
    checkpoint = _checkpoint(ir, files, -1, tuple(w.observed))
    resume = None
    if checkpoint is not None:
        found = checkpoint.load()
        done = 0
        if found is not None and set(found[1]) == set(observers):
            done, observers = found
        resume = Resume(checkpoint.path.stem, lambda: done,
                        lambda segments: checkpoint.save(segments, observers))
    if not (resume and resume.done()):
        for name in (t for t in w.observed if t in w.index.graph.inputs):
            for feed in batches:
                observers[name].update(feed[name])
    advance = progress("calibrate", len(cut(files.light)) * len(batches))
    run_segments(files.light, files.base_dir, w.index.graph, batches, set(observers),
                 lambda name, value: observers[name].update(value), _disk(ir), advance, resume)
    if checkpoint is not None:
        checkpoint.remove()
    return observers


def _passes(plan: Plan) -> int:
    op = next((o for o in plan.ops if o.kind.value == "calibrate_chunk"), None)
    return int(dict(op.params).get("passes", 1)) if op else 1


def _consumers(assignment: Assignment, model) -> dict[str, set[str]]:
    """For each activation to quantize, the nodes of the activation-quantized layers that read it."""
    by_weight = {}
    for node in model.graph.node:
        for name in node.input:
            by_weight.setdefault(name, []).append(node)
    out: dict[str, set[str]] = {}
    for a in assignment.layers:
        if a.scheme.is_none or a.scheme.activations is None:
            continue
        for node in by_weight.get(a.layer.weight, []):
            if a.layer.input in node.input:
                out.setdefault(a.layer.input, set()).add(node.name)
    return out


def _verify_batches(ir, assignment, result: CompileResult, chunk: int | None = None):
    return held_out_batches(ir, assignment.model, result, chunk or min(ir.calibration.chunk, ir.verify.samples))


def _verify(ir, assignment, source: Path, output: Path, progress, result: CompileResult) -> None:
    batches = _verify_batches(ir, assignment, result)
    reference, candidate = session_from_path(source), session_from_path(output)
    inputs = {i.name for i in reference.get_inputs()}
    first = reference.get_outputs()[0].name
    agreement, advance = Agreement(), progress("verify", len(batches))
    for feed in batches:
        feed = {k: x for k, x in feed.items() if k in inputs}
        agreement.update(reference.run([first], feed)[0], candidate.run([first], feed)[0], feed.get("attention_mask"))
        advance()
    judge(ir, output, agreement, result)


def _verify_offload(ir, assignment, files: ModelFiles, output: Path, progress, result: CompileResult) -> None:
    """Both models block by block: the float model's outputs are cached per chunk, then compared."""
    from compiler.backends.onnx.segments import BoundaryCache, cut, run_segments
    from compiler.models.graph import summarize

    batches = _verify_batches(ir, assignment, result, chunk=1)  # offload: one sample's outputs at a time
    first = files.light.graph.output[0].name
    masks = [feed.get("attention_mask") for feed in batches]
    emitted = open_model(output)
    cache = BoundaryCache(_disk(ir))
    try:
        advance = progress("verify", (len(cut(files.light)) + len(cut(emitted.light))) * len(batches))
        produced = iter(range(len(batches)))
        run_segments(files.light, files.base_dir, assignment.model.graph, batches, {first},
                     lambda _, value: cache.put(first, next(produced), value), _disk(ir), advance)
        agreement, compared = Agreement(), iter(range(len(batches)))

        def compare(_, value):
            i = next(compared)
            agreement.update(cache.get(first, i), value, masks[i])

        summary = summarize(emitted.light, {t.name for t in emitted.light.graph.initializer})
        run_segments(emitted.light, emitted.base_dir, summary, batches, {first}, compare, _disk(ir), advance)
    finally:
        cache.close()
        emitted.close()
    judge(ir, output, agreement, result)
