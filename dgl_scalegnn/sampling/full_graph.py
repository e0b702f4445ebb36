"""Full-graph evaluation, layer by layer in row chunks, straight from the resident CSR.

Evaluation multiplies by the whole normalised adjacency (no sampling, no rescaling),
which is exactly the block each rank keeps for sampling (:class:`CSRBlock`). So the
forward needs no batch: a GCN layer computes its output rows in chunks,

.. math::

    X_{h,l}[R_k] = \\mathrm{tail}\\big(\\tilde A[R_k, :]\\, X_{h,l-1}\\, W_l\\big),

where :math:`R_k` is chunk ``k`` of the layer's output rows and
:math:`\\tilde A[R_k, :]` a CSR view over slices of the block's ``indptr``, ``indices``
and ``values`` (no copy of the adjacency, no COO, no transpose). The only full-size
buffers are the layer's input and output, as in DGL's layer-wise inference.

Chunk ``k`` of a layer is the union over the parts of the output row axis of each
part's local rows ``[k c, (k + 1) c)``: every rank runs the same number of chunks and
the ranks of a reduce group (which share the row axis) the same row counts, so the
parallel operators of the training forward (all-reduces, the residual's all-to-all)
apply to a chunk unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch

from dgl_scalegnn.core.grid_shape import Coords, GridShape
from dgl_scalegnn.core.layout import Axis, Plane, split_bounds
from dgl_scalegnn.parallel.partition import RowPartition
from dgl_scalegnn.parallel.spmm import csr_tensor
from dgl_scalegnn.sampling.blocks import CSRBlock

__all__ = [
    "FullGraph",
    "RowChunk",
    "CSRRows",
    "row_chunks",
    "DEFAULT_CHUNK_ROWS",
    "default_chunk_rows",
]

#: Output rows per chunk on one process: 64Ki rows of width 128 are 32 MB of float32.
DEFAULT_CHUNK_ROWS = 65536


def default_chunk_rows(tp_size: int) -> int:
    """Output rows per chunk and rank on ``tp_size`` tensor-parallel ranks:
    :data:`DEFAULT_CHUNK_ROWS` shared out among half as many ranks (at least 1024, at
    most :data:`DEFAULT_CHUNK_ROWS`).

    A rank's share of the graph shrinks with ``tp_size`` but its fixed cost (the
    interpreter, torch and DGL: about 384 MB) does not, so the chunk's temporaries shrink
    too; but every chunk costs each layer three or four collectives, whose latency
    dominates on many ranks. On 1x2x2x2 with the 1M sparse graph (two rounds each, two
    runs): 8192 rows per rank evaluated in 8.1-9.9 s with peaks of 808-845 MB a rank,
    16384 in 7.0-9.0 s with 824-880 MB, 32768 in 6.9-8.3 s with 862-932 MB.

    >>> default_chunk_rows(1), default_chunk_rows(8), default_chunk_rows(512)
    (65536, 16384, 1024)
    """
    return min(DEFAULT_CHUNK_ROWS, max(1024, 2 * DEFAULT_CHUNK_ROWS // tp_size))


@dataclass(frozen=True)
class FullGraph:
    """This rank's share of the whole graph for evaluation (views of the resident store).

    ``blocks``: the normalised adjacency block per plane; ``features`` in state
    ``(x, z, y)``; ``labels``/``masks``: rows along the logits' row axis; ``rows``: every
    vertex, split along every axis.
    """

    rows: RowPartition
    blocks: Mapping[Plane, CSRBlock]
    features: torch.Tensor
    labels: torch.Tensor
    masks: Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class RowChunk:
    """Chunk of a full-graph matrix whose rows are split along ``axis``.

    ``rows``: the chunk's vertices over all parts of ``axis``; ``start``/``stop``: this
    rank's rows of it as offsets into its local rows of the full matrix.
    """

    rows: RowPartition
    start: int
    stop: int

    def rows_of(
        self, matrix: torch.Tensor, axis: Axis, coords: Coords, range_start: int
    ) -> torch.Tensor:
        """The chunk's rows of this rank's shard ``matrix`` of a full-graph matrix split along
        ``axis`` (its rows start at vertex ``range_start``): a view when they are contiguous
        (always on one process), else a gather."""
        ids = self.rows.ids(axis, coords.along(axis))
        if ids.numel() == 0:
            return matrix[:0]
        first, last = (int(v) - range_start for v in ids[[0, -1]].tolist())
        if last - first + 1 == ids.numel():
            return matrix[first : last + 1]
        return matrix.index_select(0, ids - range_start)


def row_chunks(
    num_nodes: int,
    axis: Axis,
    shape: GridShape,
    coords: Coords,
    chunk_rows: int,
    device: torch.device | str = "cpu",
) -> Iterator[RowChunk]:
    """The chunks of a full-graph matrix split along ``axis``, the same count on every rank.

    Examples
    --------
    >>> from dgl_scalegnn.distributed.grid import GridShape
    >>> shape = GridShape(1, 2, 1, 1)
    >>> chunks = list(row_chunks(7, Axis.X, shape, shape.coords(1), chunk_rows=2))
    >>> [(c.start, c.stop, c.rows.vertex_ids.tolist()) for c in chunks]
    [(0, 2, [0, 1, 4, 5]), (2, 3, [2, 3, 6])]
    """
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows: got {chunk_rows}, expected a positive row count")
    bounds = split_bounds(num_nodes, shape.size(axis))
    starts, stops = bounds[:-1], bounds[1:]
    mine = coords.along(axis)
    local_rows = stops[mine] - starts[mine]
    largest = max(stop - start for start, stop in zip(starts, stops))
    for k in range(max(1, math.ceil(largest / chunk_rows))):
        offset = k * chunk_rows
        pieces = [
            torch.arange(
                min(stop, start + offset), min(stop, start + offset + chunk_rows), device=device
            )
            for start, stop in zip(starts, stops)
        ]
        yield RowChunk(
            rows=RowPartition.of(torch.cat(pieces), num_nodes, shape),
            start=min(offset, local_rows),
            stop=min(offset + chunk_rows, local_rows),
        )


class CSRRows:
    """Rows ``[start, stop)`` of a CSR block as a local SpMM (forward only), without copies.

    The CSR view shares the block's ``indices`` and ``values``; only the chunk's
    ``indptr`` is rebased (and cast to the index dtype, which torch requires to match).

    Examples
    --------
    >>> import torch
    >>> block = CSRBlock(row_start=0, row_stop=2, col_start=0, col_stop=2,
    ...                  indptr=torch.tensor([0, 2, 3]), indices=torch.tensor([0, 1, 1],
    ...                  dtype=torch.int32), values=torch.tensor([0.5, 1.0, 0.5]),
    ...                  row_scale=torch.ones(2), col_scale=torch.ones(2))
    >>> CSRRows(block, 1, 2).matmul(torch.tensor([[1.0], [4.0]])).tolist()
    [[2.0]]
    """

    def __init__(self, block: CSRBlock, start: int, stop: int) -> None:
        self.block, self.start, self.stop = block, start, stop
        self.num_rows = stop - start
        self.num_cols = block.col_stop - block.col_start

    def matmul(self, features: torch.Tensor) -> torch.Tensor:
        """``(num_cols, D) -> (num_rows, D)``."""
        block = self.block
        crow = block.indptr[self.start : self.stop + 1]
        lo, hi = (int(v) for v in crow[[0, -1]].tolist()) if self.num_rows else (0, 0)
        if lo == hi or self.num_cols == 0:
            return features.new_zeros(self.num_rows, features.shape[1])
        matrix = csr_tensor(
            (crow - lo).to(block.indices.dtype),
            block.indices[lo:hi],
            block.values[lo:hi].to(features.dtype),
            (self.num_rows, self.num_cols),
        )
        return matrix @ features
