"""The ScaleGNN model distributed by 3D PMM: one implementation for every grid shape.

.. math::

    X_{h,0} = X_S W_{in}, \\qquad
    X_{h,l} = \\mathrm{Dropout}(\\mathrm{ReLU}(\\mathrm{RMSNorm}(\\tilde A_S X_{h,l-1} W_l)))
              + X_{h,l-1}, \\qquad
    O = X_{h,L} W_{out}

Input features arrive in state ``(x, z, y)``; the projection gives ``(x, y, z)``; layer
``l`` maps ``(r, c, o)`` to ``(o, r, c)`` and reads the adjacency shard of plane
``(o, r)``, so the planes repeat with period three. Parameters are initialised from the
seed and their *global* shape and then sliced, and dropout masks hash global
coordinates: the same run gives the same numbers on any grid (up to reduction order).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import torch
from torch import nn

from dgl_scalegnn.config import ModelConfig
from dgl_scalegnn.core.layout import INPUT_LAYOUT
from dgl_scalegnn.core.schedule import layer_layouts, parameter_shards
from dgl_scalegnn.core.seeds import mix_seed
from dgl_scalegnn.distributed.comm import Runtime, all_reduce
from dgl_scalegnn.parallel.elementwise import LayerTail, hashed_dropout
from dgl_scalegnn.parallel.losses import parallel_argmax, parallel_bce, parallel_cross_entropy
from dgl_scalegnn.parallel.norm import reduce_grad, sum_of_squares
from dgl_scalegnn.parallel.partition import ShardSpec
from dgl_scalegnn.parallel.products import parallel_linear, parallel_spmm
from dgl_scalegnn.parallel.redistribute import redistribute
from dgl_scalegnn.sampling.batch import RankBatch
from dgl_scalegnn.sampling.full_graph import (
    DEFAULT_CHUNK_ROWS,
    CSRRows,
    FullGraph,
    RowChunk,
    row_chunks,
)

__all__ = [
    "ParallelScaleGNN",
    "init_global_parameter",
]


#: Dropout-mask key of the input features (GCN layers use 0..L-1).
INPUT_DROPOUT_LAYER = -1
#: Step key of full-graph evaluation (no dropout, so it only has to be some integer).
EVAL_STEP = -1


def init_global_parameter(name: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """The full parameter ``name``: Glorot-uniform weights, unit gains, from ``seed``."""
    if len(shape) == 1:
        return torch.ones(shape)
    generator = torch.Generator().manual_seed(mix_seed(seed, zlib.crc32(name.encode())))
    bound = (6.0 / (shape[0] + shape[1])) ** 0.5
    return (torch.rand(shape, generator=generator) * 2 - 1) * bound


class ParallelScaleGNN(nn.Module):
    """ScaleGNN on the 4D grid; parameters are this rank's shards.

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
    multilabel : bool
        Binary cross-entropy over classes instead of cross-entropy.
    fuse : bool
        Fuse each layer's element-wise tail with ``torch.compile``.

    Examples
    --------
    >>> from dgl_scalegnn.config import ModelConfig
    >>> from dgl_scalegnn.distributed.comm import Runtime
    >>> model = ParallelScaleGNN(ModelConfig(hidden=8, layers=2), in_features=5,
    ...                          num_classes=3, runtime=Runtime.single_process(), seed=0)
    >>> sorted(model.shards)
    ['head', 'input_proj', 'layer0_gain', 'layer0_weight', 'layer1_gain', 'layer1_weight']
    """

    def __init__(
        self,
        cfg: ModelConfig,
        *,
        in_features: int,
        num_classes: int,
        runtime: Runtime,
        seed: int,
        multilabel: bool = False,
        fuse: bool = False,
    ) -> None:
        super().__init__()
        self.layer_tail = LayerTail(fuse)
        self.cfg, self.runtime, self.seed = cfg, runtime, seed
        self.in_features, self.num_classes, self.multilabel = in_features, num_classes, multilabel
        self.shards = parameter_shards(cfg, in_features, num_classes)
        grid = runtime.grid
        self.params = nn.ParameterDict()
        for name, shard in self.shards.items():
            full = init_global_parameter(name, shard.global_shape, seed)
            local = full[shard.local_slices(grid.shape, grid.coords)].contiguous()
            self.params[name] = nn.Parameter(local)
        self.layouts = layer_layouts(cfg.layers)

    def forward(self, batch: RankBatch, training: bool = True) -> tuple[torch.Tensor, ShardSpec]:
        """Logits shard and its spec (classes split along the logits' column axis)."""
        cfg, runtime = self.cfg, self.runtime
        spec = ShardSpec(INPUT_LAYOUT, batch.rows, self.in_features)
        features = batch.features
        if training and cfg.input_dropout > 0:
            features = self._dropout(
                features, spec, batch.step, INPUT_DROPOUT_LAYER, cfg.input_dropout
            )
        hidden, spec = parallel_linear(
            features, self.params["input_proj"], spec, cfg.hidden, runtime
        )
        for index in range(cfg.layers):
            layer_input, input_spec = hidden, spec
            adjacency = batch.adjacency[spec.layout.spmm_plane()]
            hidden, spec = parallel_spmm(hidden, adjacency, spec, runtime)
            hidden, spec = parallel_linear(
                hidden, self.params[f"layer{index}_weight"], spec, cfg.hidden, runtime
            )
            hidden = self._tail(hidden, spec, layer_input, input_spec, batch.step, index, training)
        return parallel_linear(hidden, self.params["head"], spec, self.num_classes, runtime)

    @torch.no_grad()
    def forward_full_graph(
        self, graph: FullGraph, chunk_rows: int = DEFAULT_CHUNK_ROWS
    ) -> tuple[torch.Tensor, ShardSpec]:
        """Logits of every vertex, layer by layer in chunks of ``chunk_rows`` output rows.

        The operators of :meth:`forward` with ``training=False`` (no dropout), applied to
        one chunk of a layer's output rows at a time and multiplying by the resident CSR
        blocks (:mod:`~dgl_scalegnn.sampling.full_graph`): the only full-size buffers are a
        layer's input and output.
        """
        cfg, runtime = self.cfg, self.runtime

        def project(chunk: RowChunk) -> torch.Tensor:
            chunk_spec = ShardSpec(INPUT_LAYOUT, chunk.rows, self.in_features)
            features = graph.features[chunk.start : chunk.stop]
            return parallel_linear(
                features, self.params["input_proj"], chunk_spec, cfg.hidden, runtime
            )[0]

        spec = ShardSpec(INPUT_LAYOUT.after_linear(), graph.rows, cfg.hidden)
        hidden = self._by_row_chunks(spec, chunk_rows, graph.features.dtype, project)
        for index in range(cfg.layers):
            # the layer's input is freed once its output is complete
            hidden, spec = self._full_graph_layer(graph, index, hidden, spec, chunk_rows)
        return parallel_linear(hidden, self.params["head"], spec, self.num_classes, runtime)

    def _full_graph_layer(
        self,
        graph: FullGraph,
        index: int,
        layer_input: torch.Tensor,
        spec: ShardSpec,
        chunk_rows: int,
    ) -> tuple[torch.Tensor, ShardSpec]:
        """GCN layer ``index`` on the whole graph, one chunk of output rows at a time."""
        cfg, runtime = self.cfg, self.runtime
        coords = runtime.grid.coords
        layout = spec.layout
        block = graph.blocks[layout.spmm_plane()]
        input_start = graph.rows.range(layout.rows, coords.along(layout.rows))[0]

        def compute(chunk: RowChunk) -> torch.Tensor:
            input_spec = ShardSpec(layout, chunk.rows, cfg.hidden)
            # The SpMM reads every input row; the spec only carries the layout and names
            # the chunk's rows, which the output keeps.
            out, out_spec = parallel_spmm(
                layer_input, CSRRows(block, chunk.start, chunk.stop), input_spec, runtime
            )
            out, out_spec = parallel_linear(
                out, self.params[f"layer{index}_weight"], out_spec, cfg.hidden, runtime
            )
            chunk_input = chunk.rows_of(layer_input, layout.rows, coords, input_start)
            return self._tail(out, out_spec, chunk_input, input_spec, EVAL_STEP, index, False)

        out_spec = spec.with_layout(layout.after_gcn_layer())
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

    def _dropout(
        self, x: torch.Tensor, spec: ShardSpec, step: int, layer: int, rate: float
    ) -> torch.Tensor:
        """Inverted dropout with the mask hashed from global (vertex, column) ids."""
        grid = self.runtime.grid
        with self.runtime.profiler.region("elementwise"):
            row_ids = spec.rows.ids(spec.layout.rows, grid.coord(spec.layout.rows))
            col_start, _ = spec.col_range(grid.shape, grid.coords)
            return hashed_dropout(x, mix_seed(self.seed, step, layer), row_ids, col_start, rate)

    def _tail(
        self,
        hidden: torch.Tensor,
        spec: ShardSpec,
        layer_input: torch.Tensor,
        input_spec: ShardSpec,
        step: int,
        layer: int,
        training: bool,
    ) -> torch.Tensor:
        """RMSNorm, ReLU, dropout and residual: communication here, element-wise fused."""
        cfg, runtime = self.cfg, self.runtime
        grid = runtime.grid
        square_sum = gain = residual = None
        if cfg.norm:
            square_sum = sum_of_squares(hidden, spec, runtime)
            gain = reduce_grad(self.params[f"layer{layer}_gain"], spec.layout.rows, runtime)
        if cfg.residual:
            residual = redistribute(layer_input, input_spec, spec.layout, runtime)
        col_start, _ = spec.col_range(grid.shape, grid.coords)
        with runtime.profiler.region("elementwise"):
            return self.layer_tail(
                hidden,
                square_sum,
                gain,
                residual,
                spec.rows.ids(spec.layout.rows, grid.coord(spec.layout.rows)),
                key=mix_seed(self.seed, step, layer),
                col_start=col_start,
                width=spec.num_cols,
                eps=cfg.rms_eps,
                rate=cfg.dropout if training else 0.0,
                profiler=runtime.profiler,
            )

    def loss(
        self, logits: torch.Tensor, spec: ShardSpec, batch: RankBatch, split: str = "train"
    ) -> torch.Tensor:
        """Mean loss over the batch rows labelled for ``split`` (same value on every rank)."""
        mask = batch.masks[split]
        if self.multilabel:
            class_start, class_stop = spec.col_range(
                self.runtime.grid.shape, self.runtime.grid.coords
            )
            targets = batch.labels[:, class_start:class_stop]
            return parallel_bce(logits, targets, mask, spec, self.runtime)
        return parallel_cross_entropy(logits, batch.labels, mask, spec, self.runtime)

    @torch.no_grad()
    def accuracy_counts(
        self, logits: torch.Tensor, spec: ShardSpec, batch: RankBatch | FullGraph
    ) -> dict[str, tuple[float, float]]:
        """Per split, (correct, total) summed over the group (micro-F1 terms if multi-label)."""
        grid, profiler = self.runtime.grid, self.runtime.profiler
        splits = sorted(batch.masks)
        if self.multilabel:
            class_start, class_stop = spec.col_range(grid.shape, grid.coords)
            predicted = logits > 0
            truth = batch.labels[:, class_start:class_stop] > 0.5
            rows = []
            for split in splits:
                mask = batch.masks[split].unsqueeze(1)
                true_pos = (predicted & truth & mask).sum()
                false_any = ((predicted ^ truth) & mask).sum()
                rows.append(torch.stack((2 * true_pos, 2 * true_pos + false_any)))
            counts = all_reduce(torch.stack(rows).double(), grid.group(spec.layout.cols), profiler)
        else:
            predicted = parallel_argmax(logits, spec, self.runtime)
            correct = predicted == batch.labels
            counts = torch.stack(
                [
                    torch.stack(((correct & batch.masks[s]).sum(), batch.masks[s].sum()))
                    for s in splits
                ]
            ).double()
        counts = all_reduce(counts, grid.group(spec.layout.rows), profiler)
        return {split: (float(c[0]), float(c[1])) for split, c in zip(splits, counts)}
