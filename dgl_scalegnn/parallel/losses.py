"""Losses and predictions of a logits shard whose classes are split over a grid axis:
parallel cross-entropy, BCE and argmax.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from dgl_scalegnn.core.cost import CollectiveCost, LocalSizes
from dgl_scalegnn.core.layout import Layout
from dgl_scalegnn.distributed.comm import Runtime, all_reduce
from dgl_scalegnn.parallel.partition import ShardSpec

__all__ = [
    "parallel_cross_entropy",
    "cross_entropy_cost",
    "parallel_bce",
    "bce_cost",
    "parallel_argmax",
]


class _CrossEntropyFn(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        logits: torch.Tensor,
        labels: torch.Tensor,
        mask: torch.Tensor,
        runtime: Runtime,
        layout: Layout,
        class_start: int,
    ):
        profiler, grid = runtime.profiler, runtime.grid
        class_group, row_group = grid.group(layout.cols), grid.group(layout.rows)
        logits = logits.float()
        with profiler.region("elementwise"):
            row_max = (
                logits.max(dim=1, keepdim=True).values
                if logits.shape[1]
                else logits.new_full((logits.shape[0], 1), -torch.inf)
            )
        row_max = all_reduce(row_max, class_group, profiler, op=dist.ReduceOp.MAX)
        with profiler.region("elementwise"):
            shifted = logits - row_max
            exp = shifted.exp()
            # Gathers and selects, no boolean indexing: no host synchronisation.
            local_class = labels - class_start
            owned = ((local_class >= 0) & (local_class < logits.shape[1])).unsqueeze(1)
            column = local_class.clamp(0, max(logits.shape[1] - 1, 0)).unsqueeze(1)
            target = (
                torch.where(owned, shifted.gather(1, column), 0.0)
                if logits.shape[1]
                else torch.zeros_like(row_max)
            )
            stats = torch.cat((exp.sum(dim=1, keepdim=True), target), dim=1)
        stats = all_reduce(stats, class_group, profiler)
        with profiler.region("elementwise"):
            row_loss = stats[:, 0].log() - stats[:, 1]
            totals = torch.stack(
                (torch.where(mask, row_loss, 0.0).sum(), mask.sum().to(row_loss.dtype))
            )
        totals = all_reduce(totals, row_group, profiler)
        count = totals[1].clamp(min=1.0)
        ctx.save_for_backward(exp, stats[:, :1], owned, column, mask)
        ctx.count = count
        return totals[0] / count

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        exp, sum_exp, owned, column, mask = ctx.saved_tensors
        grad_logits = exp / sum_exp
        if grad_logits.shape[1]:
            grad_logits.scatter_add_(1, column, -owned.to(grad_logits.dtype))
        grad_logits *= mask.unsqueeze(1).to(grad_logits.dtype) * (grad / ctx.count)
        return grad_logits, None, None, None, None, None


def parallel_cross_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    mask: torch.Tensor,
    spec: ShardSpec,
    runtime: Runtime,
) -> torch.Tensor:
    """Mean cross-entropy over the labelled rows, with classes split along an axis.

    ``logits`` in state ``(a, b, e)`` (classes split along ``b``): the row maximum and
    the sum of exponentials are all-reduced over ``b`` in float32, the loss summed over
    local labelled rows and all-reduced over ``a``, then divided by the global count of
    labelled rows. ``labels`` ``(rows,)`` global class ids, ``mask`` ``(rows,)`` bool.
    A batch without labelled rows gives loss 0 and zero gradients.
    """
    class_start, _ = spec.col_range(runtime.grid.shape, runtime.grid.coords)
    return _CrossEntropyFn.apply(logits, labels, mask, runtime, spec.layout, class_start)


def cross_entropy_cost(layout: Layout, sizes: LocalSizes) -> list[CollectiveCost]:
    """Collectives of :func:`parallel_cross_entropy` on logits in ``layout`` ``(a, b, e)``
    (float32, forward only): row maxima and (sum of exponentials, target logit) over
    ``b``, then (loss sum, labelled count) over ``a``."""
    rows = sizes.rows(layout.rows)
    return [
        CollectiveCost(layout.cols, rows),
        CollectiveCost(layout.cols, 2 * rows),
        CollectiveCost(layout.rows, 2),
    ]


class _BCEFn(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        logits: torch.Tensor,
        targets: torch.Tensor,
        mask: torch.Tensor,
        runtime: Runtime,
        layout: Layout,
        num_classes: int,
    ):
        profiler, grid = runtime.profiler, runtime.grid
        logits = logits.float()
        with profiler.region("elementwise"):
            per_entry = torch.nn.functional.binary_cross_entropy_with_logits(
                logits, targets, reduction="none"
            )
            # a masked sum, no boolean indexing: no host synchronisation
            local = torch.where(mask.unsqueeze(1), per_entry, 0.0).sum()
        local = all_reduce(local.reshape(1), grid.group(layout.cols), profiler)
        totals = torch.cat((local, mask.sum().to(local.dtype).reshape(1)))
        totals = all_reduce(totals, grid.group(layout.rows), profiler)
        denominator = totals[1].clamp(min=1.0) * num_classes
        ctx.save_for_backward(logits, targets, mask)
        ctx.denominator = denominator
        return totals[0] / denominator

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        logits, targets, mask = ctx.saved_tensors
        grad_logits = (torch.sigmoid(logits) - targets) * mask.unsqueeze(1).to(logits.dtype)
        return grad_logits * (grad / ctx.denominator), None, None, None, None, None


def parallel_bce(
    logits: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor,
    spec: ShardSpec,
    runtime: Runtime,
) -> torch.Tensor:
    """Mean binary cross-entropy over labelled rows and all classes (multi-label).

    ``targets`` ``(rows, classes of part b)`` 0/1 float, ``mask`` ``(rows,)`` bool.
    """
    return _BCEFn.apply(logits, targets.to(logits.dtype), mask, runtime, spec.layout, spec.num_cols)


def bce_cost(layout: Layout) -> list[CollectiveCost]:
    """Collectives of :func:`parallel_bce` on logits in ``layout`` ``(a, b, e)`` (float32,
    forward only): the local loss sum over ``b``, then (loss sum, labelled count) over ``a``."""
    return [CollectiveCost(layout.cols, 1), CollectiveCost(layout.rows, 2)]


@torch.no_grad()
def parallel_argmax(logits: torch.Tensor, spec: ShardSpec, runtime: Runtime) -> torch.Tensor:
    """Global class index of each local row's largest logit (ties: smallest index)."""
    grid, profiler = runtime.grid, runtime.profiler
    group = grid.group(spec.layout.cols)
    class_start, _ = spec.col_range(grid.shape, grid.coords)
    logits = logits.float()
    if group.size == 1:  # every class here (class_start 0): no other rank to compare with
        return logits.max(dim=1)[1]
    if logits.shape[1]:
        local_max, local_arg = logits.max(dim=1)
    else:
        local_max = logits.new_full((logits.shape[0],), -torch.inf)
        local_arg = torch.zeros(logits.shape[0], dtype=torch.int64, device=logits.device)
    global_max = all_reduce(local_max.clone(), group, profiler, op=dist.ReduceOp.MAX)
    sentinel = torch.iinfo(torch.int64).max
    candidate = torch.where(local_max == global_max, local_arg + class_start, sentinel)
    return all_reduce(candidate, group, profiler, op=dist.ReduceOp.MIN)
