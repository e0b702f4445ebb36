"""Moving a matrix from one layout to another over the TP grid (the residual's
all-to-all), forward and backward side by side.
"""

from __future__ import annotations

from typing import Any

import torch

from dgl_scalegnn.core.cost import TP_GRID, CollectiveCost, LocalSizes
from dgl_scalegnn.core.layout import Layout
from dgl_scalegnn.distributed.comm import Runtime, all_to_all
from dgl_scalegnn.parallel.partition import ShardSpec

__all__ = ["redistribute", "redistribute_cost"]


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
    layouts agree or the TP grid is one rank (every layout is then the whole matrix).
    """
    if src.layout == layout or runtime.grid.shape.tp_size == 1:
        return x
    return _RedistributeFn.apply(x, src, src.with_layout(layout), runtime)


def redistribute_cost(
    src: Layout, dst: Layout, width: int, sizes: LocalSizes, needs_grad: bool = True
) -> list[CollectiveCost]:
    """Collectives of :func:`redistribute` of a ``width``-column matrix from ``src`` to
    ``dst``: one float32 all-to-all over the TP grid forward, and one back when the
    input ``needs_grad`` (none when the layouts agree)."""
    if src == dst:
        return []
    costs = [CollectiveCost(TP_GRID, sizes.sent(src, dst, width), "all_to_all")]
    if needs_grad:
        sent = sizes.sent(dst, src, width)
        costs.append(CollectiveCost(TP_GRID, sent, "all_to_all", backward=True))
    return costs
