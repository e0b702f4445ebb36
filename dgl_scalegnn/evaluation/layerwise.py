"""Layer-wise full-graph evaluation of the parallel model, for every layer type.

The model's layers in evaluation mode, applied to one chunk of a layer's output rows at
a time and multiplying by the resident CSR blocks
(:mod:`~dgl_scalegnn.evaluation.chunks`): the only full-size buffers are a layer's
input and output. The head runs on each chunk of the last layer's output, so the last
hidden matrix is never whole. On one TP rank, where every layout is the whole matrix,
the first layer reads the features themselves (no copy) and applies the input
projection after its aggregation, :math:`(A X) W_{in}`: the projected features are
never whole, and the SpMM reads :math:`d_{in}` columns. There, too, a layer that narrows
(:meth:`~dgl_scalegnn.model.convs.base.GraphLayer.narrows_first`) aggregates its input
times its weights, a narrower matrix: the layer before multiplies each chunk of its
output by those weights as it is made (so that output is never whole, and the product
reads it from the cache); a first layer multiplies its whole input once and frees it.

No chunk waits for the device: a chunk's rows and their split are known on the host,
and each layer reads the entry ranges of all its chunks' CSR rows at once (one wait per
layer). A layer only sees the chunk's adjacency rows and, in an
:class:`~dgl_scalegnn.model.convs.base.EvaluationRows`, the chunk's own input rows, so
every layer type evaluates the same way. An evaluation that wants only the accuracy counts
(:func:`full_graph_counts`) counts each chunk of logits as the last layer makes it:
the logits matrix is never whole either.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from dgl_scalegnn.core.layout import INPUT_LAYOUT
from dgl_scalegnn.distributed.comm import all_reduce
from dgl_scalegnn.evaluation.buffer_plan import Matrix
from dgl_scalegnn.evaluation.chunks import (
    CSRRows,
    RowChunk,
    chunk_count,
    csr_row_chunks,
    row_chunks,
)
from dgl_scalegnn.evaluation.memory import (
    agreed_chunk_rows,
    buffer_plan,
    scratch_bytes,
    stream_rows,
)
from dgl_scalegnn.evaluation.scratch import ScratchDir, ScratchMatrix
from dgl_scalegnn.model.convs import GraphLayer
from dgl_scalegnn.model.convs.base import EvaluationRows, LayerInput
from dgl_scalegnn.model.layers import Head, InputProjection
from dgl_scalegnn.model.objective import Objective, split_counts
from dgl_scalegnn.model.scalegnn import ParallelScaleGNN
from dgl_scalegnn.parallel.partition import ShardSpec
from dgl_scalegnn.sampling.store import FullGraph

__all__ = ["EVAL_STEP", "full_graph_forward", "full_graph_counts", "streams"]

#: Step key of full-graph evaluation (no dropout, so it only has to be some integer).
EVAL_STEP = -1

#: What receives each chunk of logits where they are counted instead of kept: the
#: chunk, its logits and their spec (the chunk's rows).
ChunkSink = Callable[[RowChunk, torch.Tensor, ShardSpec], None]


@torch.no_grad()
def full_graph_forward(
    model: ParallelScaleGNN,
    graph: FullGraph,
    chunk_rows: int | None = None,
    scratch: Path | None = None,
) -> tuple[torch.Tensor, ShardSpec]:
    """Logits of every vertex of ``graph`` and their spec, layer by layer in chunks of
    ``chunk_rows`` output rows per rank (by default sized for the devices and agreed by
    every rank: :func:`agreed_chunk_rows`, a collective); the SpMMs on the native CPU
    loop where the model's native kernels are on
    (:class:`~dgl_scalegnn.evaluation.chunks.CSRRows`). With ``scratch`` (a directory;
    a model that :func:`streams`), the whole-graph matrices below the logits are kept
    in files there (:class:`~dgl_scalegnn.evaluation.scratch.ScratchDir`), not in memory.
    ``model`` must be in evaluation mode.
    """
    logits, spec = _forward_in(model, graph, chunk_rows, None, scratch)
    assert logits is not None  # no sink: the logits are kept
    return logits, spec


@torch.no_grad()
def full_graph_counts(
    model: ParallelScaleGNN,
    graph: FullGraph,
    objective: Objective,
    chunk_rows: int | None = None,
    scratch: Path | None = None,
) -> dict[str, tuple[float, float]]:
    """Per split, (correct, total) over every vertex of ``graph`` (micro-F1 terms if
    multi-label; :meth:`~dgl_scalegnn.model.objective.Objective.counts`), summed over the
    grid: :func:`full_graph_forward`'s logits (with ``scratch`` as there), each chunk
    counted as the last layer makes it, so that they are never whole (on the
    products-like 1M graph, 47 classes: a 188 MB matrix, whose first touch took
    0.02-0.25 s a round). The chunks' counts add up on the device and are read back
    once, after the last chunk.
    """
    if not model.layers:  # the head alone: its logits are no larger than its input
        logits, spec = full_graph_forward(model, graph, chunk_rows)
        return objective.counts(logits, spec, graph)
    splits = sorted(graph.masks)
    total = torch.zeros(len(splits), 2, dtype=torch.float64, device=graph.features.device)

    def count(chunk: RowChunk, logits: torch.Tensor, spec: ShardSpec) -> None:
        nonlocal total
        rows = slice(chunk.start, chunk.stop)
        part = FullGraph(
            rows=chunk.rows,
            blocks={},
            features=graph.features[:0],
            labels=graph.labels[rows],
            masks={split: mask[rows] for split, mask in graph.masks.items()},
        )
        total = total + objective.count_tensor(logits, spec, part, splits)

    _forward_in(model, graph, chunk_rows, count, scratch)
    runtime = model.runtime
    # each replica counted its own chunks (_by_row_chunks)
    summed = all_reduce(total, runtime.grid.dp_group, runtime.profiler, component="dp_allreduce")
    return split_counts(splits, summed)


def streams(model: ParallelScaleGNN) -> bool:
    """Whether ``model`` can be evaluated with its whole-graph matrices in scratch files:
    graph layers whose every product is of the adjacency with the layer input (no layer
    aggregates a narrowed input: GAT's :math:`A (X W)`, or a narrowing layer on one TP
    rank, where the matrices are the narrowed ones) and a first input that the
    evaluation makes (on one TP rank the layers read the features in place)."""
    plan = buffer_plan(model)
    return bool(model.layers) and plan.owned and all(m is None for m in plan.narrowed)


def _forward_in(
    model: ParallelScaleGNN,
    graph: FullGraph,
    chunk_rows: int | None,
    sink: ChunkSink | None,
    scratch: Path | None,
) -> tuple[torch.Tensor | None, ShardSpec]:
    """:func:`_forward`, with ``scratch`` in a :class:`ScratchDir` there (collective)."""
    if model.training:
        raise RuntimeError("full-graph evaluation: call model.eval() first")
    if chunk_rows is None:
        chunk_rows = agreed_chunk_rows(model, graph)
    if scratch is None:
        return _forward(model, graph, chunk_rows, sink, None)
    if not streams(model):
        raise ValueError("full-graph evaluation: this model's matrices cannot be streamed")
    alone, shared = scratch_bytes(model, graph)
    with ScratchDir(scratch, alone, shared, model.runtime, graph.features.device) as directory:
        return _forward(model, graph, chunk_rows, sink, directory)


def _forward(
    model: ParallelScaleGNN,
    graph: FullGraph,
    chunk_rows: int,
    sink: ChunkSink | None,
    scratch: ScratchDir | None,
) -> tuple[torch.Tensor | None, ShardSpec]:
    """:func:`full_graph_forward`, or with ``sink`` each chunk of logits given to it
    instead of kept (``None`` for the logits then); with ``scratch``, the matrices below
    the logits in its files."""
    plan = buffer_plan(model)

    def spec_of(matrix: Matrix) -> ShardSpec:
        return ShardSpec(matrix.layout, graph.rows, matrix.width)

    spec = spec_of(plan.first)

    def project(chunk: RowChunk) -> torch.Tensor:
        chunk_spec = ShardSpec(INPUT_LAYOUT, chunk.rows, model.in_features)
        features = graph.features[chunk.start : chunk.stop]
        return model.input_layer(features, chunk_spec, EVAL_STEP)[0]

    hidden: torch.Tensor | ScratchMatrix | None
    if plan.owned:
        made = _Made(graph.features.dtype, scratch=scratch, name="input")
        hidden = _by_row_chunks(model, spec, chunk_rows, made, project)
    else:
        hidden = graph.features  # every layout is the whole matrix: no copy
    if not model.layers:  # full_graph_counts gives no sink here
        return model.head(hidden, spec)
    projection = model.input_layer if plan.fold else None
    for index, (layer, output) in enumerate(zip(model.layers, plan.outputs)):
        last = index == len(model.layers) - 1
        head = model.head if last else None
        out_spec = spec_of(output)
        # a narrowing layer after the first gets its narrowed input from the layer before
        given_narrowed = index > 0 and plan.narrowed[index] is not None
        then_matrix = None if last else plan.narrowed[index + 1]
        then = None if then_matrix is None else model.layers[index + 1]
        made_spec = out_spec if then_matrix is None else spec_of(then_matrix)
        made = _Made(
            graph.features.dtype,
            sink if last else None,
            None if last else scratch,
            f"layer{index}",
        )
        # _layer takes the only reference: the input is freed once the output is
        # complete, or once narrowed
        taken = [hidden]
        del hidden
        hidden = _layer(
            model,
            graph,
            _Pass(layer, spec, out_spec, given_narrowed, head, projection, then),
            taken,
            made_spec,
            chunk_rows,
            made,
        )
        spec, projection = out_spec, None
    assert not isinstance(hidden, ScratchMatrix)  # the logits are never in scratch
    return hidden, spec


@dataclass(frozen=True)
class _Pass:
    """One layer of a chunked evaluation: ``layer`` from its input in ``spec`` to its
    output in ``out_spec``; ``given_narrowed``: the input is already the layer's
    narrowed input (:meth:`~dgl_scalegnn.model.convs.base.GraphLayer.narrowed_input`,
    made by the layer before); then ``head`` on each output chunk, or ``then``'s
    narrowing (the next layer's narrowed input, made chunk by chunk, so the output is
    never whole); ``projection`` as in
    :meth:`~dgl_scalegnn.model.convs.base.GraphLayer.forward`."""

    layer: GraphLayer
    spec: ShardSpec
    out_spec: ShardSpec
    given_narrowed: bool
    head: Head | None
    projection: InputProjection | None
    then: GraphLayer | None


@dataclass(frozen=True)
class _Made:
    """Where the chunks of a whole-graph matrix go: a matrix of ``dtype`` in memory, each
    chunk into ``sink`` instead, or a file of ``scratch`` named ``name``."""

    dtype: torch.dtype
    sink: ChunkSink | None = None
    scratch: ScratchDir | None = None
    name: str = ""


def _layer(
    model: ParallelScaleGNN,
    graph: FullGraph,
    layer_pass: _Pass,
    taken: list[torch.Tensor | ScratchMatrix],
    made_spec: ShardSpec,
    chunk_rows: int,
    made: _Made,
) -> torch.Tensor | ScratchMatrix | None:
    """``layer_pass`` on the whole graph, one chunk of output rows at a time, into a matrix of
    ``made_spec`` (the layer's output, the head's logits, or the next layer's narrowed
    input), made as ``made`` says, from the layer input that ``taken`` holds (the list is
    emptied, so that the input is freed here). A layer that narrows reads only its
    narrowed input, which takes the input's place. An input in a scratch file is
    streamed (:class:`_StreamedProducts`)."""
    grid = model.runtime.grid
    coords = grid.coords
    layer, spec, projection = layer_pass.layer, layer_pass.spec, layer_pass.projection
    layout = spec.layout
    input_start = graph.rows.range(layout.rows, coords.along(layout.rows))[0]
    count = chunk_count(
        spec.rows.num_nodes, grid.shape.size(layer_pass.out_spec.layout.rows), chunk_rows
    )
    native = model.layer_tail.native  # the model's one switch for its native kernels
    adjacency_chunks = csr_row_chunks(graph.blocks[layer.plane], chunk_rows, count, native)
    layer_input = taken.pop()
    streamed: _StreamedProducts | None = None
    narrowed = None
    if isinstance(layer_input, ScratchMatrix):
        streamed = _StreamedProducts(layer_input, adjacency_chunks, chunk_rows)
    elif layer_pass.given_narrowed:
        narrowed = layer_input
    else:
        narrowed = layer.narrowed_input(layer_input, spec, projection)  # once for every chunk
        if narrowed is not None:
            layer_input = narrowed  # the input is freed here

    def compute(chunk: RowChunk) -> torch.Tensor:
        # The SpMM reads every input row; the spec only carries the layout and names the
        # chunk's rows, which the output keeps.
        input_spec = ShardSpec(layout, chunk.rows, spec.num_cols)
        adjacency = adjacency_chunks[chunk.index]
        if streamed is not None:
            own = streamed.source.read_runs(chunk.local_runs(layout.rows, coords, input_start))
            x = streamed.placeholder
            adjacency = streamed.of(chunk)
        else:
            own = chunk.rows_of(layer_input, layout.rows, coords, input_start)
            x = None if narrowed is not None else layer_input  # the narrowed input replaces it
        rows = EvaluationRows(own, projection, narrowed)
        out, layer_spec = layer(LayerInput(x, input_spec, adjacency, rows), EVAL_STEP)
        if layer_pass.head is not None:
            return layer_pass.head(out, layer_spec)[0]
        if layer_pass.then is not None:  # narrowed while the chunk is in the cache
            return layer_pass.then.narrowed_input(out, layer_spec, None)
        return out

    group = 1 if streamed is None else streamed.block_chunks
    out = _by_row_chunks(model, made_spec, chunk_rows, made, compute, group)
    if streamed is not None and made.scratch is not None:
        made.scratch.release(streamed.source)
    return out


class _Aggregated:
    """The local product of a chunk's adjacency rows ``rows`` with the layer input, made
    apart (:class:`_StreamedProducts`): the
    :class:`~dgl_scalegnn.parallel.spmm.LocalSpMM` a layer is handed with the input's
    ``placeholder``, whose :meth:`matmul` gives ``product``; the row sums and the
    structure are the rows' own."""

    def __init__(self, rows: CSRRows, product: torch.Tensor, placeholder: torch.Tensor) -> None:
        self.rows, self.product, self.placeholder = rows, product, placeholder
        self.num_rows, self.num_cols = rows.num_rows, rows.num_cols

    def matmul(self, features: torch.Tensor) -> torch.Tensor:
        if features is not self.placeholder:
            raise RuntimeError("a streamed evaluation multiplies its adjacency by its input only")
        return self.product

    def row_sums(self, like: torch.Tensor) -> torch.Tensor:
        return self.rows.row_sums(like)

    def structure(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rows.structure()


class _StreamedProducts:
    """The local products :math:`\\tilde A[R_k, :] X` of a layer's chunks whose input
    shard :math:`X` is the scratch file ``source``, a block of :attr:`block_chunks`
    consecutive chunks at a time.

    A block's products are made together (:meth:`CSRRows.matmul_pieces` over the block's
    rows): the input is read once per block, a piece of
    :func:`~dgl_scalegnn.evaluation.memory.stream_rows` rows at a time, and each row's
    entries in the piece's columns are added to its sum. So a rank holds a block of
    products and a piece of the input, never the input; the fewer the blocks (the larger
    the block's buffer), the fewer times the file is read.
    """

    def __init__(self, source: ScratchMatrix, adjacency: list[CSRRows], chunk_rows: int) -> None:
        self.source, self.adjacency = source, adjacency
        self.piece_rows, block_rows = stream_rows(source.row_bytes)
        self.block_chunks = max(1, block_rows // chunk_rows)
        self.placeholder = source.placeholder()
        self._block: int | None = None
        self._products: list[torch.Tensor] = []

    def of(self, chunk: RowChunk) -> _Aggregated:
        """The product of ``chunk``'s adjacency rows with the input, as a local SpMM."""
        block = chunk.index // self.block_chunks
        if block != self._block:
            self._products = []  # the block before is freed first
            self._products = self._block_products(block)
            self._block = block
        rows = self.adjacency[chunk.index]
        return _Aggregated(rows, self._products[chunk.index % self.block_chunks], self.placeholder)

    def _block_products(self, block: int) -> list[torch.Tensor]:
        first = block * self.block_chunks
        chunks = self.adjacency[first : first + self.block_chunks]
        start, stop = chunks[0].start, chunks[-1].stop
        entries = (chunks[0].entries[0], chunks[-1].entries[1])
        span = CSRRows(chunks[0].block, start, stop, entries, chunks[0].native)
        source = self.source
        pieces = (
            (lo, source.read(lo, min(source.rows, lo + self.piece_rows)))
            for lo in range(0, source.rows, self.piece_rows)
        )
        product = span.matmul_pieces(pieces, source.dtype)
        return [product[rows.start - start : rows.stop - start] for rows in chunks]


def _by_row_chunks(
    model: ParallelScaleGNN,
    spec: ShardSpec,
    chunk_rows: int,
    made: _Made,
    compute: Callable[[RowChunk], torch.Tensor],
    group: int = 1,
) -> torch.Tensor | ScratchMatrix | None:
    """The local shard of the full-graph matrix ``spec``, filled chunk by chunk; with
    ``made.sink``, each chunk and its spec given to it instead (then ``None``); with
    ``made.scratch``, a file of it (:class:`ScratchMatrix`).

    The data-parallel replicas hold the same shard: each computes every ``Gd``-th
    ``group`` of consecutive chunks (from its own index, so that high-degree rows spread
    over the replicas) into zeros, and one all-reduce over the replicas completes the
    shard on each. Adding zeros is exact, so every grid still computes what one process
    computes. A sink sees only its replica's chunks; a file is written by each replica's
    chunks where the replicas share it, else by every chunk of each.
    """
    runtime = model.runtime
    grid, replicas = runtime.grid, runtime.grid.dp_group
    device = spec.rows.vertex_ids.device
    axis = spec.layout.rows
    chunks = row_chunks(spec.rows.num_nodes, axis, grid.shape, grid.coords, chunk_rows, device)
    share = made.scratch is None or made.scratch.shared
    mine = (
        chunk
        for chunk in chunks
        if not share or chunk.index // group % replicas.size == replicas.index
    )
    if made.sink is not None:
        for chunk in mine:
            made.sink(chunk, compute(chunk), ShardSpec(spec.layout, chunk.rows, spec.num_cols))
        return None
    shape = spec.local_shape(grid.shape, grid.coords)
    if made.scratch is not None:
        first_replica = grid.coords.along(spec.layout.rep) == 0
        matrix = made.scratch.matrix(made.name, spec.layout, shape, made.dtype, first_replica)
        for chunk in mine:
            matrix.write(chunk.start, compute(chunk))
        made.scratch.complete(matrix)
        return matrix
    zeros = replicas.size > 1
    out = (torch.zeros if zeros else torch.empty)(shape, dtype=made.dtype, device=device)
    for chunk in mine:
        out[chunk.start : chunk.stop] = compute(chunk)
    return all_reduce(out, replicas, runtime.profiler, component="dp_allreduce")
