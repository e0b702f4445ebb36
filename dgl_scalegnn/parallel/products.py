"""Sparse and dense products of 3D PMM: ``X W`` and ``A F``, forward and backward
side by side.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from dgl_scalegnn.core.cost import CollectiveCost, LocalSizes
from dgl_scalegnn.core.layout import Layout
from dgl_scalegnn.distributed.comm import Runtime, all_reduce, start_all_reduce
from dgl_scalegnn.parallel.partition import ShardSpec
from dgl_scalegnn.parallel.spmm import LocalSpMM

__all__ = [
    "parallel_linear",
    "parallel_linear_sum",
    "linear_cost",
    "parallel_spmm",
    "parallel_row_sums",
    "spmm_cost",
]


def _joined(tensors: tuple[torch.Tensor, ...], dim: int) -> torch.Tensor:
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors, dim=dim)


class _LinearFn(torch.autograd.Function):
    """:math:`Y = \\sum_k X_k W_k` (``operands`` ``X_1, W_1, X_2, W_2, ...``), which is
    :math:`[X_1 | X_2 | \\dots] [W_1; W_2; \\dots]` without the concatenation of the
    :math:`X_k`: the same collectives as one product of the joined matrices."""

    @staticmethod
    def forward(ctx: Any, runtime: Runtime, layout: Layout, *operands: torch.Tensor):
        ctx.save_for_backward(*operands)
        ctx.runtime, ctx.layout = runtime, layout
        with runtime.profiler.region("gemm"):
            y = operands[0] @ operands[1]
            for x, weight in zip(operands[2::2], operands[3::2]):
                y.addmm_(x, weight)
        grid = runtime.grid
        return all_reduce(
            y, grid.group(layout.cols), runtime.profiler, low_precision=runtime.options.bf16
        )

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        operands = ctx.saved_tensors
        xs, weights = operands[0::2], operands[1::2]
        runtime, layout = ctx.runtime, ctx.layout
        grid, profiler, options = runtime.grid, runtime.profiler, runtime.options
        grad = grad.contiguous()
        widths = [x.shape[1] for x in xs]
        needs_x = ctx.needs_input_grad[2::2]
        pending_x = None
        if any(needs_x):  # input features need no gradient: skip dX entirely
            with profiler.region("gemm"):
                grad_x = grad @ _joined(weights, 0).t()
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
            grad_w = _joined(tuple(x.t() @ grad for x in xs), 0)
        pending_w = start_all_reduce(
            grad_w, grid.group(layout.rows), profiler, async_op=options.overlap
        )
        grads_x = [None] * len(xs)
        if pending_x is not None:
            grads_x = [
                part if needs else None
                for part, needs in zip(pending_x.wait().split(widths, dim=1), needs_x)
            ]
        grads_w = pending_w.wait().split(widths, dim=0)
        return None, None, *(g for pair in zip(grads_x, grads_w) for g in pair)


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
    return parallel_linear_sum(((x, weight),), spec, out_width, runtime)


def parallel_linear_sum(
    pairs: Sequence[tuple[torch.Tensor, torch.Tensor]],
    spec: ShardSpec,
    out_width: int,
    runtime: Runtime,
) -> tuple[torch.Tensor, ShardSpec]:
    """:math:`Y = \\sum_k X_k W_k`, every :math:`X_k` in ``spec``'s state ``(a, b, e)``
    (its width aside) and :math:`W_k` split as in :func:`parallel_linear`: the product
    :math:`[X_1 | X_2 | \\dots] [W_1; W_2; \\dots]` with the collectives of one
    :func:`parallel_linear` of the joined matrices (:func:`linear_cost` of their summed
    width), but no joined copy of the :math:`X_k`.

    >>> from dgl_scalegnn.core.layout import INPUT_LAYOUT
    >>> from dgl_scalegnn.distributed.comm import Runtime
    >>> from dgl_scalegnn.parallel.partition import RowPartition
    >>> x, m, w, v = torch.ones(3, 2), torch.ones(3, 4), torch.ones(2, 5), torch.ones(4, 5)
    >>> runtime = Runtime.single_process()
    >>> spec = ShardSpec(INPUT_LAYOUT, RowPartition.of(torch.arange(3), 3, runtime.grid.shape), 2)
    >>> y, _ = parallel_linear_sum([(x, w), (m, v)], spec, 5, runtime)
    >>> torch.equal(y, torch.cat((x, m), 1) @ torch.cat((w, v), 0))
    True
    """
    operands = [t for pair in pairs for t in pair]
    return _LinearFn.apply(runtime, spec.layout, *operands), spec.with_layout(
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
            out = adjacency.matmul(features)  # each kernel reads the strides it can
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


def parallel_row_sums(
    like: torch.Tensor, adjacency: LocalSpMM, spec: ShardSpec, runtime: Runtime
) -> tuple[torch.Tensor, ShardSpec]:
    """:math:`\\tilde A \\mathbf 1` in ``like``'s dtype, without gradient: what
    :func:`parallel_spmm` gives for a column of ones in ``spec``'s state (the all-reduce
    over ``a`` alike), from :meth:`~dgl_scalegnn.parallel.spmm.LocalSpMM.row_sums`."""
    profiler = runtime.profiler
    with profiler.region("spmm"):
        local = adjacency.row_sums(like)
    group = runtime.grid.group(spec.layout.rows)
    total = all_reduce(local, group, profiler, low_precision=runtime.options.bf16)
    return total, spec.with_layout(spec.layout.after_spmm(), 1)


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
