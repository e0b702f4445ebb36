"""RMSNorm under 3D PMM: row sums of squares over the column group, the gain's gradient
completed over the row group, and the norm itself where no fused tail follows it (one
autograd function run block of rows by block of rows: forward writes its output once,
backward reads the gradient and the input once).
"""

from __future__ import annotations

from typing import Any

import torch

from dgl_scalegnn.core.cost import CollectiveCost, LocalSizes
from dgl_scalegnn.core.layout import Axis, Layout
from dgl_scalegnn.distributed.comm import Runtime, all_reduce
from dgl_scalegnn.parallel.elementwise import rms_scale_backward, row_blocks
from dgl_scalegnn.parallel.partition import ShardSpec
from dgl_scalegnn.profiling import Profiler

__all__ = [
    "sum_of_squares",
    "sum_of_squares_cost",
    "reduce_grad",
    "reduce_grad_cost",
    "rms_norm",
    "rms_norm_cost",
]


class _SumOfSquaresFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, runtime: Runtime, layout: Layout):
        ctx.save_for_backward(x)
        ctx.runtime, ctx.layout = runtime, layout
        with runtime.profiler.region("elementwise"):
            # block by block: the squares stay in cache instead of a whole-matrix temporary
            square_sum = x.new_empty(x.shape[0], 1)
            for rows in row_blocks(x):
                block = x[rows]
                torch.sum(block * block, dim=1, keepdim=True, out=square_sum[rows])
        # Statistics stay float32 even when PMM traffic is bfloat16.
        return all_reduce(square_sum, runtime.grid.group(layout.cols), runtime.profiler)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        (x,) = ctx.saved_tensors
        runtime = ctx.runtime
        # Every rank of the group used the sum with its own columns: add their gradients.
        grad = all_reduce(grad.contiguous(), runtime.grid.group(ctx.layout.cols), runtime.profiler)
        with runtime.profiler.region("elementwise"):
            return x * (2.0 * grad), None, None  # one pass over x


def sum_of_squares(x: torch.Tensor, spec: ShardSpec, runtime: Runtime) -> torch.Tensor:
    """Row sums of squares over the global columns; forward and backward: all-reduce over ``b``.

    ``x`` in state ``(a, b, e)``; returns ``(rows, 1)`` float32, the same on every rank
    of the ``b``-group.
    """
    return _SumOfSquaresFn.apply(x, runtime, spec.layout)


def sum_of_squares_cost(layout: Layout, sizes: LocalSizes) -> list[CollectiveCost]:
    """Collectives of :func:`sum_of_squares` on ``layout`` ``(a, b, e)``: one float32
    column of the rows of ``a`` over ``b``, forward and backward."""
    column = CollectiveCost(layout.cols, sizes.rows(layout.rows))
    return [column, column]


class _ReduceGradFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, runtime: Runtime, axis: Axis):
        ctx.runtime, ctx.axis = runtime, axis
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        runtime = ctx.runtime
        return (
            all_reduce(grad.contiguous(), runtime.grid.group(ctx.axis), runtime.profiler),
            None,
            None,
        )


def reduce_grad(tensor: torch.Tensor, axis: Axis, runtime: Runtime) -> torch.Tensor:
    """Forward: identity; backward: all-reduce over the group along ``axis``.

    For a parameter replicated along ``axis`` whose uses there see different rows (the
    RMSNorm gain): each rank's gradient is a partial sum over its rows.
    """
    return _ReduceGradFn.apply(tensor, runtime, axis)


def reduce_grad_cost(axis: Axis, elements: float) -> list[CollectiveCost]:
    """Collective of :func:`reduce_grad` for a tensor of ``elements``: one float32
    all-reduce over ``axis`` in backward."""
    return [CollectiveCost(axis, elements)]


class _ScaleRowsFn(torch.autograd.Function):
    """:math:`y = x \\, r \\odot \\gamma` with :math:`r = (s / d + \\epsilon)^{-1/2}` from the
    row sums of squares :math:`s`; backward gives the gradients of :math:`x` (through
    :math:`y` only), :math:`s` and :math:`\\gamma` (this rank's rows)."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        square_sum: torch.Tensor,
        gain: torch.Tensor,
        width: int,
        eps: float,
        profiler: Profiler,
    ):
        with profiler.region("elementwise"):
            inv_rms = torch.rsqrt(square_sum / width + eps).to(x.dtype)
            y = torch.empty_like(x)
            for rows in row_blocks(x):
                torch.mul(x[rows], inv_rms[rows], out=y[rows]).mul_(gain)
        ctx.save_for_backward(x, inv_rms, gain)
        ctx.width, ctx.profiler, ctx.statistics_dtype = width, profiler, square_sum.dtype
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        x, inv_rms, gain = ctx.saved_tensors
        grad = grad.contiguous()
        with ctx.profiler.region("elementwise"):
            grad_x = torch.empty_like(grad)
            grad_square_sum = torch.empty_like(inv_rms, dtype=ctx.statistics_dtype)
            grad_gain = torch.zeros_like(gain)
            for rows in row_blocks(grad):
                _, grad_square_sum[rows], grad_gain_rows = rms_scale_backward(
                    grad[rows], x[rows], inv_rms[rows], gain, ctx.width, out=grad_x[rows]
                )
                grad_gain += grad_gain_rows
        return grad_x, grad_square_sum, grad_gain, None, None, None


def rms_norm(
    x: torch.Tensor, gain: torch.Tensor, spec: ShardSpec, eps: float, runtime: Runtime
) -> torch.Tensor:
    """:math:`x_i (\\lVert x_i \\rVert^2 / d + \\epsilon)^{-1/2} \\odot \\gamma` for every
    row of a shard in state ``(a, b, e)``: global row statistics over ``b``, the gain
    ``(cols,)`` (this rank's columns) with its gradient completed over ``a``.

    >>> from dgl_scalegnn.core.layout import INPUT_LAYOUT
    >>> from dgl_scalegnn.parallel.partition import RowPartition
    >>> runtime = Runtime.single_process()
    >>> x = torch.tensor([[3.0, 4.0]])
    >>> rows = RowPartition.of(torch.arange(1), 1, runtime.grid.shape)
    >>> spec = ShardSpec(INPUT_LAYOUT, rows, 2)
    >>> rms_norm(x, torch.ones(2), spec, 0.0, runtime)
    tensor([[0.8485, 1.1314]])
    """
    square_sum = sum_of_squares(x, spec, runtime)
    gain = reduce_grad(gain, spec.layout.rows, runtime)
    return _ScaleRowsFn.apply(x, square_sum, gain, spec.num_cols, eps, runtime.profiler)


def rms_norm_cost(layout: Layout, width: int, sizes: LocalSizes) -> list[CollectiveCost]:
    """Collectives of :func:`rms_norm` and its backward on ``layout`` rows of ``width``."""
    return sum_of_squares_cost(layout, sizes) + reduce_grad_cost(
        layout.rows, sizes.cols(width, layout.cols)
    )
