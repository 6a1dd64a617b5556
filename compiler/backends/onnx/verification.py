"""The float and the emitted ONNX model on the same held-out samples, compared at the model's output: whole,
or (offload) segment by segment with the float outputs cached per sample."""

from __future__ import annotations

from pathlib import Path

from compiler.backends.agreement import Agreement
from compiler.backends.onnx.calibrate import session_from_path
from compiler.backends.onnx.files import ModelFiles, open_model
from compiler.backends.release import SESSION_MMAP_THRESHOLD, keep_large_blocks_mapped, trim_heap


def verify_whole(source: Path, output: Path, batches, progress) -> Agreement:
    """Both models whole in onnxruntime sessions, chunk by chunk, at their first output. Sessions without an
    arena allocate each activation from the heap; with glibc's mmap threshold left to rise, the freed ones stay
    in the heap (an HF-exported Qwen2's float run peaked 278 MiB above its session, 198 with the threshold
    fixed: the liveness walk the plan counts), so it is fixed for the runs (about 15% more time a run)."""
    keep_large_blocks_mapped(SESSION_MMAP_THRESHOLD)
    reference, candidate = (session_from_path(path, arena=False, as_served=True) for path in (source, output))
    inputs = {i.name for i in reference.get_inputs()}
    first = reference.get_outputs()[0].name
    agreement, advance = Agreement(), progress("verify", len(batches))
    for feed in batches:
        feed = {k: x for k, x in feed.items() if k in inputs}
        expected = reference.run([first], feed)[0]
        trim_heap()  # the float run's activations go back to the system before the quantized model runs (the plan)
        agreement.update(expected, candidate.run([first], feed)[0], feed.get("attention_mask"), feed.get("input_ids"))
        advance()
    return agreement


def verify_offload(assignment, files: ModelFiles, output: Path, batches, disk: Path | None, progress) -> Agreement:
    """Both models block by block: the float model's outputs are cached per chunk, then compared."""
    from compiler.backends.onnx.segments import BoundaryCache, cut, run_segments
    from compiler.models.graph import summarize

    first = files.light.graph.output[0].name
    masks = [feed.get("attention_mask") for feed in batches]
    ids = [feed.get("input_ids") for feed in batches]
    emitted = open_model(output)
    cache = BoundaryCache(disk)
    try:
        advance = progress("verify", (len(cut(files.light)) + len(cut(emitted.light))) * len(batches))
        produced = iter(range(len(batches)))
        run_segments(files.light, files.base_dir, assignment.model.graph, batches, {first},
                     lambda _, value: cache.put(first, next(produced), value), disk, advance)
        agreement, compared = Agreement(), iter(range(len(batches)))

        def compare(_, value):
            i = next(compared)
            agreement.update(cache.get(first, i), value, masks[i], ids[i])

        summary = summarize(emitted.light, {t.name for t in emitted.light.graph.initializer})
        run_segments(emitted.light, emitted.base_dir, summary, batches, {first}, compare, disk, advance)
    finally:
        cache.close()
        emitted.close()
    return agreement
