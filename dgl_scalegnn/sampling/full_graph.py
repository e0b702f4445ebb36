"""Full-graph evaluation, layer by layer in row chunks, straight from the resident CSR.

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
waits for the device; on a GPU the chunk rows come from its free memory
(:func:`chunk_rows_for`), at most the rows a rank holds of a layer's matrix
(:func:`largest_part_rows`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise

import torch

from dgl_scalegnn.core.grid_shape import Coords, GridShape
from dgl_scalegnn.core.layout import Axis, Plane, split_bounds
from dgl_scalegnn.parallel import cpu_kernels
from dgl_scalegnn.parallel.partition import RowPartition
from dgl_scalegnn.parallel.spmm import RowSumsByProduct, csr_tensor
from dgl_scalegnn.sampling.blocks import CSRBlock

__all__ = [
    "FullGraph",
    "RowChunk",
    "CSRRows",
    "row_chunks",
    "chunk_count",
    "csr_row_chunks",
    "DEFAULT_CHUNK_ROWS",
    "ONE_RANK_CHUNK_ROWS",
    "MIN_CHUNK_ROWS",
    "FREE_MEMORY_SHARE",
    "CHUNK_TEMPORARIES",
    "csr_copy_entry_bytes",
    "largest_part_rows",
    "ChunkMemory",
    "buffer_peak",
    "default_chunk_rows",
    "chunk_rows_for",
]

#: Output rows per chunk, shared out among the ranks of a TP grid: 64Ki rows of width 128
#: are 32 MB of float32.
DEFAULT_CHUNK_ROWS = 65536
#: Output rows per chunk on one TP rank, where a chunk costs no collective, only its
#: temporaries (:data:`CHUNK_TEMPORARIES` matrices of the chunk's rows: 32Ki rows of
#: width 128 are 16 MB of float32 each).
#: Sparse 1M graph on one process, three rounds each: 65536 rows peaked at 1,474 MB,
#: 32768 at 1,325 MB, 8192 at 1,259 MB, all in 1.29-1.33 s a round; sparse 10M, second
#: rounds: 17.3 s with 65536 rows, 18.0 s with 32768, 19.3 s with 8192.
ONE_RANK_CHUNK_ROWS = 32768
#: The fewest output rows per chunk and rank, however little memory is free.
MIN_CHUNK_ROWS = 1024
#: Share of an accelerator's free memory that one chunk's temporaries may take.
FREE_MEMORY_SHARE = 0.5
#: A chunk's temporaries per output row, in rows of the widest matrix: the SpMM's and the
#: linear's outputs, the tail's output, the residual's rows and their redistribution
#: (sent and received), an all-reduce's wire copy, the head's input.
CHUNK_TEMPORARIES = 8


def default_chunk_rows(tp_size: int) -> int:
    """Output rows per chunk and rank on ``tp_size`` tensor-parallel ranks of CPUs:
    :data:`ONE_RANK_CHUNK_ROWS` on one, else :data:`DEFAULT_CHUNK_ROWS` shared out among
    half as many ranks (at least :data:`MIN_CHUNK_ROWS`, at most
    :data:`DEFAULT_CHUNK_ROWS`).

    A rank's share of the graph shrinks with ``tp_size`` but its fixed cost (the
    interpreter, torch and DGL: about 384 MB) does not, so the chunk's temporaries shrink
    too; but every chunk costs each layer three or four collectives, whose latency
    dominates on many ranks. On 1x2x2x2 with the 1M sparse graph (two rounds each, two
    runs): 8192 rows per rank evaluated in 8.1-9.9 s with peaks of 808-845 MB a rank,
    16384 in 7.0-9.0 s with 824-880 MB, 32768 in 6.9-8.3 s with 862-932 MB.

    >>> default_chunk_rows(1), default_chunk_rows(8), default_chunk_rows(512)
    (32768, 16384, 1024)
    """
    if tp_size == 1:
        return ONE_RANK_CHUNK_ROWS
    return min(DEFAULT_CHUNK_ROWS, max(MIN_CHUNK_ROWS, 2 * DEFAULT_CHUNK_ROWS // tp_size))


def csr_copy_entry_bytes(index_bytes: int = 4, value_bytes: int = 4) -> int:
    """Bytes per entry that a chunk's CSR rows hold at once while :meth:`CSRRows.matmul`
    builds their CSR off the native loop: the copy of the column indices and each entry's
    row (``index_bytes`` each), the two scales gathered for it and their product, its
    value (``value_bytes`` each). The native loop copies nothing.

    >>> csr_copy_entry_bytes()  # int32 indices, float32 values
    20
    """
    return 2 * index_bytes + 3 * value_bytes


def largest_part_rows(num_nodes: int, shape: GridShape) -> int:
    """The most rows one rank holds of a full-graph matrix whose rows are split along any
    axis of ``shape`` (:func:`chunk_count`'s largest part): no chunk needs more rows a
    rank, however much memory is free.

    >>> largest_part_rows(6000, GridShape(1, 1, 1, 2)), largest_part_rows(7, GridShape(1, 2, 2, 2))
    (6000, 4)
    """
    return max(1, math.ceil(num_nodes / min(shape.size(axis) for axis in Axis)))


@dataclass(frozen=True)
class ChunkMemory:
    """What an evaluation's chunks take on one rank: ``row_bytes`` per output row of a
    chunk, and ``reserved_bytes`` of whole-graph buffers beside them."""

    row_bytes: float
    reserved_bytes: float

    @classmethod
    def of(
        cls,
        widest_cols: int,
        entries_per_row: float,
        reserved_bytes: float,
        element_bytes: int = 4,
        entry_bytes: int | None = None,
    ) -> ChunkMemory:
        """A chunk's temporaries: :data:`CHUNK_TEMPORARIES` rows of the widest local shard
        (``widest_cols`` of the features', hidden or classes' columns on this rank) per
        output row, plus what its CSR rows' entries take while their CSR is built
        (``entry_bytes`` each; by default :func:`csr_copy_entry_bytes` of int32 indices and
        float32 values); set aside: ``reserved_bytes`` of whole-graph matrices (a layer's
        input and output, :func:`buffer_peak`, and the ids of every vertex).

        >>> ChunkMemory.of(widest_cols=128, entries_per_row=10.0, reserved_bytes=1024000)
        ChunkMemory(row_bytes=4296.0, reserved_bytes=1024000)
        """
        if entry_bytes is None:
            entry_bytes = csr_copy_entry_bytes()
        row_bytes = CHUNK_TEMPORARIES * widest_cols * element_bytes + entries_per_row * entry_bytes
        return cls(row_bytes, reserved_bytes)

    def rows_within(self, free_bytes: float) -> int:
        """Rows per chunk whose temporaries fit :data:`FREE_MEMORY_SHARE` of what
        ``free_bytes`` leaves once the reserved buffers are set aside (the rest is
        headroom: the allocator's rounding, the collectives' buffers); at least
        :data:`MIN_CHUNK_ROWS`.

        >>> ChunkMemory(row_bytes=4096.0, reserved_bytes=2**29).rows_within(2**30)
        65536
        """
        budget = FREE_MEMORY_SHARE * (free_bytes - self.reserved_bytes)
        return max(MIN_CHUNK_ROWS, int(budget // self.row_bytes))


def buffer_peak(sizes: Sequence[float], input_owned: bool, narrowed: Sequence[float] = ()) -> float:
    """Peak bytes of the whole-graph matrices of a layer-wise forward, whose ``sizes`` are
    the first layer's input then each layer's output: a layer holds its input and its
    output at once (the input is freed when the output is complete). A layer that
    aggregates its input times its weights (``narrowed``, per layer; none by default)
    takes that product in its input's place: the layer before makes it, narrowing each
    chunk of its output as it is made, so that output is never whole. The first layer
    narrows its input itself: it holds its input and the product, then frees the input
    and holds the product and its output. The first input counts only where the forward
    made it (``input_owned``), not where it reads the features in place.

    >>> buffer_peak([100, 40, 8], input_owned=True), buffer_peak([100, 40, 8], input_owned=False)
    (140, 48)
    >>> buffer_peak([100, 8], input_owned=False)  # one layer
    8
    >>> buffer_peak([100, 40, 30], input_owned=False, narrowed=[0, 10])  # 40 never whole
    40
    >>> buffer_peak([100, 40, 30], input_owned=True, narrowed=[10, 0])  # 10 + 100, 40 + 30
    110
    """
    narrowed = [*narrowed, *[0] * (len(sizes) - 1 - len(narrowed))]
    # what each layer takes: its input, or a narrowing layer's product in its place
    taken = [sizes[0] if input_owned else 0]
    taken += [product or size for product, size in zip(narrowed[1:], sizes[1:-1])]
    made = [*taken[1:], sizes[-1]]
    first = narrowed[0] + max(taken[0], made[0]) if narrowed[0] else taken[0] + made[0]
    return max([first, *(given + output for given, output in zip(taken[1:], made[1:]))])


def chunk_rows_for(device: torch.device | str, tp_size: int, memory: ChunkMemory) -> int:
    """Output rows per chunk and rank for an evaluation on ``device``.

    On CUDA, as many as fit the device's free memory (:meth:`ChunkMemory.rows_within`):
    the driver's (``torch.cuda.mem_get_info``) and what torch's caching allocator holds
    unused (the last training step's blocks, say). A GPU holds little besides the rank's
    share, and each chunk costs every layer three or four collectives: few large chunks.
    Elsewhere :func:`default_chunk_rows`.

    >>> chunk_rows_for("cpu", tp_size=8, memory=ChunkMemory(4096.0, 0.0))
    16384
    """
    device = torch.device(device)
    if device.type != "cuda":
        return default_chunk_rows(tp_size)
    free_bytes, _ = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return memory.rows_within(free_bytes + cached)


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
        pieces = _vertices_at(self.ranges, first, last)
        if len(pieces) <= 1:
            start = pieces[0][0] - range_start if pieces else 0
            return matrix[start : start + last - first]
        return matrix.index_select(0, self.rows.vertex_ids[first:last] - range_start)


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
