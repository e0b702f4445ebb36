"""Parallel operators of a GCN layer under 3D PMM, each an autograd function.

Every operator takes the local shard of a matrix in a :class:`Layout` ``(a, b, e)``
and writes its forward and backward side by side. Notation: ``group(a)`` is the group
of ranks that differ only along grid axis ``a``.

=================  ==========================  =====================================
operator           forward                     backward
=================  ==========================  =====================================
linear  X W        all-reduce group(b)         dX: all-reduce group(e);
                                               dW: all-reduce group(a)
SpMM    A F        all-reduce group(a)         dF: all-reduce group(e)
RMSNorm            sum of squares, group(b)    the same, group(b); gain: group(a)
redistribute       all-to-all over the TP grid the reverse all-to-all
cross-entropy      max/sum-exp over group(b),  local
                   loss over group(a)
=================  ==========================  =====================================

Gradients of replicated tensors are kept complete on every replica.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from dgl_scalegnn.core.layout import Axis, Layout
from dgl_scalegnn.distributed.comm import Runtime, all_reduce, all_to_all, start_all_reduce
from dgl_scalegnn.parallel.partition import ShardSpec
from dgl_scalegnn.parallel.spmm import LocalSpMM

__all__ = [
    "parallel_linear",
    "parallel_spmm",
    "sum_of_squares",
    "reduce_grad",
    "redistribute",
    "parallel_cross_entropy",
    "parallel_bce",
    "parallel_argmax",
    "dropout_hashes",
    "dropout_keep",
    "dropout_mask",
    "hash32",
]


# --------------------------------------------------------------------------- linear
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


# ----------------------------------------------------------------------------- SpMM
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


# -------------------------------------------------------------------------- RMSNorm
class _SumOfSquaresFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, runtime: Runtime, layout: Layout):
        ctx.save_for_backward(x)
        ctx.runtime, ctx.layout = runtime, layout
        with runtime.profiler.region("elementwise"):
            square_sum = (x * x).sum(dim=1, keepdim=True)
        # Statistics stay float32 even when PMM traffic is bfloat16.
        return all_reduce(square_sum, runtime.grid.group(layout.cols), runtime.profiler)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        (x,) = ctx.saved_tensors
        runtime = ctx.runtime
        # Every rank of the group used the sum with its own columns: add their gradients.
        grad = all_reduce(grad.contiguous(), runtime.grid.group(ctx.layout.cols), runtime.profiler)
        return 2.0 * x * grad, None, None


def sum_of_squares(x: torch.Tensor, spec: ShardSpec, runtime: Runtime) -> torch.Tensor:
    """Row sums of squares over the global columns; forward and backward: all-reduce over ``b``.

    ``x`` in state ``(a, b, e)``; returns ``(rows, 1)`` float32, the same on every rank
    of the ``b``-group.
    """
    return _SumOfSquaresFn.apply(x, runtime, spec.layout)


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


# ---------------------------------------------------------------------- redistribute
def _block_bounds(spec: ShardSpec, runtime: Runtime, rank: int) -> tuple[int, int, int, int]:
    coords = runtime.grid.shape.coords(rank)
    r0, r1 = spec.row_range(coords)
    c0, c1 = spec.col_range(runtime.grid.shape, coords)
    return r0, r1, c0, c1


def _exchange(x: torch.Tensor, src: ShardSpec, dst: ShardSpec, runtime: Runtime) -> torch.Tensor:
    """Move a matrix from state ``src`` to ``dst`` with one all-to-all over the TP grid.

    The destination's block comes from the sources that share its coordinate along the
    source's replication axis; each sends the overlap of its block with the
    destination's.
    """
    grid = runtime.grid
    group = grid.tp_group
    me = grid.rank
    my_src = _block_bounds(src, runtime, me)
    my_dst = _block_bounds(dst, runtime, me)
    rep = src.layout.rep
    chunks, incoming = [], []
    for peer in group.ranks:
        peer_coords = grid.shape.coords(peer)
        peer_dst = _block_bounds(dst, runtime, peer)
        if peer_coords.along(rep) == grid.coords.along(rep):
            overlap = _intersect(my_src, peer_dst)
            chunks.append(
                x[
                    overlap[0] - my_src[0] : overlap[1] - my_src[0],
                    overlap[2] - my_src[2] : overlap[3] - my_src[2],
                ]
            )
        else:
            chunks.append(x.new_empty(0))
        peer_src = _block_bounds(src, runtime, peer)
        incoming.append(
            _intersect(peer_src, my_dst)
            if peer_coords.along(rep) == grid.coords.along(rep)
            else None
        )
    numels = [0 if box is None else (box[1] - box[0]) * (box[3] - box[2]) for box in incoming]
    received = all_to_all(chunks, numels, group, runtime.profiler)
    out = x.new_empty(my_dst[1] - my_dst[0], my_dst[3] - my_dst[2])
    for box, flat in zip(incoming, received):
        if box is None or flat.numel() == 0:
            continue
        out[box[0] - my_dst[0] : box[1] - my_dst[0], box[2] - my_dst[2] : box[3] - my_dst[2]] = (
            flat.view(box[1] - box[0], box[3] - box[2])
        )
    return out


def _intersect(
    a: tuple[int, int, int, int], b: tuple[int, int, int, int]
) -> tuple[int, int, int, int]:
    r0, r1 = max(a[0], b[0]), min(a[1], b[1])
    c0, c1 = max(a[2], b[2]), min(a[3], b[3])
    return r0, max(r0, r1), c0, max(c0, c1)


class _RedistributeFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, src: ShardSpec, dst: ShardSpec, runtime: Runtime):
        ctx.src, ctx.dst, ctx.runtime = src, dst, runtime
        return _exchange(x, src, dst, runtime)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        return _exchange(grad.contiguous(), ctx.dst, ctx.src, ctx.runtime), None, None, None


def redistribute(x: torch.Tensor, src: ShardSpec, layout: Layout, runtime: Runtime) -> torch.Tensor:
    """Move ``x`` from ``src`` to state ``layout``; forward: all-to-all, backward: the reverse.

    Works for uneven splits of rows (vertex ranges) and columns; a no-op when the
    layouts agree.
    """
    if src.layout == layout:
        return x
    return _RedistributeFn.apply(x, src, src.with_layout(layout), runtime)


# ---------------------------------------------------------------------------- losses
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
            local = per_entry[mask].sum()
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


@torch.no_grad()
def parallel_argmax(logits: torch.Tensor, spec: ShardSpec, runtime: Runtime) -> torch.Tensor:
    """Global class index of each local row's largest logit (ties: smallest index)."""
    grid, profiler = runtime.grid, runtime.profiler
    group = grid.group(spec.layout.cols)
    class_start, _ = spec.col_range(grid.shape, grid.coords)
    logits = logits.float()
    if logits.shape[1]:
        local_max, local_arg = logits.max(dim=1)
    else:
        local_max = logits.new_full((logits.shape[0],), -torch.inf)
        local_arg = torch.zeros(logits.shape[0], dtype=torch.int64, device=logits.device)
    global_max = all_reduce(local_max.clone(), group, profiler, op=dist.ReduceOp.MAX)
    sentinel = torch.iinfo(torch.int64).max
    candidate = torch.where(local_max == global_max, local_arg + class_start, sentinel)
    return all_reduce(candidate, group, profiler, op=dist.ReduceOp.MIN)


# --------------------------------------------------------------------------- dropout
_MIX = 0x45D9F3B  # odd, so multiplying by it permutes the 32-bit integers


def _unsigned_shift16(x: torch.Tensor) -> torch.Tensor:
    """``x >> 16`` of int32 ``x`` read as unsigned (torch shifts int32 arithmetically)."""
    return (x >> 16) & 0xFFFF


def _int32(value: int) -> int:
    """The low 32 bits of ``value`` as a signed 32-bit integer (what an int32 tensor holds)."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mixer (two multiply-xorshift rounds) on int32 tensors.

    Multiplication wraps modulo :math:`2^{32}` (two's complement), shifts are logical:
    the result is the unsigned 32-bit hash of the bits of ``x``, stored as int32.

    >>> hash32(torch.tensor([0, 1], dtype=torch.int32)).dtype
    torch.int32
    """
    x = (_unsigned_shift16(x) ^ x) * _MIX
    x = (_unsigned_shift16(x) ^ x) * _MIX
    return _unsigned_shift16(x) ^ x


def dropout_hashes(
    key: int, row_ids: torch.Tensor, col_start: int, num_cols: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row ``(rows, 1)`` and per-column ``(1, num_cols)`` int32 hashes of a shard.

    ``key`` mixes the seed, step and layer (a Python int: it reaches the device as a
    kernel argument, not as a copy); its low 32 bits salt the rows, its high bits the
    columns. Row ids are global vertex ids (below :math:`2^{31}`).
    """
    rows = row_ids.to(torch.int32).reshape(-1, 1)
    row_hash = hash32(rows ^ _int32(key))
    cols = torch.arange(num_cols, dtype=torch.int32, device=row_ids.device).reshape(1, -1)
    col_hash = hash32(hash32(cols + _int32(col_start + (key >> 32))))
    return row_hash, col_hash


def dropout_keep(row_hash: torch.Tensor, col_hash: torch.Tensor, rate: float) -> torch.Tensor:
    """Keep-mask from :func:`dropout_hashes`: one multiply per element mixes the pair.

    The product :math:`h = (r_i \\oplus c_j) \\cdot m \\bmod 2^{32}`, read as a signed
    int32, is uniform on :math:`[-2^{31}, 2^{31})` (``m`` odd permutes the integers);
    an element is kept when :math:`h \\ge -2^{31} + \\lfloor p\\, 2^{32} \\rfloor`, i.e.
    with probability :math:`1 - p`.
    """
    threshold = min(int(rate * (1 << 32)) - (1 << 31), (1 << 31) - 1)
    mixed = row_hash ^ col_hash
    return mixed.mul_(_MIX) >= threshold  # in place: one int32 buffer per mask


def dropout_mask(
    key: int, row_ids: torch.Tensor, col_start: int, num_cols: int, rate: float
) -> torch.Tensor:
    """Keep-mask ``(len(row_ids), num_cols)`` as a hash of (key, global row, global column).

    ``key`` (an int) mixes the seed, step and layer; the mask of an element depends only
    on its global coordinates, so it is the same on every grid shape.

    >>> mask = dropout_mask(7, torch.arange(100), 0, 50, rate=0.2)
    >>> mask.shape, 0.75 < mask.float().mean().item() < 0.85
    (torch.Size([100, 50]), True)
    """
    return dropout_keep(*dropout_hashes(key, row_ids, col_start, num_cols), rate)
