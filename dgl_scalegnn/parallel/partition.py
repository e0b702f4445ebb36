"""How the rows and columns of a distributed batch matrix are split over the grid.

Rows of a batch matrix are the batch's vertices in sorted global order. The vertex range
``[0, N)`` is split into contiguous ranges along each grid axis with
:func:`~dgl_scalegnn.core.layout.split_bounds`; the rows of part ``i`` along an axis
are the batch vertices in range ``i``, a contiguous slice of the sorted ids. Rows
therefore split unevenly from step to step, and every rank derives the same offsets.
Columns (feature, hidden and class dimensions) are split by count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dgl_scalegnn.core.grid_shape import Coords, GridShape
from dgl_scalegnn.core.layout import Axis, Layout, block_range, split_bounds

__all__ = ["RowPartition", "ShardSpec"]


@dataclass(frozen=True)
class RowPartition:
    """Sorted global vertex ids of a batch and their split along each grid axis.

    Examples
    --------
    >>> import torch
    >>> from dgl_scalegnn.distributed.grid import GridShape
    >>> rows = RowPartition.of(torch.tensor([1, 2, 6, 9]), 10, GridShape(1, 2, 3, 1))
    >>> rows.range(Axis.X, 1), rows.range(Axis.Y, 0)
    ((2, 4), (0, 2))
    """

    vertex_ids: torch.Tensor
    num_nodes: int
    bounds: tuple[tuple[Axis, tuple[int, ...]], ...]

    @classmethod
    def of(
        cls,
        vertex_ids: torch.Tensor,
        num_nodes: int,
        shape: GridShape,
        device: torch.device | str | None = None,
    ) -> RowPartition:
        """Split sorted ``vertex_ids`` by the vertex ranges of every axis of ``shape``.

        The offsets are found by one binary search and read back once; give the ids on
        the CPU (where the sampler draws them) and the ``device`` to keep them on, so
        that no accelerator has to be waited for.
        """
        axes = tuple(Axis)
        vertex_bounds = [split_bounds(num_nodes, shape.size(axis)) for axis in axes]
        flat = torch.tensor(
            [b for bounds in vertex_bounds for b in bounds],
            dtype=vertex_ids.dtype,
            device=vertex_ids.device,
        )
        offsets = torch.searchsorted(vertex_ids, flat).tolist()
        bounds, start = [], 0
        for axis, axis_bounds in zip(axes, vertex_bounds):
            bounds.append((axis, tuple(offsets[start : start + len(axis_bounds)])))
            start += len(axis_bounds)
        if device is not None:
            vertex_ids = vertex_ids.to(device, non_blocking=True)
        return cls(vertex_ids=vertex_ids, num_nodes=num_nodes, bounds=tuple(bounds))

    @classmethod
    def of_ranges(
        cls,
        ranges: Sequence[tuple[int, int]],
        num_nodes: int,
        shape: GridShape,
        device: torch.device | str = "cpu",
    ) -> RowPartition:
        """The vertices of the sorted, disjoint ``[start, stop)`` ``ranges``: the ids made
        on ``device``, their split found from the ranges on the host (nothing is read back
        from the device).

        >>> rows = RowPartition.of_ranges([(1, 3), (6, 7), (9, 10)], 10, GridShape(1, 2, 3, 1))
        >>> rows.vertex_ids.tolist(), rows.range(Axis.X, 1), rows.range(Axis.Y, 0)
        ([1, 2, 6, 9], (2, 4), (0, 2))
        """
        pieces = [torch.arange(start, stop, device=device) for start, stop in ranges]
        vertex_ids = (
            torch.cat(pieces) if pieces else torch.empty(0, dtype=torch.int64, device=device)
        )
        bounds = tuple(
            (axis, tuple(_ids_below(ranges, v) for v in split_bounds(num_nodes, shape.size(axis))))
            for axis in Axis
        )
        return cls(vertex_ids=vertex_ids, num_nodes=num_nodes, bounds=bounds)

    @property
    def num_rows(self) -> int:
        return int(self.vertex_ids.numel())

    def _bounds(self, axis: Axis) -> tuple[int, ...]:
        for candidate, offsets in self.bounds:
            if candidate is axis:
                return offsets
        raise KeyError(axis)

    def range(self, axis: Axis, index: int) -> tuple[int, int]:
        """``[start, stop)`` offsets into the sorted ids of part ``index`` along ``axis``."""
        offsets = self._bounds(axis)
        return offsets[index], offsets[index + 1]

    def ids(self, axis: Axis, index: int) -> torch.Tensor:
        start, stop = self.range(axis, index)
        return self.vertex_ids[start:stop]


def _ids_below(ranges: Sequence[tuple[int, int]], vertex: int) -> int:
    """How many vertices of ``ranges`` lie below ``vertex`` (its offset in the sorted ids)."""
    return sum(max(0, min(stop, vertex) - start) for start, stop in ranges)


@dataclass(frozen=True)
class ShardSpec:
    """A distributed batch matrix: its layout, its rows and its global column count."""

    layout: Layout
    rows: RowPartition
    num_cols: int

    def row_range(self, coords: Coords) -> tuple[int, int]:
        return self.rows.range(self.layout.rows, coords.along(self.layout.rows))

    def col_range(self, shape: GridShape, coords: Coords) -> tuple[int, int]:
        axis = self.layout.cols
        return block_range(self.num_cols, shape.size(axis), coords.along(axis))

    def local_shape(self, shape: GridShape, coords: Coords) -> tuple[int, int]:
        r0, r1 = self.row_range(coords)
        c0, c1 = self.col_range(shape, coords)
        return r1 - r0, c1 - c0

    def with_layout(self, layout: Layout, num_cols: int | None = None) -> ShardSpec:
        return ShardSpec(layout, self.rows, self.num_cols if num_cols is None else num_cols)
