"""The layers of ScaleGNN under 3D PMM, each owning its parameter shards.

.. math::

    X_{h,0} = X_S W_{in}, \\qquad
    X_{h,l} = \\mathrm{Dropout}(\\mathrm{ReLU}(\\mathrm{RMSNorm}(\\tilde A_S X_{h,l-1} W_l)))
              + X_{h,l-1}, \\qquad
    O = X_{h,L} W_{out}

(without input projection :math:`X_{h,0} = X_S`; without head the last layer is
:math:`O = \\tilde A_S X_{h,L-1} W_L`, no tail; with ``residual_from: aggregated`` the
residual is :math:`\\tilde A_S X_{h,l-1}`; with ``final_norm``
:math:`O = \\mathrm{RMSNorm}(X_{h,L}) W_{out}`; with ``bias`` every product
:math:`X W` is :math:`X W + b`.)
Each layer knows the layout it reads (and a GCN layer the adjacency plane it multiplies
by), from the schedule (:mod:`~dgl_scalegnn.core.schedule`). Its parameters are this
rank's slices of tensors initialised from the seed at their *global* shape, and carry
that shape and split as ``param.shard`` (a :class:`~dgl_scalegnn.core.schedule.ParamShard`),
which checkpointing reads. Shapes are local: ``(rows, cols)`` of a shard in the layout
its :class:`~dgl_scalegnn.parallel.partition.ShardSpec` names.
"""

from __future__ import annotations

import zlib

import torch
from torch import nn

from dgl_scalegnn.config import ModelConfig
from dgl_scalegnn.core.cost import CollectiveCost, LocalSizes
from dgl_scalegnn.core.layout import INPUT_LAYOUT, Layout, Plane
from dgl_scalegnn.core.schedule import LayerWidths, ParamShard
from dgl_scalegnn.core.seeds import mix_seed
from dgl_scalegnn.distributed.comm import Runtime
from dgl_scalegnn.parallel.elementwise import LayerTail, hashed_dropout
from dgl_scalegnn.parallel.norm import (
    reduce_grad,
    reduce_grad_cost,
    rms_norm,
    rms_norm_cost,
    row_statistics,
    sum_of_squares_cost,
)
from dgl_scalegnn.parallel.partition import ShardSpec
from dgl_scalegnn.parallel.products import linear_cost, parallel_linear, parallel_spmm, spmm_cost
from dgl_scalegnn.parallel.redistribute import redistribute, redistribute_cost
from dgl_scalegnn.parallel.spmm import LocalSpMM

__all__ = [
    "INPUT_DROPOUT_LAYER",
    "init_global_parameter",
    "sharded_parameter",
    "InputFeatures",
    "InputProjection",
    "GCNLayer",
    "Head",
]

#: Dropout-mask key of the input features (GCN layers use 0..L-1).
INPUT_DROPOUT_LAYER = -1


def init_global_parameter(name: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """The full parameter ``name``: Glorot-uniform weights from ``seed``, unit gains,
    zero biases (``*_bias``)."""
    if len(shape) == 1:
        return torch.zeros(shape) if name.endswith("_bias") else torch.ones(shape)
    generator = torch.Generator().manual_seed(mix_seed(seed, zlib.crc32(name.encode())))
    bound = (6.0 / (shape[0] + shape[1])) ** 0.5
    return (torch.rand(shape, generator=generator) * 2 - 1) * bound


def sharded_parameter(name: str, shard: ParamShard, runtime: Runtime, seed: int) -> nn.Parameter:
    """This rank's slice of parameter ``name``, with ``shard`` recorded on it.

    >>> from dgl_scalegnn.core.layout import Axis
    >>> param = sharded_parameter("w", ParamShard((6, 4), (Axis.X, Axis.Y)),
    ...                           Runtime.single_process(), seed=0)
    >>> tuple(param.shape), param.shard.global_shape
    ((6, 4), (6, 4))
    """
    grid = runtime.grid
    full = init_global_parameter(name, shard.global_shape, seed)
    param = nn.Parameter(full[shard.local_slices(grid.shape, grid.coords)].contiguous())
    param.shard = shard
    return param


def optional_parameter(
    name: str, shards: dict[str, ParamShard], runtime: Runtime, seed: int
) -> nn.Parameter | None:
    """:func:`sharded_parameter` ``name`` if the model has it (a gain or a bias), else None."""
    return sharded_parameter(name, shards[name], runtime, seed) if name in shards else None


def add_bias(
    out: torch.Tensor, bias: torch.Tensor | None, spec: ShardSpec, runtime: Runtime
) -> torch.Tensor:
    """``out + bias`` for a linear map's output in ``spec`` (bias ``(cols,)``, this rank's
    columns), the bias's gradient completed over the rows' axis; ``out`` without a bias."""
    if bias is None:
        return out
    return out + reduce_grad(bias, spec.layout.rows, runtime)


class _InputStage(nn.Module):
    """What both ways into the first GCN layer share: input dropout (hashed) while training."""

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
        row_sums = adjacency.matmul(out.new_ones(adjacency.num_cols, 1))
        return out + row_sums * self.bias

    @staticmethod
    def cost(cfg: ModelConfig, in_features: int, sizes: LocalSizes) -> list[CollectiveCost]:
        """Collectives of :meth:`forward` and its backward (the features need no gradient)."""
        costs = linear_cost(INPUT_LAYOUT, in_features, cfg.hidden, False, sizes)
        if cfg.bias:
            out = INPUT_LAYOUT.after_linear()
            costs += reduce_grad_cost(out.rows, sizes.cols(cfg.hidden, out.cols))
        return costs


class GCNLayer(nn.Module):
    """Layer ``index``: :math:`\\mathrm{tail}(\\tilde A X W_l)` (of
    :math:`\\tilde A X W_l + b_l` with ``bias``) with the tail
    (RMSNorm, ReLU, dropout, residual) of :class:`~dgl_scalegnn.parallel.elementwise.LayerTail`,
    or :math:`\\tilde A X W_l` alone for the layer that outputs the classes. The residual
    is :math:`X` or, with ``residual_from: aggregated``, :math:`\\tilde A X`.

    Reads layout ``(r, c, o)`` and the adjacency shard of plane ``(o, r)``; writes
    ``(o, r, c)`` (layer rotation).
    """

    def __init__(
        self,
        widths: LayerWidths,
        layout: Layout,
        cfg: ModelConfig,
        shards: dict[str, ParamShard],
        runtime: Runtime,
        seed: int,
        tail: LayerTail,
    ) -> None:
        super().__init__()
        self.index, self.widths, self.layout = widths.index, widths, layout
        self.plane: Plane = layout.spmm_plane()
        self.cfg, self.runtime, self.seed, self.tail = cfg, runtime, seed, tail
        name = f"layer{self.index}_weight"
        self.weight = sharded_parameter(name, shards[name], runtime, seed)
        self.gain = optional_parameter(f"layer{self.index}_gain", shards, runtime, seed)
        self.bias = optional_parameter(f"layer{self.index}_bias", shards, runtime, seed)

    def forward(
        self,
        x: torch.Tensor,
        spec: ShardSpec,
        adjacency: LocalSpMM,
        step: int,
        residual_input: torch.Tensor | None = None,
        projection: InputProjection | None = None,
    ) -> tuple[torch.Tensor, ShardSpec]:
        """``x`` in ``spec`` (layout ``self.layout``) -> the layer's output and its spec.

        ``adjacency`` is the local block of :attr:`plane` for the output rows ``spec``
        names; ``residual_input`` the rows of the layer input that the output rows add
        (``x`` itself unless the output covers only some rows of ``x``). With
        ``projection`` (one TP rank only, where every layout is the whole matrix) ``x`` is
        the features and the layer input their projection, aggregated as
        :meth:`InputProjection.project_aggregated` so that the projected features are
        never whole.
        """
        cfg, runtime, widths = self.cfg, self.runtime, self.widths
        if self._weight_first(x, adjacency, projection):
            # (Ã X) W = Ã (X W), the SpMM on the narrower side (DGL's GraphConv order);
            # one TP rank: every layout is the whole matrix and no collective runs.
            projected, _ = parallel_linear(x, self.weight, spec, widths.width_out, runtime)
            narrow = spec.with_layout(spec.layout, widths.width_out)
            hidden = parallel_spmm(projected, adjacency, narrow, runtime)[0]
            aggregated_spec = spec.with_layout(spec.layout.after_spmm())
            out_spec = aggregated_spec.with_layout(
                aggregated_spec.layout.after_linear(), widths.width_out
            )
        else:
            aggregated, aggregated_spec = parallel_spmm(x, adjacency, spec, runtime)
            if projection is not None:
                if runtime.grid.shape.tp_size != 1:
                    raise ValueError("the projection folds into a layer on one TP rank only")
                with runtime.profiler.region("gemm"):
                    aggregated = projection.project_aggregated(aggregated, adjacency)
                aggregated_spec = aggregated_spec.with_layout(aggregated_spec.layout, cfg.hidden)
            hidden, out_spec = parallel_linear(
                aggregated, self.weight, aggregated_spec, widths.width_out, runtime
            )
        hidden = add_bias(hidden, self.bias, out_spec, runtime)
        if widths.outputs_classes:
            return hidden, out_spec
        grid = runtime.grid
        gain = residual = None
        if self.gain is not None:
            gain = reduce_grad(self.gain, out_spec.layout.rows, runtime)
        if widths.residual and cfg.residual_from == "aggregated":
            residual = redistribute(aggregated, aggregated_spec, out_spec.layout, runtime)
        elif widths.residual:
            layer_input = x if residual_input is None else residual_input
            input_spec = spec.with_layout(spec.layout, widths.width_in)
            residual = redistribute(layer_input, input_spec, out_spec.layout, runtime)
        col_start, _ = out_spec.col_range(grid.shape, grid.coords)
        rows = out_spec.layout.rows
        out = self.tail(
            hidden,
            gain,
            residual,
            out_spec.rows.ids(rows, grid.coord(rows)),
            statistics=row_statistics(out_spec.layout, runtime),
            key=mix_seed(self.seed, step, self.index),
            col_start=col_start,
            width=out_spec.num_cols,
            eps=cfg.rms_eps,
            rate=cfg.dropout if self.training else 0.0,
            profiler=runtime.profiler,
        )
        return out, out_spec

    def _weight_first(
        self, x: torch.Tensor, adjacency: LocalSpMM, projection: InputProjection | None
    ) -> bool:
        """Whether to multiply by the weight before aggregating: on one TP rank, for a
        layer that reads the features (no gradient, no projection, no residual) into
        fewer columns, when the block's output rows are all its input rows (training, or
        an evaluation in one chunk: with several, each chunk would project every row)."""
        widths = self.widths
        return (
            self.runtime.grid.shape.tp_size == 1
            and projection is None
            and not x.requires_grad
            and not widths.residual
            and widths.width_out < widths.width_in
            and adjacency.num_rows == x.shape[0]
        )

    @staticmethod
    def cost(
        layout: Layout, widths: LayerWidths, cfg: ModelConfig, sizes: LocalSizes, needs_dx: bool
    ) -> list[CollectiveCost]:
        """Collectives of :meth:`forward` and its backward for a layer reading ``layout``
        (no backward through the SpMM unless the input ``needs_dx``: the features do not)."""
        out = layout.after_gcn_layer()
        costs = spmm_cost(layout, widths.width_in, sizes, needs_dx)
        aggregated = layout.after_spmm()
        costs += linear_cost(aggregated, widths.width_in, widths.width_out, needs_dx, sizes)
        if cfg.bias:
            costs += reduce_grad_cost(out.rows, sizes.cols(widths.width_out, out.cols))
        if widths.outputs_classes:
            return costs
        if cfg.norm:
            costs += sum_of_squares_cost(out, sizes)
            costs += reduce_grad_cost(out.rows, sizes.cols(cfg.hidden, out.cols))  # the gain
        if widths.residual:
            source = aggregated if cfg.residual_from == "aggregated" else layout
            costs += redistribute_cost(source, out, cfg.hidden, sizes)
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
