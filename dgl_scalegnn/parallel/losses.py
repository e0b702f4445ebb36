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
from dgl_scalegnn.distributed.grid import CommGroup
from dgl_scalegnn.parallel.partition import ShardSpec
from dgl_scalegnn.profiling import Profiler

__all__ = [
    "parallel_cross_entropy",
    "cross_entropy_cost",
    "parallel_bce",
    "bce_cost",
    "parallel_argmax",
]


def _shifted(
    logits: torch.Tensor,
    labels: torch.Tensor,
    class_start: int,
    class_group: CommGroup,
    profiler: Profiler,
) -> tuple[torch.Tensor, ...]:
    """What both cross-entropies start from, for float32 ``logits`` holding the classes
    from ``class_start`` on: ``shifted`` (the logits less their row's maximum over
    ``class_group``), its ``exp``, whether this rank holds each row's label (``owned``,
    ``(rows, 1)``), its local ``column`` and the label's shifted logit (``target``, 0
    where another rank holds it). Gathers and selects, no boolean indexing: no host
    synchronisation."""
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
        local_class = labels - class_start
        owned = ((local_class >= 0) & (local_class < logits.shape[1])).unsqueeze(1)
        column = local_class.clamp(0, max(logits.shape[1] - 1, 0)).unsqueeze(1)
        target = (
            torch.where(owned, shifted.gather(1, column), 0.0)
            if logits.shape[1]
            else torch.zeros_like(row_max)
        )
    return shifted, exp, owned, column, target


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
        _, exp, owned, column, target = _shifted(logits, labels, class_start, class_group, profiler)
        with profiler.region("elementwise"):
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


class _WeightedCrossEntropyFn(torch.autograd.Function):
    """Cross-entropy with class weights and label smoothing, PyTorch's
    ``cross_entropy(weight=w, label_smoothing=eps)``: row :math:`i` of label :math:`y`
    costs :math:`(1 - \\epsilon) w_y (\\log S - z_y) + \\frac{\\epsilon}{C}
    \\sum_c w_c (\\log S - z_c)`, the sum over rows divided by :math:`\\sum_i w_{y_i}`."""

    @staticmethod
    def forward(
        ctx: Any,
        logits: torch.Tensor,
        labels: torch.Tensor,
        mask: torch.Tensor,
        weights: torch.Tensor,
        smoothing: float,
        runtime: Runtime,
        layout: Layout,
        class_start: int,
    ):
        profiler, grid = runtime.profiler, runtime.grid
        class_group, row_group = grid.group(layout.cols), grid.group(layout.rows)
        logits = logits.float()
        local_weights = weights[class_start : class_start + logits.shape[1]].float()
        shifted, exp, owned, column, target = _shifted(
            logits, labels, class_start, class_group, profiler
        )
        with profiler.region("elementwise"):
            weighted = (shifted * local_weights).sum(dim=1, keepdim=True)
            stats = torch.cat((exp.sum(dim=1, keepdim=True), target, weighted), dim=1)
        stats = all_reduce(stats, class_group, profiler)
        with profiler.region("elementwise"):
            num_classes, total_weight = weights.numel(), weights.float().sum()
            row_weight = weights.float()[labels.clamp(min=0)]
            log_sum = stats[:, 0].log()
            row_loss = (1 - smoothing) * row_weight * (log_sum - stats[:, 1]) + (
                smoothing / num_classes
            ) * (total_weight * log_sum - stats[:, 2])
            totals = torch.stack(
                (
                    torch.where(mask, row_loss, 0.0).sum(),
                    torch.where(mask, row_weight, 0.0).sum(),
                )
            )
        totals = all_reduce(totals, row_group, profiler)
        count = torch.where(totals[1] > 0, totals[1], 1.0)
        ctx.save_for_backward(exp, stats[:, :1], owned, column, mask, row_weight, local_weights)
        ctx.count, ctx.smoothing = count, smoothing
        ctx.num_classes, ctx.total_weight = num_classes, total_weight
        return totals[0] / count

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        exp, sum_exp, owned, column, mask, row_weight, local_weights = ctx.saved_tensors
        smoothing, share = ctx.smoothing, ctx.smoothing / ctx.num_classes
        scale = (1 - smoothing) * row_weight + share * ctx.total_weight
        grad_logits = exp / sum_exp * scale.unsqueeze(1) - share * local_weights
        if grad_logits.shape[1]:
            target = owned.to(grad_logits.dtype) * ((1 - smoothing) * row_weight).unsqueeze(1)
            grad_logits.scatter_add_(1, column, -target)
        grad_logits *= mask.unsqueeze(1).to(grad_logits.dtype) * (grad / ctx.count)
        return grad_logits, None, None, None, None, None, None, None


def parallel_cross_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    mask: torch.Tensor,
    spec: ShardSpec,
    runtime: Runtime,
    class_weights: torch.Tensor | None = None,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """Mean cross-entropy over the labelled rows, with classes split along an axis.

    ``logits`` in state ``(a, b, e)`` (classes split along ``b``): the row maximum and
    the sum of exponentials are all-reduced over ``b`` in float32, the loss summed over
    local labelled rows and all-reduced over ``a``, then divided by the global count of
    labelled rows. ``labels`` ``(rows,)`` global class ids, ``mask`` ``(rows,)`` bool.
    A batch without labelled rows gives loss 0 and zero gradients. ``class_weights``
    ``(C,)`` (every class, on every rank) and ``label_smoothing`` follow
    :func:`torch.nn.functional.cross_entropy`: the weighted mean divides by the labelled
    rows' weights.
    """
    class_start, _ = spec.col_range(runtime.grid.shape, runtime.grid.coords)
    if class_weights is None and not label_smoothing:
        return _CrossEntropyFn.apply(logits, labels, mask, runtime, spec.layout, class_start)
    if class_weights is None:
        class_weights = logits.new_ones(spec.num_cols)
    if class_weights.shape != (spec.num_cols,):
        raise ValueError(
            f"class_weights: shape {tuple(class_weights.shape)}, expected ({spec.num_cols},): "
            "one weight for each class"
        )
    return _WeightedCrossEntropyFn.apply(
        logits,
        labels,
        mask,
        class_weights,
        float(label_smoothing),
        runtime,
        spec.layout,
        class_start,
    )


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
        weight: torch.Tensor | None,
    ):
        profiler, grid = runtime.profiler, runtime.grid
        logits = logits.float()
        with profiler.region("elementwise"):
            per_entry = torch.nn.functional.binary_cross_entropy_with_logits(
                logits, targets, weight=weight, reduction="none"
            )
            # a masked sum, no boolean indexing: no host synchronisation
            local = torch.where(mask.unsqueeze(1), per_entry, 0.0).sum()
        local = all_reduce(local.reshape(1), grid.group(layout.cols), profiler)
        totals = torch.cat((local, mask.sum().to(local.dtype).reshape(1)))
        totals = all_reduce(totals, grid.group(layout.rows), profiler)
        denominator = totals[1].clamp(min=1.0) * num_classes
        ctx.save_for_backward(logits, targets, mask)
        ctx.denominator, ctx.weight = denominator, weight
        return totals[0] / denominator

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        logits, targets, mask = ctx.saved_tensors
        grad_logits = (torch.sigmoid(logits) - targets) * mask.unsqueeze(1).to(logits.dtype)
        if ctx.weight is not None:
            grad_logits = grad_logits * ctx.weight
        return grad_logits * (grad / ctx.denominator), None, None, None, None, None, None


def parallel_bce(
    logits: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor,
    spec: ShardSpec,
    runtime: Runtime,
    class_weights: torch.Tensor | None = None,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """Mean binary cross-entropy over labelled rows and all classes (multi-label).

    ``targets`` ``(rows, classes of part b)`` 0/1 float, ``mask`` ``(rows,)`` bool.
    ``class_weights`` ``(C,)`` scales each class's terms (``weight`` of
    :func:`torch.nn.functional.binary_cross_entropy_with_logits`); ``label_smoothing``
    :math:`\\epsilon` makes the targets :math:`t (1 - \\epsilon) + \\epsilon / 2`.
    """
    targets = targets.to(logits.dtype)
    if label_smoothing:
        targets = targets * (1 - label_smoothing) + label_smoothing / 2
    weight = None
    if class_weights is not None:
        class_start, class_stop = spec.col_range(runtime.grid.shape, runtime.grid.coords)
        weight = class_weights[class_start:class_stop].float()
    return _BCEFn.apply(logits, targets, mask, runtime, spec.layout, spec.num_cols, weight)


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
