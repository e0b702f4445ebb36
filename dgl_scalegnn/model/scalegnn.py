"""The ScaleGNN model distributed by 3D PMM: one implementation for every grid shape.

.. math::

    X_{h,0} = X_S W_{in}, \\qquad
    X_{h,l} = \\mathrm{Dropout}(\\mathrm{ReLU}(\\mathrm{RMSNorm}(\\tilde A_S X_{h,l-1} W_l)))
              + X_{h,l-1}, \\qquad
    O = X_{h,L} W_{out}

(without input projection :math:`X_{h,0} = X_S`; without head the last layer is
:math:`O = \\tilde A_S X_{h,L-1} W_L`, no tail; ``residual_from: aggregated`` adds
:math:`\\tilde A_S X_{h,l-1}` instead of :math:`X_{h,l-1}`; ``final_norm`` gives
:math:`O = \\mathrm{RMSNorm}(X_{h,L}) W_{out}`; with ``bias`` every product :math:`X W` is
:math:`X W + b`.)

Input features arrive in state ``(x, z, y)``; the projection gives ``(x, y, z)``; layer
``l`` maps ``(r, c, o)`` to ``(o, r, c)`` and reads the adjacency shard of plane
``(o, r)``, so the planes repeat with period three. Parameters are initialised from the
seed and their *global* shape and then sliced, and dropout masks hash global
coordinates: the same run gives the same numbers on any grid (up to reduction order).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from dgl_scalegnn.config import ModelConfig
from dgl_scalegnn.core.cost import CollectiveCost, LocalSizes
from dgl_scalegnn.core.layout import INPUT_LAYOUT, Axis
from dgl_scalegnn.core.schedule import layer_layouts, layer_widths, parameter_shards
from dgl_scalegnn.distributed.comm import Runtime
from dgl_scalegnn.model.layers import GCNLayer, Head, InputFeatures, InputProjection
from dgl_scalegnn.parallel.elementwise import LayerTail
from dgl_scalegnn.parallel.partition import ShardSpec
from dgl_scalegnn.sampling.batch import RankBatch
from dgl_scalegnn.sampling.full_graph import (
    ChunkMemory,
    FullGraph,
    RowChunk,
    chunk_count,
    chunk_rows_for,
    csr_row_chunks,
    row_chunks,
)

__all__ = ["ParallelScaleGNN", "EVAL_STEP"]

#: Step key of full-graph evaluation (no dropout, so it only has to be some integer).
EVAL_STEP = -1


class ParallelScaleGNN(nn.Module):
    """ScaleGNN on the 4D grid: input projection, ``L`` GCN layers and a head, each
    holding this rank's parameter shards (:mod:`~dgl_scalegnn.model.layers`).

    Parameters
    ----------
    cfg : ModelConfig
        Hidden size :math:`d_h`, layers :math:`L`, dropout rate, norm/residual switches.
    in_features, num_classes : int
        :math:`d_{in}` and :math:`d_{out}`.
    runtime : Runtime
        Grid, communication switches and profiler.
    seed : int
        Initialisation and dropout seed.
    fuse : bool or "auto"
        Fuse each layer's element-wise tail with ``torch.compile`` (``"auto"``: on CUDA
        tensors, not on CPU ones).
    native : bool
        Run the element-wise tail and the norms on the native CPU kernels where they
        build (:mod:`~dgl_scalegnn.parallel.cpu_kernels`).

    Examples
    --------
    >>> from dgl_scalegnn.config import ModelConfig
    >>> from dgl_scalegnn.distributed.comm import Runtime
    >>> model = ParallelScaleGNN(ModelConfig(hidden=8, layers=2), in_features=5,
    ...                          num_classes=3, runtime=Runtime.single_process(), seed=0)
    >>> sorted(model.sharded_state_dict())
    ['head', 'input_proj', 'layer0_gain', 'layer0_weight', 'layer1_gain', 'layer1_weight']
    >>> [str(layer.plane) for layer in model.layers]
    ['ZX', 'YZ']
    """

    def __init__(
        self,
        cfg: ModelConfig,
        *,
        in_features: int,
        num_classes: int,
        runtime: Runtime,
        seed: int,
        fuse: bool = False,
        native: bool = True,
    ) -> None:
        super().__init__()
        self.cfg, self.runtime = cfg, runtime
        self.in_features, self.num_classes = in_features, num_classes
        shards = parameter_shards(cfg, in_features, num_classes)
        self.layer_tail = LayerTail(fuse, native=native)
        self.input_layer: InputProjection | InputFeatures = (
            InputProjection(cfg, shards, runtime, seed)
            if cfg.input_projection
            else InputFeatures(cfg, runtime, seed)
        )
        self.layers = nn.ModuleList(
            GCNLayer(widths, layout, cfg, shards, runtime, seed, self.layer_tail)
            for widths, layout in zip(
                layer_widths(cfg, in_features, num_classes), layer_layouts(cfg.layers)
            )
        )
        self.head = (
            Head(cfg, num_classes, shards, runtime, seed, self.layer_tail) if cfg.head else None
        )

    def sharded_state_dict(self) -> dict[str, nn.Parameter]:
        """Every parameter by its schedule name; ``param.shard`` gives its global shape
        and split (what a checkpoint needs to re-slice it for another grid)."""
        params = {}
        if isinstance(self.input_layer, InputProjection):
            params["input_proj"] = self.input_layer.weight
            params["input_proj_bias"] = self.input_layer.bias
        for layer in self.layers:
            params[f"layer{layer.index}_weight"] = layer.weight
            params[f"layer{layer.index}_gain"] = layer.gain
            params[f"layer{layer.index}_bias"] = layer.bias
        if self.head is not None:
            params["final_gain"] = self.head.gain
            params["head"] = self.head.weight
            params["head_bias"] = self.head.bias
        return {name: param for name, param in params.items() if param is not None}

    def forward(self, batch: RankBatch) -> tuple[torch.Tensor, ShardSpec]:
        """Logits shard and its spec (classes split along the logits' column axis);
        dropout while ``self.training``."""
        spec = ShardSpec(INPUT_LAYOUT, batch.rows, self.in_features)
        hidden, spec = self.input_layer(batch.features, spec, batch.step)
        for layer in self.layers:
            hidden, spec = layer(hidden, spec, batch.adjacency[layer.plane], batch.step)
        return (hidden, spec) if self.head is None else self.head(hidden, spec)

    @staticmethod
    def cost(
        cfg: ModelConfig, in_features: int, num_classes: int, sizes: LocalSizes
    ) -> list[CollectiveCost]:
        """Collectives of :meth:`forward` and its backward, layer by layer."""
        layouts = layer_layouts(cfg.layers)
        if cfg.input_projection:
            costs = InputProjection.cost(cfg, in_features, sizes)
        else:
            costs = InputFeatures.cost(in_features, sizes)
        for layout, widths in zip(layouts, layer_widths(cfg, in_features, num_classes)):
            needs_dx = widths.index > 0 or cfg.input_projection
            costs += GCNLayer.cost(layout, widths, cfg, sizes, needs_dx)
        if cfg.head:
            costs += Head.cost(layouts[-1], cfg, num_classes, sizes)
        return costs

    @torch.no_grad()
    def forward_full_graph(
        self, graph: FullGraph, chunk_rows: int | None = None
    ) -> tuple[torch.Tensor, ShardSpec]:
        """Logits of every vertex, layer by layer in chunks of ``chunk_rows`` output rows
        per rank (by default sized for the device: :meth:`full_graph_chunk_rows`).

        The layers of :meth:`forward` in evaluation mode, applied to one chunk of a
        layer's output rows at a time and multiplying by the resident CSR blocks
        (:mod:`~dgl_scalegnn.sampling.full_graph`): the only full-size buffers are a
        layer's input and output. The head runs on each chunk of the last layer's output,
        so the last hidden matrix is never whole. On one TP rank, where every layout is the
        whole matrix, the first layer reads the features themselves (no copy) and applies
        the input projection after its aggregation, :math:`(\\tilde A X) W_{in}`: the
        projected features are never whole, and the SpMM reads :math:`d_{in}` columns.

        No chunk waits for the device: a chunk's rows and their split are known on the
        host, and each layer reads the entry ranges of all its chunks' CSR rows at once
        (one wait per layer).
        """
        if self.training:
            raise RuntimeError("forward_full_graph evaluates: call model.eval() first")
        if chunk_rows is None:
            chunk_rows = self.full_graph_chunk_rows(graph)

        def project(chunk: RowChunk) -> torch.Tensor:
            chunk_spec = ShardSpec(INPUT_LAYOUT, chunk.rows, self.in_features)
            features = graph.features[chunk.start : chunk.stop]
            return self.input_layer(features, chunk_spec, EVAL_STEP)[0]

        one_tp_rank = self.runtime.grid.shape.tp_size == 1
        fold = one_tp_rank and self.cfg.input_projection and bool(self.layers)
        projected = self.cfg.input_projection and not fold
        width = self.cfg.hidden if projected else self.in_features
        spec = ShardSpec(INPUT_LAYOUT.after_linear(), graph.rows, width)
        if one_tp_rank and not projected:
            hidden = graph.features  # every layout is the whole matrix: no copy
        else:
            hidden = self._by_row_chunks(spec, chunk_rows, graph.features.dtype, project)
        if not self.layers:
            return self.head(hidden, spec)
        projection = self.input_layer if fold else None
        for layer in self.layers:
            head = self.head if layer is self.layers[-1] else None
            # the layer's input is freed once its output is complete
            hidden, spec = self._full_graph_layer(
                graph, layer, hidden, spec, chunk_rows, head, projection
            )
            projection = None
        return hidden, spec

    def full_graph_chunk_rows(self, graph: FullGraph) -> int:
        """Output rows per chunk and rank for evaluating ``graph`` on its device
        (:func:`~dgl_scalegnn.sampling.full_graph.chunk_rows_for`, with the
        :class:`~dgl_scalegnn.sampling.full_graph.ChunkMemory` of this model's widths and
        the graph's entries per row)."""
        grid = self.runtime.grid
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
        widths = (self.in_features, self.cfg.hidden, self.num_classes)
        memory = ChunkMemory.of(
            widest_cols=max(math.ceil(width / narrowest_split) for width in widths),
            local_rows=max(stop - start for start, stop in ranges),
            entries_per_row=entries_per_row,
            element_bytes=graph.features.element_size(),
            entry_bytes=entry_bytes,
        )
        return chunk_rows_for(graph.features.device, shape.tp_size, memory)

    def _full_graph_layer(
        self,
        graph: FullGraph,
        layer: GCNLayer,
        layer_input: torch.Tensor,
        spec: ShardSpec,
        chunk_rows: int,
        head: Head | None,
        projection: InputProjection | None = None,
    ) -> tuple[torch.Tensor, ShardSpec]:
        """``layer`` (then ``head``, if given) on the whole graph, one chunk of output
        rows at a time; with ``projection`` the layer input is the projection of
        ``layer_input`` (see :meth:`GCNLayer.forward`)."""
        grid = self.runtime.grid
        coords = grid.coords
        layout = spec.layout
        input_start = graph.rows.range(layout.rows, coords.along(layout.rows))[0]
        residual_of_input = layer.widths.residual and self.cfg.residual_from == "input"
        out_spec = spec.with_layout(layout.after_gcn_layer(), layer.widths.width_out)
        count = chunk_count(spec.rows.num_nodes, grid.shape.size(out_spec.layout.rows), chunk_rows)
        adjacency_chunks = csr_row_chunks(graph.blocks[layer.plane], chunk_rows, count)

        def compute(chunk: RowChunk) -> torch.Tensor:
            # The SpMM reads every input row; the spec only carries the layout and names
            # the chunk's rows, which the output keeps.
            input_spec = ShardSpec(layout, chunk.rows, spec.num_cols)
            chunk_input = chunk.rows_of(layer_input, layout.rows, coords, input_start)
            if projection is not None and residual_of_input:
                chunk_input = projection.project_whole(chunk_input)
            adjacency = adjacency_chunks[chunk.index]
            out, out_spec = layer(
                layer_input, input_spec, adjacency, EVAL_STEP, chunk_input, projection
            )
            return out if head is None else head(out, out_spec)[0]

        if head is not None:  # rows stay, classes along the head's output columns
            out_spec = out_spec.with_layout(out_spec.layout.after_linear(), head.num_classes)
        return self._by_row_chunks(out_spec, chunk_rows, layer_input.dtype, compute), out_spec

    def _by_row_chunks(
        self,
        spec: ShardSpec,
        chunk_rows: int,
        dtype: torch.dtype,
        compute: Callable[[RowChunk], torch.Tensor],
    ) -> torch.Tensor:
        """The local shard of the full-graph matrix ``spec``, filled chunk by chunk."""
        grid = self.runtime.grid
        device = spec.rows.vertex_ids.device
        out = torch.empty(spec.local_shape(grid.shape, grid.coords), dtype=dtype, device=device)
        axis = spec.layout.rows
        for chunk in row_chunks(
            spec.rows.num_nodes, axis, grid.shape, grid.coords, chunk_rows, device
        ):
            out[chunk.start : chunk.stop] = compute(chunk)
        return out
