"""The stages around the graph layers of ScaleGNN under 3D PMM: the way in (input
features, or their projection :math:`X_{h,0} = X_S W_{in}`) and the head
:math:`O = X_{h,L} W_{out}` (:math:`\\mathrm{RMSNorm}(X_{h,L}) W_{out}` with
``final_norm``; :math:`+ b` with ``bias``). The graph layers are in
:mod:`~dgl_scalegnn.model.convs`. Shapes are local: ``(rows, cols)`` of a shard in the
layout its :class:`~dgl_scalegnn.parallel.partition.ShardSpec` names.
"""

from __future__ import annotations

import torch
from torch import nn

from dgl_scalegnn.config import ModelConfig
from dgl_scalegnn.core.cost import CollectiveCost, LocalSizes
from dgl_scalegnn.core.layout import INPUT_LAYOUT, Layout
from dgl_scalegnn.core.schedule import ParamShard
from dgl_scalegnn.core.seeds import mix_seed
from dgl_scalegnn.distributed.comm import Runtime
from dgl_scalegnn.model.parameters import add_bias, optional_parameter, sharded_parameter
from dgl_scalegnn.parallel.elementwise import LayerTail, hashed_dropout
from dgl_scalegnn.parallel.norm import reduce_grad_cost, rms_norm, rms_norm_cost
from dgl_scalegnn.parallel.partition import ShardSpec
from dgl_scalegnn.parallel.products import linear_cost, parallel_linear
from dgl_scalegnn.parallel.redistribute import redistribute, redistribute_cost
from dgl_scalegnn.parallel.spmm import LocalSpMM

__all__ = ["INPUT_DROPOUT_LAYER", "InputFeatures", "InputProjection", "Head"]

#: Dropout-mask key of the input features (graph layers use 0..L-1).
INPUT_DROPOUT_LAYER = -1


class _InputStage(nn.Module):
    """What both ways into the first graph layer share: input dropout (hashed) while training."""

    layout = INPUT_LAYOUT

    def __init__(self, cfg: ModelConfig, runtime: Runtime, seed: int) -> None:
        super().__init__()
        self.cfg, self.runtime, self.seed = cfg, runtime, seed

    def dropout(self, features: torch.Tensor, spec: ShardSpec, step: int) -> torch.Tensor:
        """Hashed dropout of the input features while training (the same mask on every grid)."""
        cfg, runtime = self.cfg, self.runtime
        if not self.training or cfg.input_dropout == 0:
            return features
        grid = runtime.grid
        with runtime.profiler.region("elementwise"):
            row_ids = spec.rows.ids(spec.layout.rows, grid.coord(spec.layout.rows))
            col_start, _ = spec.col_range(grid.shape, grid.coords)
            key = mix_seed(self.seed, step, INPUT_DROPOUT_LAYER)
            return hashed_dropout(features, key, row_ids, col_start, cfg.input_dropout)


class InputFeatures(_InputStage):
    """:math:`X_S` itself for a model without input projection: moved from
    :data:`~dgl_scalegnn.core.layout.INPUT_LAYOUT` ``(x, z, y)`` to the ``(x, y, z)`` the
    first GCN layer reads (an all-to-all over the TP grid, none on one rank); input
    dropout (hashed) while training."""

    def forward(
        self, features: torch.Tensor, spec: ShardSpec, step: int
    ) -> tuple[torch.Tensor, ShardSpec]:
        """``(rows, in_cols)`` shard of spec ``spec`` -> the same matrix in ``(x, y, z)``."""
        layout = INPUT_LAYOUT.after_linear()
        features = self.dropout(features, spec, step)
        return redistribute(features, spec, layout, self.runtime), spec.with_layout(layout)

    @staticmethod
    def cost(in_features: int, sizes: LocalSizes) -> list[CollectiveCost]:
        """Collectives of :meth:`forward` (the features need no gradient)."""
        layout = INPUT_LAYOUT.after_linear()
        return redistribute_cost(INPUT_LAYOUT, layout, in_features, sizes, needs_grad=False)


class InputProjection(_InputStage):
    """:math:`X_S W_{in}` (:math:`+ b_{in}` with ``bias``): features in
    :data:`~dgl_scalegnn.core.layout.INPUT_LAYOUT` ``(x, z, y)``, hidden ``(x, y, z)`` out
    (the projection's all-reduce moves them, no redistribution); input dropout (hashed)
    while training."""

    def __init__(
        self, cfg: ModelConfig, shards: dict[str, ParamShard], runtime: Runtime, seed: int
    ) -> None:
        super().__init__(cfg, runtime, seed)
        self.weight = sharded_parameter("input_proj", shards["input_proj"], runtime, seed)
        self.bias = optional_parameter("input_proj_bias", shards, runtime, seed)

    def forward(
        self, features: torch.Tensor, spec: ShardSpec, step: int
    ) -> tuple[torch.Tensor, ShardSpec]:
        """``(rows, in_cols)`` shard of spec ``spec`` -> ``(rows, hidden_cols)`` and its spec."""
        features = self.dropout(features, spec, step)
        out, out_spec = parallel_linear(features, self.weight, spec, self.cfg.hidden, self.runtime)
        return add_bias(out, self.bias, out_spec, self.runtime), out_spec

    def project_whole(self, features: torch.Tensor) -> torch.Tensor:
        """:math:`X W_{in}` (:math:`+ b_{in}`) of whole rows on one TP rank (no dropout)."""
        out = features @ self.weight
        return out if self.bias is None else out + self.bias

    def project_aggregated(self, aggregated: torch.Tensor, adjacency: LocalSpMM) -> torch.Tensor:
        """:math:`\\tilde A (X W_{in} + 1 b_{in}) = (\\tilde A X) W_{in} + (\\tilde A 1)
        b_{in}` from ``aggregated`` :math:`= \\tilde A X` (whole rows, one TP rank): the
        projection after the aggregation, so that the projected features are never whole."""
        out = aggregated @ self.weight
        if self.bias is None:
            return out
        row_sums = adjacency.row_sums(out)
        return out + row_sums * self.bias

    @staticmethod
    def cost(cfg: ModelConfig, in_features: int, sizes: LocalSizes) -> list[CollectiveCost]:
        """Collectives of :meth:`forward` and its backward (the features need no gradient)."""
        costs = linear_cost(INPUT_LAYOUT, in_features, cfg.hidden, False, sizes)
        if cfg.bias:
            out = INPUT_LAYOUT.after_linear()
            costs += reduce_grad_cost(out.rows, sizes.cols(cfg.hidden, out.cols))
        return costs


class Head(nn.Module):
    """:math:`X_{h,L} W_{out}` (or :math:`\\mathrm{RMSNorm}(X_{h,L}) W_{out}` with
    ``final_norm``; :math:`+ b_{out}` with ``bias``): logits with classes split along the
    output layout's columns."""

    def __init__(
        self,
        cfg: ModelConfig,
        num_classes: int,
        shards: dict[str, ParamShard],
        runtime: Runtime,
        seed: int,
        tail: LayerTail,
    ) -> None:
        super().__init__()
        self.cfg, self.num_classes, self.runtime, self.tail = cfg, num_classes, runtime, tail
        self.weight = sharded_parameter("head", shards["head"], runtime, seed)
        self.gain = optional_parameter("final_gain", shards, runtime, seed)
        self.bias = optional_parameter("head_bias", shards, runtime, seed)

    def forward(self, hidden: torch.Tensor, spec: ShardSpec) -> tuple[torch.Tensor, ShardSpec]:
        if self.gain is not None:
            hidden = rms_norm(hidden, self.gain, spec, self.cfg.rms_eps, self.runtime, self.tail)
        logits, spec = parallel_linear(hidden, self.weight, spec, self.num_classes, self.runtime)
        return add_bias(logits, self.bias, spec, self.runtime), spec

    @staticmethod
    def cost(
        layout: Layout, cfg: ModelConfig, num_classes: int, sizes: LocalSizes
    ) -> list[CollectiveCost]:
        """Collectives of :meth:`forward` and its backward on hidden rows in ``layout``."""
        norm = rms_norm_cost(layout, cfg.hidden, sizes) if cfg.final_norm else []
        costs = norm + linear_cost(layout, cfg.hidden, num_classes, True, sizes)
        if cfg.bias:
            out = layout.after_linear()
            costs += reduce_grad_cost(out.rows, sizes.cols(num_classes, out.cols))
        return costs
