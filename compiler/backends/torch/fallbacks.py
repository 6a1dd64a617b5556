"""What a run does where data-driven rounding has nothing to work with, and how it says so: an MoE expert
no calibration token reached (rtn, the widest input range of its sibling experts; Q248). GPTQ's Q418 is
shared with the ONNX backend (compiler/backends/gptq_warning.py)."""

from __future__ import annotations

from compiler.backends.torch.layers import Job, Statistics, input_qparams
from compiler.diagnostics import Diagnostic, warning
from compiler.models import names
from compiler.source import Span


def sibling_range(job: Job, stats: Statistics, calibration, dtype) -> tuple[float, int] | None:
    """The widest static input range among the same projection of the other experts of `job`'s block
    (`…experts.3.w1` → `…experts.*.w1`): they read the same hidden states, routed differently."""
    head, _, tail = job.module.rpartition(".experts.")
    leaf = tail.partition(".")[2]
    found = [input_qparams(j, stats, calibration, dtype) for j in stats.jobs
             if j is not job and stats.saw(j) and j.module.startswith(head + ".experts.") and j.module.endswith("." + leaf)]
    found = [f for f in found if f is not None]
    return max(found, key=lambda sz: sz[0]) if found else None


def unseen_warning(span: Span | None, unseen: list[Job]) -> Diagnostic:
    """Q248 for the expert layers no calibration token reached."""
    layers = ", ".join(names.compress([j.layer.name for j in unseen])[:3])
    static = any(j.static_input for j in unseen)
    return warning(
        "Q248", f"no calibration token reached {len(unseen)} expert layers ({layers}): their weights are "
        "rounded with rtn" + (", their inputs use the widest range of their sibling experts" if static else ""),
        span or unseen[0].scheme.span, "no data",
        help="`calibrate { experts all }` (the default) sends every token through every expert for "
        "statistics; or calibrate with more samples")
