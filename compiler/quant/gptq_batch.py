"""GPTQ of several same-shape weights at once (an MoE block's experts; docs/memory.md, the batch's scratch):
gptq.py's arithmetic over a batch, with the integers gptq() gives each weight alone."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from compiler.ir.types import Rounding, WeightQuant, gptq_scales_fixed
from compiler.quant.gptq import (
    BLOCK,
    DAMPENING,
    MAX_DAMPENING,
    SingularHessian,
    _Factor,
    _Params,
    _requantize,
    _ScaleRule,
    _ScaleTable,
    _sub_block,
    _upper_inverse_factors,
)
from compiler.quant.weights import Convention, QuantizedWeight, round_weight


def gptq_batched(ws: list[np.ndarray], hessians: list, spec: WeightQuant, act_order: bool = False,
                 convention: Convention = Convention.ORT, scale_dtype=np.float32,
                 dampened: Callable[[int, float], object] | None = None, static_groups: bool = False,
                 mse_scales: bool = False) -> list[QuantizedWeight | SingularHessian]:
    """gptq() of several weights of one shape at once (an MoE block's experts), on the CPU: their Hessians
    factorised as one batch and their columns rounded in one loop over [layers, out] columns, so the loop's
    per-column work (a few small tensor operations, each costing more to dispatch than to compute on one
    expert's column) is paid once for the batch. Each weight's scales, dampening and act-order are its own and
    the arithmetic is gptq()'s: the same integers. Needs scales fixed before the loop (`batches_scales`).
    Each result is the weight's QuantizedWeight, or the SingularHessian gptq() would raise for it; `dampened`
    is told (index, fraction) where a Hessian needed more than DAMPENING. `hessians` is emptied as they are
    stacked (the list's references dropped one by one: the caller's should be its only ones).

    Weights given the same Hessian object (layers reading one input: with `experts all` every expert's gate and
    up projection of a block read the same tokens) share its factorisation, which is the same matrix for each:
    the block's 2·E gate/up Hessians are factorised once, not 2·E times."""
    import torch

    assert batches_scales(spec, act_order, static_groups), "group scales taken in the loop round one at a time"
    ws = [np.array(w, np.float32) for w in ws]  # copies: dead columns are zeroed in place
    width = ws[0].shape[1]
    slot = _shared_slots(hessians)
    stacked = torch.empty((max(slot) + 1, width, width))  # each distinct Hessian copied in, then dropped
    distinct_factors: list[_Factor] = []
    for n, w in enumerate(ws):
        if slot[n] < len(distinct_factors):  # an earlier weight's Hessian: its factor, dead columns zeroed here too
            w[:, distinct_factors[slot[n]].diagonal == 0] = 0.0
        else:
            factor = _Factor.of(w, hessians[n], act_order, "cpu")
            stacked[slot[n]] = factor.h
            factor.h = None
            distinct_factors.append(factor)
        hessians[n] = None
    factors = [distinct_factors[s] for s in slot]
    params = [_Params(reference, spec) for reference in _batch_scales(ws, factors, spec, convention, scale_dtype,
                                                                     mse_scales)]
    owner = [stacked]
    del stacked
    distinct, distinct_used = _upper_inverse_factors(owner)
    used = [distinct_used[s] for s in slot]
    hinv = distinct if slot == list(range(len(ws))) else distinct[torch.tensor(slot)]
    del distinct
    fine = [i for i, u in enumerate(used) if math.isfinite(u)]
    if dampened is not None:
        for i in fine:
            if used[i] != DAMPENING:
                dampened(i, used[i])
    results: list[QuantizedWeight | SingularHessian] = [
        SingularHessian(f"the Hessian stays indefinite at dampening {MAX_DAMPENING:g}")] * len(ws)
    if not fine:
        return results
    tables = [_ScaleTable.of(params[i], "cpu") for i in fine]
    table = _ScaleTable(torch.stack([t.scale for t in tables]), torch.stack([t.zero_point for t in tables]),
                        tables[0].group_size, tables[0].lo, tables[0].hi)
    orders = None if not act_order else np.stack([np.asarray(factors[i].order) for i in fine])
    columns = np.stack([ws[i] if orders is None else ws[i][:, orders[n]] for n, i in enumerate(fine)])
    q = _columns_batched(torch.from_numpy(columns), hinv[fine], table, orders)
    del columns
    for n, i in enumerate(fine):
        values = q[n]
        if orders is not None:
            restored = np.empty_like(values)
            restored[:, orders[n]] = values
            values = restored
        results[i] = _requantize(values, params[i])
    return results


def _shared_slots(hessians: list) -> list[int]:
    """Each weight's index among the distinct Hessians (by identity), numbered in order of first use."""
    first: dict[int, int] = {}
    return [first.setdefault(id(h), len(first)) for h in hessians]


def _batch_scales(ws: list[np.ndarray], factors: list[_Factor], spec: WeightQuant, convention: Convention,
                  scale_dtype, mse_scales: bool) -> list[QuantizedWeight]:
    """Each weight's scales from its float values, as _ScaleRule takes them for one layer. The searched ones
    (`mse_scales`) in one search of the weights stacked, each row weighted by its own layer's diag H: the
    search's passes over the values are a batch's, not one per layer (every block's scale is its own either way)."""
    if not mse_scales:
        return [_ScaleRule(convention, scale_dtype, None).quantize(w, spec) for w in ws]
    rows = ws[0].shape[0]
    importance = np.repeat(np.stack([f.diagonal for f in factors]).astype(np.float32), rows, axis=0)
    whole = round_weight(np.concatenate(ws), spec, Rounding.MSE, 0, 1, convention, scale_dtype,
                         importance=importance)
    return [QuantizedWeight(whole.q[n * rows:(n + 1) * rows], whole.scale[n * rows:(n + 1) * rows],
                            whole.zero_point[n * rows:(n + 1) * rows], whole.qtype, whole.axis, whole.block_size)
            for n in range(len(ws))]


def batches_scales(spec: WeightQuant, act_order: bool, static_groups: bool) -> bool:
    """Whether gptq_batched() rounds this scheme: every scale fixed before the loop (per channel, or groups with
    act-order or static groups), where gptq() recomputes a group's scale from the columns as the loop leaves them."""
    return gptq_scales_fixed(spec, act_order, static_groups)


def _columns_batched(w, hinv, table: _ScaleTable, orders: np.ndarray | None) -> np.ndarray:
    """_columns() of a batch [n, out, K] with its factors [n, K, K] and table (scales [n, out, groups]): each
    weight's columns in its own order (`orders` [n, K], act-order) rounded onto its own grid. The loop does
    what each column needs and no more (a column's operations dominate: each costs more to dispatch than to
    compute): no zero-point steps where every zero point is 0, and the rounded values taken once a block from
    the block's columns, which no update changes once they are rounded."""
    import torch

    q = torch.empty_like(w)
    step = _sub_block(table.group_size or 0)
    centred = not bool(table.zero_point.any())  # symmetric grids: adding and taking 0 changes no value
    for start in range(0, w.shape[2], BLOCK):
        end = min(start + BLOCK, w.shape[2])
        block = w[:, :, start:end].clone()
        local = hinv[:, start:end, start:end]
        diagonal = torch.diagonal(local, dim1=1, dim2=2)
        errors = torch.empty_like(block)
        scales, zeros = _block_grid(table, orders, start, end)
        for first in range(0, end - start, step):
            stop = min(first + step, end - start)
            for j in range(first, stop):
                column, s, z, err = block[:, :, j], scales[:, :, j], zeros[:, :, j], errors[:, :, j]
                quantized = _on_grid(column, s, z, table, centred)
                torch.sub(column, quantized, out=err)
                err /= diagonal[:, j:j + 1]
                block[:, :, j + 1:stop] -= err[:, :, None] * local[:, j:j + 1, j + 1:stop]
            block[:, :, stop:] -= torch.bmm(errors[:, :, first:stop], local[:, first:stop, stop:])
        q[:, :, start:end] = _on_grid(block, scales, zeros, table, centred)
        w[:, :, end:] -= torch.bmm(errors, hinv[:, start:end, end:])
    return q.numpy()


def _on_grid(values, scale, zero, table: _ScaleTable, centred: bool):
    """`values` rounded onto the grid (scale, zero point) as _ScaleTable.rounded rounds them: a new tensor."""
    if centred:
        return (values / scale).round_().clamp_(table.lo, table.hi).mul_(scale)
    return (values / scale).round_().add_(zero).clamp_(table.lo, table.hi).sub_(zero).mul_(scale)


def _block_grid(table: _ScaleTable, orders: np.ndarray | None, start: int, end: int) -> tuple:
    """The scales and zero points of columns start..end of a batch ([n, out, end - start] each), each weight's
    columns in its own order: looked up once a block, not once a column."""
    import torch

    size = table.group_size or 0
    columns = np.arange(start, end) if orders is None else orders[:, start:end]
    groups = torch.from_numpy(np.broadcast_to(columns // size if size else columns * 0,
                                              (table.scale.shape[0], end - start)).copy())
    index = groups[:, None, :].expand(-1, table.scale.shape[1], -1)
    return table.scale.gather(2, index), table.zero_point.gather(2, index)
