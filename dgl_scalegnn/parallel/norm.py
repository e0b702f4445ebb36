"""RMSNorm under 3D PMM: row sums of squares completed over the column group
(:class:`RowStatistics`, which the layer tail's autograd function calls in its forward
and backward), the gain's gradient completed over the row group (:func:`reduce_grad`),
and the norm alone where no layer tail follows it (:func:`rms_norm`, the final norm).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from dgl_scalegnn.core.cost import CollectiveCost, LocalSizes
from dgl_scalegnn.core.layout import Axis, Layout
from dgl_scalegnn.distributed.comm import Runtime, all_reduce
from dgl_scalegnn.distributed.grid import CommGroup
from dgl_scalegnn.parallel.elementwise import LayerTail
from dgl_scalegnn.parallel.partition import ShardSpec
from dgl_scalegnn.profiling import Profiler

__all__ = [
    "RowStatistics",
    "row_statistics",
    "sum_of_squares_cost",
    "reduce_grad",
    "reduce_grad_cost",
    "rms_norm",
    "rms_norm_cost",
]


@dataclass(frozen=True)
class RowStatistics:
    """Per-row sums over a shard's columns completed over the ``group`` of ranks that hold
    the other columns of the same rows: an all-reduce in float32 (also when PMM traffic
    is bfloat16). The layer tail reduces its square sums with it in forward and their
    gradient in backward (a :class:`~dgl_scalegnn.parallel.elementwise.RowReducer`)."""

    group: CommGroup
    profiler: Profiler

    @property
    def local(self) -> bool:
        """No other rank holds columns of these rows (the reduction is the identity)."""
        return self.group.size == 1

    def reduce(self, partial: torch.Tensor) -> torch.Tensor:
        return all_reduce(partial.contiguous(), self.group, self.profiler)


def row_statistics(layout: Layout, runtime: Runtime) -> RowStatistics:
    """The reducer of row statistics for a shard in state ``(a, b, e)``: over ``b``."""
    return RowStatistics(runtime.grid.group(layout.cols), runtime.profiler)


def sum_of_squares_cost(layout: Layout, sizes: LocalSizes) -> list[CollectiveCost]:
    """Collectives of the row sums of squares (:class:`RowStatistics`) on ``layout``
    ``(a, b, e)``: one float32 column of the rows of ``a`` over ``b``, forward and
    backward."""
    column = CollectiveCost(layout.cols, sizes.rows(layout.rows))
    return [column, CollectiveCost(layout.cols, sizes.rows(layout.rows), backward=True)]


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
    return [CollectiveCost(axis, elements, backward=True)]


def rms_norm(
    x: torch.Tensor,
    gain: torch.Tensor,
    spec: ShardSpec,
    eps: float,
    runtime: Runtime,
    tail: LayerTail | None = None,
) -> torch.Tensor:
    """:math:`x_i (\\lVert x_i \\rVert^2 / d + \\epsilon)^{-1/2} \\odot \\gamma` for every
    row of a shard in state ``(a, b, e)``: global row statistics over ``b``, the gain
    ``(cols,)`` (this rank's columns) with its gradient completed over ``a``. ``tail``
    chooses the kernels (default: native where they build, else eager).

    >>> from dgl_scalegnn.core.layout import INPUT_LAYOUT
    >>> from dgl_scalegnn.parallel.partition import RowPartition
    >>> runtime = Runtime.single_process()
    >>> x = torch.tensor([[3.0, 4.0]])
    >>> rows = RowPartition.of(torch.arange(1), 1, runtime.grid.shape)
    >>> spec = ShardSpec(INPUT_LAYOUT, rows, 2)
    >>> rms_norm(x, torch.ones(2), spec, 0.0, runtime)
    tensor([[0.8485, 1.1314]])
    """
    tail = tail if tail is not None else LayerTail(fuse=False, native=True)
    gain = reduce_grad(gain, spec.layout.rows, runtime)
    return tail.normalize(
        x,
        gain,
        row_statistics(spec.layout, runtime),
        width=spec.num_cols,
        eps=eps,
        profiler=runtime.profiler,
    )


def rms_norm_cost(layout: Layout, width: int, sizes: LocalSizes) -> list[CollectiveCost]:
    """Collectives of :func:`rms_norm` and its backward on ``layout`` rows of ``width``."""
    return sum_of_squares_cost(layout, sizes) + reduce_grad_cost(
        layout.rows, sizes.cols(width, layout.cols)
    )
