"""Plan verifier (used by tests after lowering): buffers defined before use, every quantized layer gets
qparams before emit, and the estimated peak stays within the budget."""

from __future__ import annotations

from compiler.plan.lower import INITIAL_BUFFERS
from compiler.plan.ops import Buffer, OpKind, Plan


def verify_plan(plan: Plan, quantized_layers: tuple[str, ...]) -> list[str]:
    """Problems found, as sentences; an empty list means the plan is well formed."""
    problems = []
    defined = set(INITIAL_BUFFERS)
    covered: set[str] = set()
    for index, op in enumerate(plan.ops, start=1):
        for buffer in op.inputs:
            if buffer not in defined:
                problems.append(f"op {index} ({op.kind.value}) reads `{buffer.value}` before any op produces it")
        if op.kind is OpKind.EMIT:
            missing = [n for n in quantized_layers if n not in covered]
            if missing:
                problems.append(f"emit before qparams of {len(missing)} layers, e.g. {missing[0]}")
        if Buffer.QPARAMS in op.outputs:
            covered.update(op.layers)
        defined.update(op.outputs)
        if op.peak_bytes > plan.decision.ram_budget:
            problems.append(f"op {index} ({op.kind.value}) peaks at {op.peak_bytes} B over the budget "
                            f"{plan.decision.ram_budget} B")
    if not any(op.kind is OpKind.EMIT for op in plan.ops):
        problems.append("the plan never emits a model")
    return problems
