"""Evaluation in neighbourhoods: memory bounded by its pieces, not by the graph.

The layer-wise evaluation (:mod:`~dgl_scalegnn.evaluation.layerwise`) holds a layer's input
and output over every vertex: at 10M vertices on 1x2x2x2 that is 2.6 GB a rank more than
training. Here every rank takes its share of the vertices and computes their logits
from their neighbourhoods (:mod:`~dgl_scalegnn.evaluation.hops`) with a
one-process copy of the model (:func:`one_rank_copy`: the global parameters, gathered
once a round). Layer :math:`l`'s output rows :math:`S` come from its input rows
:math:`I \\supseteq S`,

.. math::

    X_{h,l}[S] = \\mathrm{layer}_l\\big(\\hat A[S, I],\\ X_{h,l-1}[I]\\big),
    \\qquad O[S] = \\mathrm{head}(X_{h,L}[S]),

recursively down to the features, in pieces of at most :data:`PIECE_ENTRIES` adjacency
entries at every depth; the input projection is folded after the first aggregation,
:math:`(\\hat A X) W_{in} + (\\hat A 1) b_{in}`, as on one TP rank of the layer-wise
evaluation. The logits are the layer-wise evaluation's (the same products, summed in
another order).

The price is recomputation: a vertex's hidden rows are computed again for every piece
whose neighbourhood holds it, and a vertex of degree :math:`d` costs :math:`d` entries
each time. On power-law graphs the few vertices of highest degree are in almost every
neighbourhood, so their hidden rows below the last layer are computed once a round and
kept (:class:`NeighbourhoodEvaluator`: the :data:`HUB_CACHE_BYTES` of rows of the
highest degrees); everything else a piece holds is bounded by its entries.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from dgl_scalegnn.core.layout import INPUT_LAYOUT, split_bounds
from dgl_scalegnn.data.prepared import PreparedGraph
from dgl_scalegnn.distributed.comm import Runtime, reduce_over_world
from dgl_scalegnn.evaluation.chunks import CSRRows, chunk_count
from dgl_scalegnn.evaluation.hops import hop, hubs, pieces, read_vertex_rows
from dgl_scalegnn.evaluation.layerwise import EVAL_STEP
from dgl_scalegnn.heap import release_free_heap
from dgl_scalegnn.model.convs.base import EvaluationRows, LayerInput
from dgl_scalegnn.model.objective import Objective, split_counts
from dgl_scalegnn.model.scalegnn import ParallelScaleGNN
from dgl_scalegnn.model.stack import layer_kind
from dgl_scalegnn.parallel.partition import RowPartition, ShardSpec
from dgl_scalegnn.sampling.store import FullGraph

__all__ = [
    "PIECE_ENTRIES",
    "COUNT_CHUNK_ROWS",
    "SPLITS",
    "HUB_CACHE_BYTES",
    "one_rank_copy",
    "NeighbourhoodEvaluator",
    "neighbourhood_counts",
]

#: Adjacency entries of a piece at every depth of the recursion: its input rows are at
#: most as many (64Ki rows of width 128 are 32 MiB of float32). At 10M vertices on
#: 1x2x2x2, pieces of 128Ki entries (chunks of 64Ki vertices, no heap given back between
#: chunks) took ranks from 1,552-1,829 MiB after training to 1,692-2,181 MiB; pieces of
#: 32Ki entries cost a third more time a vertex.
PIECE_ENTRIES = 65536
#: Vertices whose logits are computed (and counted) together.
COUNT_CHUNK_ROWS = 16384
#: The splits counted, in the order of :meth:`NeighbourhoodEvaluator.count_tensor`.
SPLITS = ("train", "val", "test")
#: What the kept hidden rows of the highest-degree vertices may take: on the sparse 10M
#: graph (hidden 128, two layers) the 128,159 vertices of degree 63 and more (the 62s
#: would not all fit), which hold 21% of the entries.
HUB_CACHE_BYTES = 64 << 20


@torch.no_grad()
def one_rank_copy(model: ParallelScaleGNN) -> ParallelScaleGNN:
    """The model on one process, with ``model``'s global parameters (collective: every rank
    adds its shards into zeros and one all-reduce sums them; each entry is divided by
    the number of ranks that hold it, so replicas count once). In evaluation mode, on
    the model's device.

    >>> from dgl_scalegnn.config import ModelConfig
    >>> model = ParallelScaleGNN(ModelConfig(hidden=8, layers=2), in_features=5,
    ...                          num_classes=3, runtime=Runtime.single_process(), seed=4)
    >>> copy = one_rank_copy(model)
    >>> bool(torch.equal(copy.layers[0].params["weight"], model.layers[0].params["weight"]))
    True
    """
    grid = model.runtime.grid
    params = model.sharded_state_dict()
    device = next(iter(params.values())).device
    sums, counts, offsets = [], [], {}
    for name, param in params.items():
        shard = param.shard
        total = torch.zeros(shard.global_shape, dtype=torch.float64, device=device)
        count = torch.zeros_like(total)
        slices = shard.local_slices(grid.shape, grid.coords)
        total[slices] = param.detach().double()
        count[slices] = 1.0
        offsets[name] = sum(piece.numel() for piece in sums)
        sums.append(total.flatten())
        counts.append(count.flatten())
    flat = reduce_over_world(torch.cat(sums + counts))
    size = flat.numel() // 2
    values = flat[:size] / flat[size:]
    copy = ParallelScaleGNN(
        model.cfg,
        in_features=model.in_features,
        num_classes=model.num_classes,
        runtime=Runtime.this_process(),
        seed=0,  # every parameter is overwritten below
        native=model.layer_tail.native,
    ).to(device)
    for name, target in copy.sharded_state_dict().items():
        start = offsets[name]
        target.copy_(values[start : start + target.numel()].view_as(target))
    return copy.eval()


class NeighbourhoodEvaluator:
    """Logits and counts of any vertices of ``graph`` from their neighbourhoods, by the
    one-process ``model`` (:func:`one_rank_copy`).

    On construction the hidden rows below the last layer of the vertices of highest
    degree (as many as ``hub_cache_bytes`` hold) are computed and kept; every later
    piece reads them instead of expanding those vertices. With ``share`` ``(rank,
    size)`` of a job of ``size`` processes, each computes its part of them and one
    all-gather a layer gives every process all of them (collective: every rank builds
    its evaluator together).
    """

    def __init__(
        self,
        model: ParallelScaleGNN,
        graph: PreparedGraph,
        piece_entries: int = PIECE_ENTRIES,
        hub_cache_bytes: int = HUB_CACHE_BYTES,
        share: tuple[int, int] = (0, 1),
    ) -> None:
        if model.runtime.grid.shape.world_size != 1:
            raise ValueError("a neighbourhood evaluation runs a one-process model (one_rank_copy)")
        if model.training:
            raise RuntimeError("neighbourhood evaluation: call model.eval() first")
        self.model, self.graph, self.piece_entries = model, graph, piece_entries
        self.device = next(model.parameters()).device
        self.normalisation = layer_kind(model.cfg).normalisation
        kept_layers = max(0, len(model.layers) - 1)
        row_bytes = 4 * model.cfg.hidden * kept_layers
        self.hubs = hubs(graph, hub_cache_bytes // row_bytes if row_bytes else 0)
        # hub i's kept row: its place in its owner's part of the gathered rows
        rank, size = share
        bounds = np.asarray(split_bounds(self.hubs.size, size), dtype=np.int64)
        most = int(np.diff(bounds).max()) if self.hubs.size else 0
        owner = np.searchsorted(bounds, np.arange(self.hubs.size), side="right") - 1
        self._kept_row = owner * most + np.arange(self.hubs.size) - bounds[owner]
        self.kept: list[torch.Tensor] = []
        # layer l's hubs read layer l-1's kept rows (every rank finds the same hubs)
        for index in range(kept_layers if self.hubs.size else 0):
            mine = self.outputs(index, self.hubs[bounds[rank] : bounds[rank + 1]])
            if size == 1:
                self.kept.append(mine)
                continue
            parts = torch.empty(size * most, mine.shape[1], device=self.device)
            padded = torch.zeros(most, mine.shape[1], device=self.device)
            padded[: mine.shape[0]] = mine
            dist.all_gather(list(parts.split(most)), padded)
            self.kept.append(parts)

    def _degrees(self, vertices: np.ndarray) -> np.ndarray:
        return read_vertex_rows(self.graph.adjacency.degrees, vertices)

    def outputs(self, index: int, rows: np.ndarray) -> torch.Tensor:
        """Layer ``index``'s output at the sorted unique vertices ``rows``, a piece of at
        most :attr:`piece_entries` entries at a time."""
        width = self.model.layers[index].widths.width_out
        out = torch.empty(rows.size, width, device=self.device)
        for piece in pieces(self._degrees(rows), self.piece_entries):
            out[piece] = self._piece(index, rows[piece])
        return out

    def _piece(self, index: int, rows: np.ndarray) -> torch.Tensor:
        model, graph, device = self.model, self.graph, self.device
        step = hop(graph, rows, self.normalisation)
        layer, projection = model.layers[index], None
        if index == 0:
            if step.inputs.size:
                graph.verify("features", int(step.inputs[0]), int(step.inputs[-1]) + 1)
            x = torch.from_numpy(read_vertex_rows(graph.features, step.inputs)).to(device)
            spec = ShardSpec(INPUT_LAYOUT, self._rows(step.inputs), model.in_features)
            if model.cfg.input_projection:  # folded after the aggregation: x stays whole
                projection, spec = model.input_layer, spec.with_layout(INPUT_LAYOUT.after_linear())
            else:
                x, spec = model.input_layer(x, spec, EVAL_STEP)
            layout = spec.layout
        else:
            x = self._inputs(index - 1, step.inputs)
            layout = model.layers[index - 1].kind.output_layout(model.layers[index - 1].layout)
        input_spec = ShardSpec(layout, self._rows(step.rows), x.shape[1])
        block = step.block.to(device)
        adjacency = CSRRows(block, 0, block.row_stop, (0, block.nnz), model.layer_tail.native)
        own = x.index_select(0, torch.from_numpy(step.own).to(device))
        inputs = LayerInput(x, input_spec, adjacency, EvaluationRows(own, projection))
        return layer(inputs, EVAL_STEP)[0]

    def _inputs(self, index: int, vertices: np.ndarray) -> torch.Tensor:
        """Layer ``index``'s output at ``vertices``: the kept rows of the hubs among them,
        the others computed (:meth:`outputs`)."""
        position = np.searchsorted(self.hubs, vertices).clip(max=max(0, self.hubs.size - 1))
        kept = self.hubs[position] == vertices if self.hubs.size else np.zeros(vertices.size, bool)
        width = self.model.layers[index].widths.width_out
        x = torch.empty(vertices.size, width, device=self.device)
        if kept.any():
            where = torch.from_numpy(np.flatnonzero(kept)).to(self.device)
            rows = torch.from_numpy(self._kept_row[position[kept]]).to(self.device)
            x.index_copy_(0, where, self.kept[index].index_select(0, rows))
        if not kept.all():
            where = torch.from_numpy(np.flatnonzero(~kept)).to(self.device)
            x.index_copy_(0, where, self.outputs(index, vertices[~kept]))
        return x

    def _rows(self, vertices: np.ndarray) -> RowPartition:
        shape = self.model.runtime.grid.shape
        return RowPartition.of(
            torch.from_numpy(vertices), self.graph.meta.num_nodes, shape, self.device
        )

    @torch.no_grad()
    def logits(self, targets: np.ndarray) -> tuple[torch.Tensor, ShardSpec]:
        """Logits of the sorted unique vertices ``targets`` and their spec."""
        model = self.model
        if model.layers:
            hidden = self.outputs(len(model.layers) - 1, targets)
            last = model.layers[-1]
            layout = last.kind.output_layout(last.layout)
            spec = ShardSpec(layout, self._rows(targets), hidden.shape[1])
        else:
            features = read_vertex_rows(self.graph.features, targets)
            spec = ShardSpec(INPUT_LAYOUT, self._rows(targets), model.in_features)
            hidden, spec = model.input_layer(
                torch.from_numpy(features).to(self.device), spec, EVAL_STEP
            )
        if model.head is not None:
            hidden, spec = model.head(hidden, spec)
        return hidden, spec

    @torch.no_grad()
    def count_tensor(
        self, vertices: tuple[int, int], chunk_rows: int = COUNT_CHUNK_ROWS
    ) -> torch.Tensor:
        """Per split of :data:`SPLITS`, (correct, total) over vertices ``[start, stop)``
        (micro-F1 terms if multi-label), ``chunk_rows`` vertices' logits at a time; not
        summed over ranks: a ``(3, 2)`` float64 tensor on the device, added up
        there (:meth:`~dgl_scalegnn.model.objective.Objective.count_tensor`), nothing read
        back."""
        graph, device = self.graph, self.device
        objective = Objective(self.model.runtime, multilabel=graph.meta.multilabel)
        total = torch.zeros(len(SPLITS), 2, dtype=torch.float64, device=device)
        for start in range(vertices[0], vertices[1], chunk_rows):
            stop = min(start + chunk_rows, vertices[1])
            targets = np.arange(start, stop, dtype=np.int64)
            logits, spec = self.logits(targets)
            for name in ("labels", "train_mask", "val_mask", "test_mask"):
                graph.verify(name, start, stop)
            chunk = FullGraph(
                rows=spec.rows,
                blocks={},
                features=logits.new_empty(0),
                labels=torch.from_numpy(np.asarray(graph.labels[start:stop])).to(device),
                masks={
                    split: torch.from_numpy(
                        np.asarray(getattr(graph, f"{split}_mask")[start:stop])
                    ).to(device)
                    for split in SPLITS
                },
            )
            total = total + objective.count_tensor(logits, spec, chunk, SPLITS)
        return total

    def counts(
        self, vertices: tuple[int, int], chunk_rows: int = COUNT_CHUNK_ROWS
    ) -> dict[str, tuple[float, float]]:
        """:meth:`count_tensor`, per split, read back once."""
        return split_counts(SPLITS, self.count_tensor(vertices, chunk_rows))


def neighbourhood_counts(
    model: ParallelScaleGNN, graph: PreparedGraph
) -> dict[str, tuple[float, float]]:
    """Per split, (correct, total) over every vertex of ``graph``, summed over the world
    (collective): each rank evaluates its range of the vertices from their neighbourhoods
    (:class:`NeighbourhoodEvaluator` of :func:`one_rank_copy`), :data:`COUNT_CHUNK_ROWS` at
    a time, and the counts are summed over the world after each chunk (a small
    all-reduce, added up on the device and read back once). Every rank runs as many
    chunks, so the ranks stay within a chunk of each other: none waits in a collective
    for a whole evaluation (``parallel.timeout_s`` bounds that wait)."""
    grid = model.runtime.grid
    rank, world = grid.rank, grid.shape.world_size
    num_nodes = graph.meta.num_nodes
    bounds = split_bounds(num_nodes, world)
    start, stop = bounds[rank], bounds[rank + 1]
    copy = one_rank_copy(model)
    evaluator = NeighbourhoodEvaluator(copy, graph, share=(rank, world))
    device = next(copy.parameters()).device
    total = torch.zeros(len(SPLITS), 2, dtype=torch.float64, device=device)
    for index in range(chunk_count(num_nodes, world, COUNT_CHUNK_ROWS)):
        first = min(stop, start + index * COUNT_CHUNK_ROWS)
        last = min(stop, first + COUNT_CHUNK_ROWS)
        total += reduce_over_world(evaluator.count_tensor((first, last)))
        release_free_heap()  # the chunk's pieces are freed: give their heap back
    return split_counts(SPLITS, total)
