"""Sparse and dense products of 3D PMM: ``X W`` and ``A F``, forward and backward
side by side.
"""

from __future__ import annotations

from typing import Any

import torch

from dgl_scalegnn.core.cost import CollectiveCost, LocalSizes
from dgl_scalegnn.core.layout import Layout
from dgl_scalegnn.distributed.comm import Runtime, all_reduce, start_all_reduce
from dgl_scalegnn.parallel.partition import ShardSpec
from dgl_scalegnn.parallel.spmm import LocalSpMM

__all__ = ["parallel_linear", "linear_cost", "parallel_spmm", "spmm_cost"]


class _LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, runtime: Runtime, layout: Layout):
        ctx.save_for_backward(x, weight)
        ctx.runtime, ctx.layout = runtime, layout
        with runtime.profiler.region("gemm"):
            y = x @ weight
        grid = runtime.grid
        return all_reduce(
            y, grid.group(layout.cols), runtime.profiler, low_precision=runtime.options.bf16
        )

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        runtime, layout = ctx.runtime, ctx.layout
        grid, profiler, options = runtime.grid, runtime.profiler, runtime.options
        grad = grad.contiguous()
        pending_x = None
        if ctx.needs_input_grad[0]:  # input features need no gradient: skip dX entirely
            with profiler.region("gemm"):
                grad_x = grad @ weight.t()
            # dX (over rep) and dW (over rows) reduce on orthogonal groups: with overlap
            # on, dX is in flight while dW is computed, and both are in flight together.
            pending_x = start_all_reduce(
                grad_x,
                grid.group(layout.rep),
                profiler,
                low_precision=options.bf16,
                async_op=options.overlap,
            )
            if not options.overlap:
                pending_x.wait()
        with profiler.region("gemm"):
            grad_w = x.t() @ grad
        pending_w = start_all_reduce(
            grad_w, grid.group(layout.rows), profiler, async_op=options.overlap
        )
        grad_x = pending_x.wait() if pending_x is not None else None
        return grad_x, pending_w.wait(), None, None


def parallel_linear(
    x: torch.Tensor, weight: torch.Tensor, spec: ShardSpec, out_width: int, runtime: Runtime
) -> tuple[torch.Tensor, ShardSpec]:
    """:math:`Y = X W` with ``X`` in state ``(a, b, e)``; forward: all-reduce over ``b``.

    Parameters
    ----------
    x : torch.Tensor
        Local shard ``(rows of part a, cols of part b)`` of ``X`` (global ``(B, D_in)``).
    weight : torch.Tensor
        Local shard ``(D_in part b, D_out part e)`` of ``W``, replicated along ``a``.
    spec : ShardSpec
        State and rows of ``X``.
    out_width : int
        ``D_out``.

    Returns
    -------
    (torch.Tensor, ShardSpec)
        The shard of ``Y`` in state ``(a, e, b)``.
    """
    return _LinearFn.apply(x, weight, runtime, spec.layout), spec.with_layout(
        spec.layout.after_linear(), out_width
    )


def linear_cost(
    layout: Layout, width_in: int, width_out: int, needs_dx: bool, sizes: LocalSizes
) -> list[CollectiveCost]:
    """Collectives of :func:`parallel_linear` on ``X`` in ``layout`` ``(a, b, e)``.

    Forward ``Y`` over ``b`` and backward ``dX`` over ``e`` (both in the PMM precision;
    ``dX`` only when ``needs_dx``), ``dW`` over ``a`` in float32.

    >>> from dgl_scalegnn.core.cost import UniformSizes
    >>> from dgl_scalegnn.core.layout import INPUT_LAYOUT
    >>> [str(c) for c in linear_cost(INPUT_LAYOUT, 8, 4, False, UniformSizes(10.0, 2))]
    ['all_reduce over z: 20 elements', 'all_reduce over x: 8 elements']
    """
    a, b, e = layout.rows, layout.cols, layout.rep
    rows, cols_in, cols_out = sizes.rows(a), sizes.cols(width_in, b), sizes.cols(width_out, e)
    costs = [CollectiveCost(b, rows * cols_out, low_precision=True)]
    if needs_dx:
        costs.append(CollectiveCost(e, rows * cols_in, low_precision=True, backward=True))
    costs.append(CollectiveCost(a, cols_in * cols_out, backward=True))
    return costs


class _SpMMFn(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, features: torch.Tensor, adjacency: LocalSpMM, runtime: Runtime, layout: Layout
    ):
        ctx.adjacency, ctx.runtime, ctx.layout = adjacency, runtime, layout
        with runtime.profiler.region("spmm"):
            out = adjacency.matmul(features.contiguous())
        return all_reduce(
            out,
            runtime.grid.group(layout.rows),
            runtime.profiler,
            low_precision=runtime.options.bf16,
        )

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        runtime, layout = ctx.runtime, ctx.layout
        with runtime.profiler.region("spmm"):
            grad_features = ctx.adjacency.matmul_t(grad.contiguous())
        grad_features = all_reduce(
            grad_features,
            runtime.grid.group(layout.rep),
            runtime.profiler,
            low_precision=runtime.options.bf16,
        )
        return grad_features, None, None, None


def parallel_spmm(
    features: torch.Tensor, adjacency: LocalSpMM, spec: ShardSpec, runtime: Runtime
) -> tuple[torch.Tensor, ShardSpec]:
    """:math:`H = \\tilde A F` with ``F`` in state ``(a, b, e)``; forward: all-reduce over ``a``.

    The adjacency block must have rows split along ``e`` and columns along ``a`` (the
    plane of this layer); the result is in state ``(e, b, a)``.
    """
    if adjacency.num_cols != features.shape[0]:
        raise RuntimeError(
            f"SpMM: adjacency block has {adjacency.num_cols} columns but the features shard "
            f"has {features.shape[0]} rows (state {spec.layout})"
        )
    return _SpMMFn.apply(features, adjacency, runtime, spec.layout), spec.with_layout(
        spec.layout.after_spmm()
    )


def spmm_cost(
    layout: Layout, width: int, sizes: LocalSizes, needs_grad: bool = True
) -> list[CollectiveCost]:
    """Collectives of :func:`parallel_spmm` on ``F`` in ``layout`` ``(a, b, e)``: the
    output ``(rows of e, cols of b)`` over ``a``, then (when ``F`` ``needs_grad``) ``dF``
    ``(rows of a, cols of b)`` over ``e``, both in the PMM precision."""
    a, b, e = layout.rows, layout.cols, layout.rep
    costs = [CollectiveCost(a, sizes.rows(e) * sizes.cols(width, b), low_precision=True)]
    if needs_grad:
        elements = sizes.rows(a) * sizes.cols(width, b)
        costs.append(CollectiveCost(e, elements, low_precision=True, backward=True))
    return costs
