"""Full-graph evaluation of the parallel model, for every registered layer type.

The model's layers in evaluation mode, applied to one chunk of a layer's output rows at
a time and multiplying by the resident CSR blocks
(:mod:`~dgl_scalegnn.sampling.full_graph`): the only full-size buffers are a layer's
input and output. The head runs on each chunk of the last layer's output, so the last
hidden matrix is never whole. On one TP rank, where every layout is the whole matrix,
the first layer reads the features themselves (no copy) and applies the input
projection after its aggregation, :math:`(A X) W_{in}`: the projected features are
never whole, and the SpMM reads :math:`d_{in}` columns.

No chunk waits for the device: a chunk's rows and their split are known on the host,
and each layer reads the entry ranges of all its chunks' CSR rows at once (one wait per
layer). A layer only sees the chunk's adjacency rows and the chunk's own input rows
(:meth:`~dgl_scalegnn.model.convs.base.GraphLayer.forward`), so every layer type
evaluates the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from dgl_scalegnn.core.layout import INPUT_LAYOUT, Axis
from dgl_scalegnn.model.convs import GraphLayer
from dgl_scalegnn.model.layers import Head, InputProjection
from dgl_scalegnn.model.scalegnn import ParallelScaleGNN
from dgl_scalegnn.parallel.partition import ShardSpec
from dgl_scalegnn.sampling.full_graph import (
    ChunkMemory,
    FullGraph,
    RowChunk,
    chunk_count,
    chunk_rows_for,
    csr_row_chunks,
    row_chunks,
)

__all__ = ["EVAL_STEP", "full_graph_forward", "full_graph_chunk_rows"]

#: Step key of full-graph evaluation (no dropout, so it only has to be some integer).
EVAL_STEP = -1


@torch.no_grad()
def full_graph_forward(
    model: ParallelScaleGNN, graph: FullGraph, chunk_rows: int | None = None
) -> tuple[torch.Tensor, ShardSpec]:
    """Logits of every vertex of ``graph`` and their spec, layer by layer in chunks of
    ``chunk_rows`` output rows per rank (by default sized for the device:
    :func:`full_graph_chunk_rows`). ``model`` must be in evaluation mode.
    """
    if model.training:
        raise RuntimeError("full-graph evaluation: call model.eval() first")
    if chunk_rows is None:
        chunk_rows = full_graph_chunk_rows(model, graph)
    cfg, grid = model.cfg, model.runtime.grid

    def project(chunk: RowChunk) -> torch.Tensor:
        chunk_spec = ShardSpec(INPUT_LAYOUT, chunk.rows, model.in_features)
        features = graph.features[chunk.start : chunk.stop]
        return model.input_layer(features, chunk_spec, EVAL_STEP)[0]

    one_tp_rank = grid.shape.tp_size == 1
    fold = one_tp_rank and cfg.input_projection and bool(model.layers)
    projected = cfg.input_projection and not fold
    width = cfg.hidden if projected else model.in_features
    spec = ShardSpec(INPUT_LAYOUT.after_linear(), graph.rows, width)
    if one_tp_rank and not projected:
        hidden = graph.features  # every layout is the whole matrix: no copy
    else:
        hidden = _by_row_chunks(model, spec, chunk_rows, graph.features.dtype, project)
    if not model.layers:
        return model.head(hidden, spec)
    projection = model.input_layer if fold else None
    for layer in model.layers:
        head = model.head if layer is model.layers[-1] else None
        # the layer's input is freed once its output is complete
        hidden, spec = _layer(model, graph, layer, hidden, spec, chunk_rows, head, projection)
        projection = None
    return hidden, spec


def full_graph_chunk_rows(model: ParallelScaleGNN, graph: FullGraph) -> int:
    """Output rows per chunk and rank for evaluating ``graph`` on its device
    (:func:`~dgl_scalegnn.sampling.full_graph.chunk_rows_for`, with the
    :class:`~dgl_scalegnn.sampling.full_graph.ChunkMemory` of the model's widths and the
    graph's entries per row)."""
    grid = model.runtime.grid
    entries_per_row, entry_bytes = max(
        (
            (
                block.nnz / max(1, block.row_stop - block.row_start),
                block.indices.element_size() + block.values.element_size(),
            )
            for block in graph.blocks.values()
        ),
        default=(0.0, 0),
    )
    shape = grid.shape
    ranges = (graph.rows.range(axis, grid.coords.along(axis)) for axis in Axis)
    narrowest_split = min(shape.size(axis) for axis in Axis)  # columns split along one
    widths = (model.in_features, model.cfg.hidden, model.num_classes)
    memory = ChunkMemory.of(
        widest_cols=max(math.ceil(width / narrowest_split) for width in widths),
        local_rows=max(stop - start for start, stop in ranges),
        entries_per_row=entries_per_row,
        element_bytes=graph.features.element_size(),
        entry_bytes=entry_bytes,
    )
    return chunk_rows_for(graph.features.device, shape.tp_size, memory)


def _layer(
    model: ParallelScaleGNN,
    graph: FullGraph,
    layer: GraphLayer,
    layer_input: torch.Tensor,
    spec: ShardSpec,
    chunk_rows: int,
    head: Head | None,
    projection: InputProjection | None,
) -> tuple[torch.Tensor, ShardSpec]:
    """``layer`` (then ``head``, if given) on the whole graph, one chunk of output rows
    at a time; with ``projection`` the layer input is the projection of ``layer_input``
    (see :meth:`~dgl_scalegnn.model.convs.base.GraphLayer.forward`)."""
    grid = model.runtime.grid
    coords = grid.coords
    layout = spec.layout
    input_start = graph.rows.range(layout.rows, coords.along(layout.rows))[0]
    out_spec = spec.with_layout(layer.kind.output_layout(layout), layer.widths.width_out)
    count = chunk_count(spec.rows.num_nodes, grid.shape.size(out_spec.layout.rows), chunk_rows)
    adjacency_chunks = csr_row_chunks(graph.blocks[layer.plane], chunk_rows, count)

    def compute(chunk: RowChunk) -> torch.Tensor:
        # The SpMM reads every input row; the spec only carries the layout and names the
        # chunk's rows, which the output keeps.
        input_spec = ShardSpec(layout, chunk.rows, spec.num_cols)
        own_rows = chunk.rows_of(layer_input, layout.rows, coords, input_start)
        adjacency = adjacency_chunks[chunk.index]
        out, out_spec = layer(layer_input, input_spec, adjacency, EVAL_STEP, own_rows, projection)
        return out if head is None else head(out, out_spec)[0]

    if head is not None:  # rows stay, classes along the head's output columns
        out_spec = out_spec.with_layout(out_spec.layout.after_linear(), head.num_classes)
    return _by_row_chunks(model, out_spec, chunk_rows, layer_input.dtype, compute), out_spec


def _by_row_chunks(
    model: ParallelScaleGNN,
    spec: ShardSpec,
    chunk_rows: int,
    dtype: torch.dtype,
    compute: Callable[[RowChunk], torch.Tensor],
) -> torch.Tensor:
    """The local shard of the full-graph matrix ``spec``, filled chunk by chunk."""
    grid = model.runtime.grid
    device = spec.rows.vertex_ids.device
    out = torch.empty(spec.local_shape(grid.shape, grid.coords), dtype=dtype, device=device)
    axis = spec.layout.rows
    for chunk in row_chunks(spec.rows.num_nodes, axis, grid.shape, grid.coords, chunk_rows, device):
        out[chunk.start : chunk.stop] = compute(chunk)
    return out
