"""The row chunks of a layer-wise evaluation, and their rows of the resident CSR.

Evaluation multiplies by the whole normalised adjacency (no sampling, no rescaling),
which is exactly the block each rank keeps for sampling (:class:`CSRBlock`). So the
forward needs no batch: a GCN layer computes its output rows in chunks,

.. math::

    X_{h,l}[R_k] = \\mathrm{tail}\\big(\\tilde A[R_k, :]\\, X_{h,l-1}\\, W_l\\big),

where :math:`R_k` is chunk ``k`` of the layer's output rows and
:math:`\\tilde A[R_k, :]` a CSR of those rows of the block (:class:`CSRRows`: only the
chunk's entries are copied; no COO, no transpose). The only full-size buffers are the
layer's input and output, as in DGL's layer-wise inference.

Chunk ``k`` of a layer is the union over the parts of the output row axis of each
part's local rows ``[k c, (k + 1) c)``: every rank runs the same number of chunks and
the ranks of a reduce group (which share the row axis) the same row counts, so the
parallel operators of the training forward (all-reduces, the residual's all-to-all)
apply to a chunk unchanged. Its rows and their split are known on the host, so no chunk
waits for the device; how many rows a chunk takes is :mod:`~dgl_scalegnn.evaluation.memory`'s.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise

import torch

from dgl_scalegnn.core.grid_shape import Coords, GridShape
from dgl_scalegnn.core.layout import Axis, split_bounds
from dgl_scalegnn.parallel import cpu_kernels
from dgl_scalegnn.parallel.partition import RowPartition
from dgl_scalegnn.parallel.spmm import RowSumsByProduct, csr_tensor
from dgl_scalegnn.sampling.blocks import CSRBlock

__all__ = ["RowChunk", "CSRRows", "row_chunks", "chunk_count", "csr_row_chunks"]


@dataclass(frozen=True)
class RowChunk:
    """Chunk ``index`` of a full-graph matrix whose rows are split along ``axis``.

    ``rows``: the chunk's vertices over all parts of ``axis``, which are the sorted,
    disjoint vertex ``ranges`` (known on the host); ``start``/``stop``: this rank's rows
    of it as offsets into its local rows of the full matrix.
    """

    rows: RowPartition
    start: int
    stop: int
    index: int
    ranges: tuple[tuple[int, int], ...]

    def rows_of(
        self, matrix: torch.Tensor, axis: Axis, coords: Coords, range_start: int
    ) -> torch.Tensor:
        """The chunk's rows of this rank's shard ``matrix`` of a full-graph matrix split along
        ``axis`` (its rows start at vertex ``range_start``): a view when they are contiguous
        (always on one process), else a gather. Decided from :attr:`ranges`, so nothing is
        read back from the device."""
        first, last = self.rows.range(axis, coords.along(axis))
        pieces = self.local_runs(axis, coords, range_start)
        if len(pieces) <= 1:
            start = pieces[0][0] if pieces else 0
            return matrix[start : start + last - first]
        return matrix.index_select(0, self.rows.vertex_ids[first:last] - range_start)

    def local_runs(self, axis: Axis, coords: Coords, range_start: int) -> list[tuple[int, int]]:
        """The chunk's rows of this rank's shard of a matrix split along ``axis`` (whose
        rows start at vertex ``range_start``) as ``[start, stop)`` runs of its local rows,
        in order (from :attr:`ranges`, on the host)."""
        first, last = self.rows.range(axis, coords.along(axis))
        return [
            (start - range_start, stop - range_start)
            for start, stop in _vertices_at(self.ranges, first, last)
        ]


def _vertices_at(ranges: Sequence[tuple[int, int]], first: int, last: int) -> list[tuple[int, int]]:
    """The vertex ranges at positions ``[first, last)`` of the sorted ids of ``ranges``."""
    pieces, position = [], 0
    for start, stop in ranges:
        lo, hi = max(first, position), min(last, position + stop - start)
        if lo < hi:
            pieces.append((start + lo - position, start + hi - position))
        position += stop - start
    return pieces


def _merged(ranges: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """``ranges`` (sorted) without the empty ones, touching ones joined."""
    out: list[tuple[int, int]] = []
    for start, stop in ranges:
        if start == stop:
            continue
        if out and out[-1][1] == start:
            out[-1] = (out[-1][0], stop)
        else:
            out.append((start, stop))
    return tuple(out)


def chunk_count(num_nodes: int, parts: int, chunk_rows: int) -> int:
    """Chunks of ``chunk_rows`` rows per part of a full-graph matrix whose rows are split
    into ``parts`` (the largest part's count, at least one: every rank runs as many).

    >>> chunk_count(10, 3, 2)
    2
    """
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows: got {chunk_rows}, expected a positive row count")
    return max(1, math.ceil(math.ceil(num_nodes / parts) / chunk_rows))


def row_chunks(
    num_nodes: int,
    axis: Axis,
    shape: GridShape,
    coords: Coords,
    chunk_rows: int,
    device: torch.device | str = "cpu",
) -> Iterator[RowChunk]:
    """The chunks of a full-graph matrix split along ``axis``, the same count on every rank
    (:func:`chunk_count`). Chunk ``k`` holds rows ``[k c, (k + 1) c)`` of every part; its
    ids are made on ``device`` and its split is found on the host (no wait for a device).

    Examples
    --------
    >>> from dgl_scalegnn.distributed.grid import GridShape
    >>> shape = GridShape(1, 2, 1, 1)
    >>> chunks = list(row_chunks(7, Axis.X, shape, shape.coords(1), chunk_rows=2))
    >>> [(c.start, c.stop, c.rows.vertex_ids.tolist()) for c in chunks]
    [(0, 2, [0, 1, 4, 5]), (2, 3, [2, 3, 6])]
    """
    bounds = split_bounds(num_nodes, shape.size(axis))
    parts = list(pairwise(bounds))
    mine = parts[coords.along(axis)]
    local_rows = mine[1] - mine[0]
    for index in range(chunk_count(num_nodes, len(parts), chunk_rows)):
        offset = index * chunk_rows
        ranges = _merged(
            [
                (min(stop, start + offset), min(stop, start + offset + chunk_rows))
                for start, stop in parts
            ]
        )
        yield RowChunk(
            rows=RowPartition.of_ranges(ranges, num_nodes, shape, device),
            start=min(offset, local_rows),
            stop=min(offset + chunk_rows, local_rows),
            index=index,
            ranges=ranges,
        )


class CSRRows(RowSumsByProduct):
    """Rows ``[start, stop)`` of a CSR block as a local SpMM (forward only; a
    :class:`~dgl_scalegnn.parallel.spmm.LocalSpMM` without ``matmul_t``).

    With ``native`` (``parallel.native_kernels``), float32 CPU products run the native
    loop :func:`~dgl_scalegnn.parallel.cpu_kernels.csr_scaled_rows`, straight from the
    block: :math:`r_i \\sum_j c_j x_j` per row, no copy. On the sparse 1M graph's block
    (9.9M entries, 2 cores, in chunks of 32Ki rows) it took 0.16-0.19 s at width 64 and
    0.33-0.35 s at width 128 once it requested rows ahead (0.21-0.24 and 0.45-0.49 s
    before); the torch CSR below took 0.53 s and 0.88 s in an earlier build of the block.

    Otherwise each product gets a CSR of its own: the rows' pointers rebased to start at 0 (and
    cast to the index dtype, which torch requires to match), a copy of their entries'
    column indices and their values :math:`r_i c_j` (the block keeps no values:
    :meth:`~dgl_scalegnn.sampling.blocks.CSRBlock.values_at`), in fresh allocations. Views
    into the block at the rows' entry offset would hand cuSPARSE arrays at arbitrary
    offsets, aligned to 4 bytes only; the copies live for one product, and while they are
    made the rows hold :func:`csr_copy_entry_bytes` an entry (20 with int32 indices).

    ``entries``: the rows' entry range ``[indptr[start], indptr[stop])`` when the caller
    has read it (:func:`csr_row_chunks` reads every chunk's at once); otherwise it is
    read here, one wait for the block's device.

    Examples
    --------
    >>> import torch
    >>> block = CSRBlock(row_start=0, row_stop=2, col_start=0, col_stop=2,
    ...                  indptr=torch.tensor([0, 2, 3]), indices=torch.tensor([0, 1, 1],
    ...                  dtype=torch.int32), row_scale=torch.tensor([1.0, 0.5]),
    ...                  col_scale=torch.ones(2))
    >>> CSRRows(block, 1, 2).matmul(torch.tensor([[1.0], [4.0]])).tolist()
    [[2.0]]
    """

    def __init__(
        self,
        block: CSRBlock,
        start: int,
        stop: int,
        entries: tuple[int, int] | None = None,
        native: bool = False,
    ) -> None:
        self.block, self.start, self.stop, self.native = block, start, stop, native
        self.num_rows = stop - start
        self.num_cols = block.col_stop - block.col_start
        if entries is None:
            lo, hi = block.indptr[[start, stop]].tolist()
            entries = (lo, hi)
        self.entries = entries

    def matmul(self, features: torch.Tensor) -> torch.Tensor:
        """``(num_cols, D) -> (num_rows, D)``."""
        block = self.block
        lo, hi = self.entries
        if lo == hi or self.num_cols == 0:
            return features.new_zeros(self.num_rows, features.shape[1])
        if self._runs_natively(features):
            return cpu_kernels.csr_scaled_rows(
                block.indptr, block.indices, *self._scales(), features, self.start, self.stop
            )
        crow = block.indptr[self.start : self.stop + 1] - lo
        indices = block.indices[lo:hi].clone()
        rows = torch.repeat_interleave(
            torch.arange(self.start, self.stop, dtype=indices.dtype, device=crow.device),
            torch.diff(crow),
            output_size=hi - lo,  # known on the host: no wait for the device
        )
        matrix = csr_tensor(
            crow.to(block.indices.dtype),
            indices,
            block.values_at(rows, indices).to(features.dtype),
            (self.num_rows, self.num_cols),
        )
        return matrix @ features

    def matmul_pieces(
        self, pieces: Iterable[tuple[int, torch.Tensor]], dtype: torch.dtype
    ) -> torch.Tensor:
        """The rows times an operand ``(num_cols, D)`` of ``dtype`` that is never whole:
        ``pieces`` gives ``(first, rows)``, its rows from ``first`` on, in increasing
        order and together all of them; each piece is dropped once its entries are
        summed. Natively (as :meth:`matmul`) every row's entries are summed window by
        window (:func:`~dgl_scalegnn.parallel.cpu_kernels.csr_scaled_window`), to the
        bits of :meth:`matmul` over the whole operand; otherwise each piece's entries
        form a CSR of values :math:`c_j` whose product is added, and the sums are scaled
        by :math:`r_i` at the end (float32 rounding in another order)."""
        block = self.block
        device = block.indptr.device
        out: torch.Tensor | None = None
        native = self._runs_natively(torch.empty(0, dtype=dtype, device=device))
        if native:
            cursor = block.indptr[self.start : self.stop].clone()
        else:
            row_of, cols = self.structure()
        for first, piece in pieces:
            if out is None:
                out = torch.zeros((self.num_rows, piece.shape[1]), dtype=dtype, device=device)
            stop = first + piece.shape[0]
            if native:
                finish = stop >= self.num_cols
                cpu_kernels.csr_scaled_window(
                    block.indptr, block.indices, *self._scales(), piece, first, out, cursor,
                    self.start, finish,
                )  # fmt: skip
            else:
                self._add_piece(row_of, cols, piece, first, out)
            del piece  # the next piece is read without this one
        if out is None:
            raise ValueError("matmul_pieces: no piece of the operand given")
        if not native and not block.unit_scales:
            out *= block.row_scale[self.start : self.stop].to(dtype).unsqueeze(1)
        return out

    def _add_piece(
        self,
        row_of: torch.Tensor,
        cols: torch.Tensor,
        piece: torch.Tensor,
        first: int,
        out: torch.Tensor,
    ) -> None:
        """``out`` plus the product of the entries ``(row_of, cols)`` (:meth:`structure`)
        whose columns the operand's rows ``piece`` from ``first`` on hold, of values
        :math:`c_j` (the row scales come last, in :meth:`matmul_pieces`)."""
        at = ((cols >= first) & (cols < first + piece.shape[0])).nonzero().squeeze(1)
        if not at.numel():
            return
        columns = cols.index_select(0, at)
        counts = torch.bincount(row_of.index_select(0, at), minlength=self.num_rows)
        crow = torch.zeros(self.num_rows + 1, dtype=columns.dtype, device=columns.device)
        torch.cumsum(counts, 0, out=crow[1:])
        if self.block.unit_scales:
            values = torch.ones(at.numel(), dtype=out.dtype, device=out.device)
        else:
            values = self.block.col_scale.index_select(0, columns).to(out.dtype)
        shape = (self.num_rows, piece.shape[0])
        out += csr_tensor(crow, columns - first, values, shape) @ piece

    def row_sums(self, like: torch.Tensor) -> torch.Tensor:
        """``(num_rows, 1)``: the rows times a column of ones, in ``like``'s dtype and on
        its device; where :meth:`matmul` runs natively, the same sums without reading the
        ones (:func:`~dgl_scalegnn.parallel.cpu_kernels.csr_row_sums`)."""
        if not self._runs_natively(like):
            return super().row_sums(like)
        block = self.block
        return cpu_kernels.csr_row_sums(
            block.indptr, block.indices, *self._scales(), self.start, self.stop
        )

    def structure(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows' entries as local rows and columns (int64, sorted by row)."""
        block = self.block
        lo, hi = self.entries
        cols = block.indices[lo:hi].long()
        counts = torch.diff(block.indptr[self.start : self.stop + 1])
        rows = torch.repeat_interleave(
            torch.arange(self.num_rows, device=cols.device), counts, output_size=hi - lo
        )
        return rows, cols

    def _scales(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The block's scales for the native loops: ``None`` both where they are all
        ones, which the loops then skip (the sum normalisation)."""
        block = self.block
        return (None, None) if block.unit_scales else (block.row_scale, block.col_scale)

    def _runs_natively(self, operand: torch.Tensor) -> bool:
        """Whether the native loops take a product with ``operand``: native kernels on,
        float32 on the CPU."""
        block = self.block
        return self.native and cpu_kernels.usable(operand, block.row_scale, block.col_scale)


def csr_row_chunks(
    block: CSRBlock, chunk_rows: int, count: int, native: bool = False
) -> list[CSRRows]:
    """:class:`CSRRows` of ``block``'s rows ``[k c, (k + 1) c)`` for ``k < count`` (the
    chunks of :func:`row_chunks` on this rank; ``native`` as there), their entry ranges
    read from the device together: one wait for the whole list, none per chunk."""
    local_rows = block.row_stop - block.row_start
    rows = [min(k * chunk_rows, local_rows) for k in range(count + 1)]
    boundaries = torch.arange(count + 1, device=block.indptr.device) * chunk_rows
    entries = block.indptr[boundaries.clamp_(max=local_rows)].tolist()
    return [
        CSRRows(block, rows[k], rows[k + 1], (entries[k], entries[k + 1]), native)
        for k in range(count)
    ]
