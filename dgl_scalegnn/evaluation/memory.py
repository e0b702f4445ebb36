"""What a layer-wise evaluation holds on a rank, and how many rows a chunk takes.

The whole-graph matrices of the :class:`~dgl_scalegnn.evaluation.buffer_plan.BufferPlan`
(:func:`buffer_peak`) are set aside; what is left bounds one chunk's temporaries
(:class:`ChunkMemory`). On a CPU a chunk has a fixed number of rows
(:func:`default_chunk_rows`), on a GPU as many as its free memory holds
(:func:`chunk_rows_for`), at most the rows a rank holds of a layer's matrix
(:func:`largest_part_rows`); every rank then runs the fewest any rank has room for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import pairwise

import torch
import torch.distributed as dist

from dgl_scalegnn.core.grid_shape import GridShape
from dgl_scalegnn.core.layout import Axis
from dgl_scalegnn.distributed.comm import agree_on
from dgl_scalegnn.evaluation.buffer_plan import BufferPlan, Matrix
from dgl_scalegnn.model.scalegnn import ParallelScaleGNN
from dgl_scalegnn.parallel.partition import ShardSpec
from dgl_scalegnn.sampling.store import FullGraph

__all__ = [
    "DEFAULT_CHUNK_ROWS",
    "ONE_RANK_CHUNK_ROWS",
    "MIN_CHUNK_ROWS",
    "FREE_MEMORY_SHARE",
    "CHUNK_TEMPORARIES",
    "csr_copy_entry_bytes",
    "largest_part_rows",
    "ChunkMemory",
    "default_chunk_rows",
    "chunk_rows_for",
    "buffer_plan",
    "widest_local_cols",
    "full_graph_buffer_bytes",
    "full_graph_memory",
    "full_graph_chunk_rows",
    "agreed_chunk_rows",
    "STREAM_PIECE_BYTES",
    "STREAM_BLOCK_BYTES",
    "stream_rows",
    "scratch_bytes",
    "streamed_memory",
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
#: Bytes of the two buffers of a streamed evaluation's layer
#: (:class:`~dgl_scalegnn.evaluation.layerwise._StreamedProducts`): a piece of the layer
#: input read from its file, and a block of chunks' products. Each block reads the whole
#: file once, so the block takes the larger share; each piece costs a pass over the
#: block's rows. Sparse 10M graph, 1x2x2x2 (5M rows of 256 bytes a rank): 20 pieces,
#: 7 blocks a layer.
STREAM_PIECE_BYTES = 1 << 26
STREAM_BLOCK_BYTES = 3 << 26
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
    axis of ``shape`` (the largest part of
    :func:`~dgl_scalegnn.evaluation.chunks.chunk_count`): no chunk needs more rows a rank,
    however much memory is free.

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


def full_graph_buffer_bytes(model: ParallelScaleGNN, graph: FullGraph) -> int:
    """Peak bytes of the whole-graph matrices a layer-wise evaluation holds on this rank
    at once (:meth:`~dgl_scalegnn.evaluation.buffer_plan.BufferPlan.peak_bytes`): a
    layer's input and output (and its narrowed input), beside the features and the
    adjacency the rank keeps anyway."""
    grid = model.runtime.grid
    element = graph.features.element_size()

    def size(matrix: Matrix) -> int:
        spec = ShardSpec(matrix.layout, graph.rows, matrix.width)
        return math.prod(spec.local_shape(grid.shape, grid.coords)) * element

    return int(buffer_plan(model).peak_bytes(size))


def buffer_plan(model: ParallelScaleGNN) -> BufferPlan:
    """The :class:`~dgl_scalegnn.evaluation.buffer_plan.BufferPlan` of ``model`` on its grid."""
    return BufferPlan.of(model.cfg, model.in_features, model.num_classes, model.runtime.grid.shape)


def widest_local_cols(shape: GridShape, widths: tuple[int, ...]) -> int:
    """The most columns a rank of ``shape`` holds of a matrix of any of ``widths``
    columns (split along one axis, at worst the one of fewest parts): the width of a
    chunk's temporaries (:meth:`ChunkMemory.of`).

    >>> widest_local_cols(GridShape(1, 2, 2, 2), (64, 128, 8))
    64
    """
    narrowest_split = min(shape.size(axis) for axis in Axis)
    return max(math.ceil(width / narrowest_split) for width in widths)


def full_graph_memory(model: ParallelScaleGNN, graph: FullGraph) -> ChunkMemory:
    """What evaluating ``graph`` takes on this rank: the
    :class:`ChunkMemory` of the model's widths and the
    graph's entries per row (each taking
    :func:`csr_copy_entry_bytes` while a chunk's CSR is
    built), beside the whole-graph matrices (:func:`full_graph_buffer_bytes`) and the ids
    of every vertex (``graph.rows``, made for the evaluation)."""
    entries_per_row, entry_bytes = max(
        (
            (
                block.nnz / max(1, block.row_stop - block.row_start),
                csr_copy_entry_bytes(block.indices.element_size(), block.row_scale.element_size()),
            )
            for block in graph.blocks.values()
        ),
        default=(0.0, 0),
    )
    ids = graph.rows.vertex_ids
    widths = (model.in_features, model.cfg.hidden, model.num_classes)
    return ChunkMemory.of(
        widest_cols=widest_local_cols(model.runtime.grid.shape, widths),
        entries_per_row=entries_per_row,
        reserved_bytes=full_graph_buffer_bytes(model, graph) + ids.numel() * ids.element_size(),
        element_bytes=graph.features.element_size(),
        entry_bytes=entry_bytes,
    )


def full_graph_chunk_rows(
    model: ParallelScaleGNN, graph: FullGraph, memory: ChunkMemory | None = None
) -> int:
    """Output rows per chunk that this rank's device has room for in evaluating ``graph``
    (:func:`chunk_rows_for` with ``memory``, by default
    :func:`full_graph_memory`), at most the rows it holds of a layer's matrix
    (:func:`largest_part_rows`): more would be counted
    in the memory it needs, never used."""
    memory = memory if memory is not None else full_graph_memory(model, graph)
    shape = model.runtime.grid.shape
    room = chunk_rows_for(graph.features.device, shape.tp_size, memory)
    return min(room, largest_part_rows(graph.rows.num_nodes, shape))


def agreed_chunk_rows(
    model: ParallelScaleGNN, graph: FullGraph, memory: ChunkMemory | None = None
) -> int:
    """Output rows per chunk and rank of an evaluation, the same on every rank: the fewest
    of :func:`full_graph_chunk_rows` over the ranks (one all-reduce: every rank must call
    it). Ranks whose devices have different room would otherwise run different chunks:
    their collectives would not match (a hang), and the data-parallel replicas, which
    share the chunks out, would count some rows twice and others never."""
    rows = full_graph_chunk_rows(model, graph, memory)
    return int(agree_on(rows, dist.ReduceOp.MIN, graph.features.device))


def stream_rows(row_bytes: int) -> tuple[int, int]:
    """Rows of ``row_bytes`` each in a piece (:data:`STREAM_PIECE_BYTES`) and in a block
    (:data:`STREAM_BLOCK_BYTES`), at least one each.

    >>> stream_rows(256)
    (262144, 786432)
    """
    row_bytes = max(1, row_bytes)
    return max(1, STREAM_PIECE_BYTES // row_bytes), max(1, STREAM_BLOCK_BYTES // row_bytes)


def _stored_sizes(model: ParallelScaleGNN, graph: FullGraph) -> tuple[list[Matrix], list[int]]:
    """The matrices a streamed evaluation keeps in files (the first input, then each
    layer's output below the last) and their bytes on this rank."""
    grid = model.runtime.grid
    element = graph.features.element_size()
    plan = buffer_plan(model)
    stored = [plan.first, *plan.outputs[:-1]]
    sizes = [
        math.prod(ShardSpec(m.layout, graph.rows, m.width).local_shape(grid.shape, grid.coords))
        * element
        for m in stored
    ]
    return stored, sizes


def scratch_bytes(model: ParallelScaleGNN, graph: FullGraph) -> tuple[int, int]:
    """The most bytes of scratch files a streamed evaluation of ``graph`` holds at once
    for this rank: a layer's input and output (the first layer's input alone where
    there is one layer), ``(alone, shared)``: where each rank writes its own files, and
    this rank's part where the ranks that hold the same shard share one (the first
    replica along the matrix's replicated axis, of the first data-parallel replica,
    counts it)."""
    stored, sizes = _stored_sizes(model, graph)
    coords = model.runtime.grid.coords
    mine = [
        size if coords.along(m.layout.rep) == 0 and coords.d == 0 else 0
        for m, size in zip(stored, sizes)
    ]

    def peak(values: list[int]) -> int:
        return max([values[0], *(a + b for a, b in pairwise(values))])

    return peak(sizes), peak(mine)


def streamed_memory(model: ParallelScaleGNN, graph: FullGraph) -> ChunkMemory:
    """What a streamed evaluation of ``graph`` takes on this rank:
    :func:`full_graph_memory`'s chunk, beside its two stream buffers
    (:data:`STREAM_PIECE_BYTES` and :data:`STREAM_BLOCK_BYTES`; the block's cursors, and
    the index temporaries of a product off the native loop, within) in place of the
    whole-graph matrices, and the ids of every vertex."""
    memory = full_graph_memory(model, graph)
    ids = graph.rows.vertex_ids
    reserved = STREAM_PIECE_BYTES + STREAM_BLOCK_BYTES + ids.numel() * ids.element_size()
    return ChunkMemory(memory.row_bytes, reserved)
