"""What every graph layer type implements, and the parts they share.

A layer type is one subclass of :class:`GraphLayer` in one module of this package,
registered in :data:`~dgl_scalegnn.model.convs.CONV_LAYERS` under its ``model.conv``
name. It declares

- :attr:`GraphLayer.kind`: what the schedule needs (the dense products after its SpMM,
  which move the layout, and the normalisation of the adjacency it multiplies by);
- :meth:`GraphLayer.product_shards`: its parameters, their global shapes and splits;
- :meth:`GraphLayer.product`: its forward on the grid, up to the output product, from
  one :class:`LayerInput` (the input rows, their spec, the adjacency block), built from
  the base class's :meth:`~GraphLayer.aggregate` and :meth:`~GraphLayer.own_rows_in`;
- :meth:`GraphLayer.product_cost`: the collectives of that product and its backward;
- :meth:`GraphLayer.reference`: the same product on one process, with DGL;
- optionally :attr:`GraphLayer.narrowing_weights`: the weights whose products with the
  input it can aggregate instead, :math:`A (X W)` for :math:`(A X) W` (DGL's
  ``GraphConv`` and ``SAGEConv`` order where :math:`W` narrows); its :meth:`product` then
  takes :meth:`~GraphLayer.narrowed` where that is not ``None``, and reads nothing else
  of the input.

The base class adds what every layer shares: the output bias, the tail (RMSNorm, ReLU,
hashed dropout, residual; :class:`~dgl_scalegnn.parallel.elementwise.LayerTail`), their
parameters and costs, and what an evaluation hands a layer (:class:`EvaluationRows`,
built by :mod:`~dgl_scalegnn.evaluation` alone): the rows of a chunk, the input
projection folded into the first aggregation, the narrowed input. Aggregating and
reading the own rows through the base class, a layer type evaluates in chunks as it
trains, without knowing either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from dgl_scalegnn._dgl import dgl
from dgl_scalegnn.config import ModelConfig
from dgl_scalegnn.core.cost import CollectiveCost, LocalSizes
from dgl_scalegnn.core.layout import Layout, Plane
from dgl_scalegnn.core.schedule import GCN_KIND, LayerKind, LayerWidths, ParamShard
from dgl_scalegnn.core.seeds import mix_seed
from dgl_scalegnn.distributed.comm import Runtime
from dgl_scalegnn.model.layers import InputProjection
from dgl_scalegnn.model.parameters import add_bias, sharded_parameter
from dgl_scalegnn.parallel.elementwise import LayerTail
from dgl_scalegnn.parallel.norm import (
    reduce_grad,
    reduce_grad_cost,
    row_statistics,
    sum_of_squares_cost,
)
from dgl_scalegnn.parallel.partition import ShardSpec
from dgl_scalegnn.parallel.products import parallel_linear, parallel_spmm
from dgl_scalegnn.parallel.redistribute import redistribute, redistribute_cost
from dgl_scalegnn.parallel.spmm import LocalSpMM

__all__ = [
    "GraphLayer",
    "LayerInput",
    "EvaluationRows",
    "Narrowed",
    "Product",
    "aggregate_reference",
]


@dataclass(frozen=True)
class Product:
    """A layer's product before its tail: the output ``hidden`` and its spec, and the
    aggregated input and its spec (what ``residual_from: aggregated`` adds)."""

    hidden: torch.Tensor
    spec: ShardSpec
    aggregated: torch.Tensor
    aggregated_spec: ShardSpec


@dataclass(frozen=True)
class EvaluationRows:
    """What a chunked evaluation gives a layer beside its input; only
    :mod:`~dgl_scalegnn.evaluation` builds one (training never does).

    ``own`` is the layer input at the block's output rows (the residual, a self term),
    or, with ``narrowed``, that product's rows there. ``projection`` (one TP rank, the
    first layer) is the input projection, folded after the aggregation: the layer input
    is then the features. ``narrowed`` is the layer input times its narrowing weights
    (:meth:`GraphLayer.narrowed_input`) at every input row, made once for all of a
    layer's chunks: given it, the layer input itself is gone (:attr:`LayerInput.x` is
    ``None``), so a layer reads neither.
    """

    own: torch.Tensor
    projection: InputProjection | None = None
    narrowed: torch.Tensor | None = None


@dataclass(frozen=True)
class LayerInput:
    """What a layer's forward reads: ``x``, every input row its SpMM reads, in ``spec``
    (whose rows are the block's output rows), and ``adjacency``, the local block of its
    plane for those rows; in an evaluation, ``evaluation`` too.

    Raises
    ------
    ValueError
        ``x`` given with a narrowed input, or neither: exactly one of them is the
        layer's input.
    """

    x: torch.Tensor | None
    spec: ShardSpec
    adjacency: LocalSpMM
    evaluation: EvaluationRows | None = None

    def __post_init__(self) -> None:
        narrowed = self.evaluation is not None and self.evaluation.narrowed is not None
        if (self.x is None) != narrowed:
            raise ValueError(
                "a layer's input is x or, in an evaluation, its narrowed product: give "
                f"exactly one (x {'missing' if self.x is None else 'given'}, narrowed "
                f"{'given' if narrowed else 'missing'})"
            )

    @property
    def projection(self) -> InputProjection | None:
        """The input projection folded into this layer (an evaluation on one TP rank)."""
        return None if self.evaluation is None else self.evaluation.projection


@dataclass(frozen=True)
class Narrowed:
    """A narrowing layer's input times its weights (:meth:`GraphLayer.narrowed_input`):
    ``rows`` of every input row, which the SpMM reads, and ``own`` of the output rows."""

    rows: torch.Tensor
    own: torch.Tensor


def aggregate_reference(graph: dgl.DGLGraph, features: torch.Tensor, weight: str) -> torch.Tensor:
    """:math:`A X` over ``graph``'s in-edges weighted by ``edata[weight]`` (one process)."""
    return dgl.ops.u_mul_e_sum(graph, features, graph.edata[weight].to(features.dtype))


class GraphLayer(nn.Module):
    """Graph layer ``index`` on the 3D PMM grid: :math:`\\mathrm{tail}(P + b)` for the
    layer type's product :math:`P` (:meth:`product`), or :math:`P + b` alone for the
    layer that outputs the classes. ``bias`` adds :math:`b`; the tail is RMSNorm (with a
    gain), ReLU, hashed dropout and the residual :math:`X` (or, with
    ``residual_from: aggregated``, the aggregated input).

    Reads layout ``layout`` and the adjacency shard of its SpMM plane; writes
    :meth:`LayerKind.output_layout` of it. Parameters are named
    ``layer{index}_{name}`` in the model's state dict, ``name`` in :attr:`params`.
    """

    #: What the schedule needs of this layer type (overridden by each type).
    kind: ClassVar[LayerKind] = GCN_KIND
    #: The parameters whose products with the layer input the type can aggregate
    #: instead of the input, :math:`\hat A (X W)` for :math:`(\hat A X) W`, in the
    #: order their products are joined (:meth:`narrowed_input`); none by default. A
    #: layer narrows where that is narrower (:meth:`narrows_first`), and its
    #: :meth:`product` then reads :meth:`narrowed`, never the input.
    narrowing_weights: ClassVar[tuple[str, ...]] = ()

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
        self.plane: Plane = self.kind.plane(layout)
        self.cfg, self.runtime, self.seed, self.tail = cfg, runtime, seed, tail
        prefix = self.prefix(widths.index)
        self.params = nn.ParameterDict()  # filled in order (from a dict it would sort)
        for name, shard in shards.items():
            if name.startswith(prefix):
                self.params[name.removeprefix(prefix)] = sharded_parameter(
                    name, shard, runtime, seed
                )

    @staticmethod
    def prefix(index: int) -> str:
        """The state-dict prefix of layer ``index``'s parameters."""
        return f"layer{index}_"

    # ---- what a layer type implements -------------------------------------------------

    @classmethod
    def product_shards(
        cls, layout: Layout, widths: LayerWidths, cfg: ModelConfig
    ) -> dict[str, ParamShard]:
        """The parameters of the product (short names), for input layout ``layout``."""
        raise NotImplementedError

    def product(self, inputs: LayerInput) -> Product:
        """The product of ``inputs`` up to the output bias, from the base class's parts:
        :meth:`narrowed` (where the layer narrows: then read nothing else of the input),
        :meth:`aggregate` and :meth:`own_rows_in`."""
        raise NotImplementedError

    @classmethod
    def product_cost(
        cls,
        layout: Layout,
        widths: LayerWidths,
        cfg: ModelConfig,
        sizes: LocalSizes,
        needs_dx: bool,
    ) -> list[CollectiveCost]:
        """Collectives of :meth:`product` and its backward on an input in ``layout``."""
        raise NotImplementedError

    @classmethod
    def reference(
        cls,
        params: dict[str, torch.Tensor],
        graph: dgl.DGLGraph,
        x: torch.Tensor,
        weight: str,
        widths: LayerWidths,
        cfg: ModelConfig,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`product` on one process: ``(output before the bias, aggregated input)``
        of every vertex of ``graph``, whose ``edata[weight]`` is the adjacency in
        :attr:`kind`'s normalisation; ``params`` by short name, global tensors."""
        raise NotImplementedError

    # ---- shared ---------------------------------------------------------------------

    @classmethod
    def narrows_first(
        cls, widths: LayerWidths, tp_size: int, projected: bool, cfg: ModelConfig
    ) -> bool:
        """Whether a layer of this type multiplies its input by ``weight`` before the
        aggregation (:meth:`narrowed_input`): on one TP rank, where every layout is the
        whole matrix and the order needs no collective, for a layer with fewer output
        than input columns, no residual, and no input projection folded into its
        aggregation (``projected``). A type that always multiplies first (GAT) says so
        from ``cfg``.

        >>> from dgl_scalegnn.model.convs import CONV_LAYERS
        >>> narrowing = LayerWidths(1, 128, 8, outputs_classes=True, residual=False)
        >>> cfg = ModelConfig()
        >>> [CONV_LAYERS[c].narrows_first(narrowing, 1, False, cfg) for c in ("gcn", "sage", "gin")]
        [True, True, False]
        >>> CONV_LAYERS["sage"].narrows_first(narrowing, 2, False, cfg)
        False
        """
        return (
            bool(cls.narrowing_weights)
            and tp_size == 1
            and not projected
            and not widths.residual
            and widths.width_out < widths.width_in
        )

    @classmethod
    def narrowed_width(cls, widths: LayerWidths, cfg: ModelConfig) -> int:
        """The columns of :meth:`narrowed_input`: one output's per narrowing weight."""
        return len(cls.narrowing_weights) * widths.width_out

    def narrowed_input(
        self, x: torch.Tensor, spec: ShardSpec, projection: InputProjection | None
    ) -> torch.Tensor | None:
        """:math:`X [W_1 | W_2 ...]` (:attr:`narrowing_weights`) for every row of ``x``
        (in ``spec``) where the layer aggregates it instead of :math:`X`
        (:meth:`narrows_first`, and no gradient through ``x``); ``None`` elsewhere. A
        chunked evaluation computes it once for all the layer's chunks."""
        widths, runtime = self.widths, self.runtime
        if x.requires_grad or not self.narrows_first(
            widths, runtime.grid.shape.tp_size, projection is not None, self.cfg
        ):
            return None
        weights = [self.params[name] for name in self.narrowing_weights]
        weight = weights[0] if len(weights) == 1 else torch.cat(weights, dim=1)
        input_spec = spec.with_layout(spec.layout, widths.width_in)
        width = self.narrowed_width(widths, self.cfg)
        return parallel_linear(x, weight, input_spec, width, runtime)[0]

    def narrowed(self, inputs: LayerInput) -> Narrowed | None:
        """The narrowed input of every input row and of the output rows, where the layer
        narrows (``None`` elsewhere): given by an evaluation, or made here where the
        block's output rows are all its input rows (a training step whose input needs no
        gradient, the features; an evaluation in one piece)."""
        evaluation = inputs.evaluation
        if evaluation is not None and evaluation.narrowed is not None:
            return Narrowed(evaluation.narrowed, evaluation.own)
        if inputs.adjacency.num_rows != inputs.x.shape[0]:
            return None
        whole = self.narrowed_input(inputs.x, inputs.spec, inputs.projection)
        return None if whole is None else Narrowed(whole, whole)

    @classmethod
    def parameter_shards(
        cls, layout: Layout, widths: LayerWidths, cfg: ModelConfig
    ) -> dict[str, ParamShard]:
        """Every parameter of the layer by its state-dict name: the product's, then the
        output bias and the norm's gain, split along the output's columns."""
        out_cols = cls.kind.output_layout(layout).cols
        shards = dict(cls.product_shards(layout, widths, cfg))
        if cfg.bias:
            shards["bias"] = ParamShard((widths.width_out,), (out_cols,))
        if cfg.norm and not widths.outputs_classes:
            shards["gain"] = ParamShard((widths.width_out,), (out_cols,))
        prefix = cls.prefix(widths.index)
        return {prefix + name: shard for name, shard in shards.items()}

    def forward(self, inputs: LayerInput, step: int) -> tuple[torch.Tensor, ShardSpec]:
        """``inputs`` (layout :attr:`layout`) -> the layer's output and its spec: the
        :meth:`product`, the output bias, and the tail (dropout keyed by ``step``).

        ``inputs.adjacency`` is the local block of :attr:`plane` for the output rows
        ``inputs.spec`` names; in an evaluation ``inputs.evaluation`` gives the input at
        those rows (the rows of ``x`` there, unless the output covers every row of
        ``x``), the folded input projection and the narrowed input
        (:class:`EvaluationRows`).
        """
        product = self.product(inputs)
        out_spec, runtime = product.spec, self.runtime
        hidden = add_bias(product.hidden, self.params.get("bias"), out_spec, runtime)
        if self.widths.outputs_classes:
            return hidden, out_spec
        grid = runtime.grid
        gain = self.params.get("gain")
        if gain is not None:
            gain = reduce_grad(gain, out_spec.layout.rows, runtime)
        residual = None
        if self.widths.residual and self.cfg.residual_from == "aggregated":
            residual = redistribute(
                product.aggregated, product.aggregated_spec, out_spec.layout, runtime
            )
        elif self.widths.residual:
            residual = self.own_rows_in(out_spec.layout, inputs)
        col_start, _ = out_spec.col_range(grid.shape, grid.coords)
        rows = out_spec.layout.rows
        # without autograd the tail writes over the product's own new matrix, which then
        # stays in cache (not where the residual is that matrix's storage too)
        overwrite = not torch.is_grad_enabled() and (
            residual is None
            or residual.untyped_storage().data_ptr() != hidden.untyped_storage().data_ptr()
        )
        out = self.tail(
            hidden,
            gain,
            residual,
            out_spec.rows.ids(rows, grid.coord(rows)),
            statistics=row_statistics(out_spec.layout, runtime),
            key=mix_seed(self.seed, step, self.index),
            col_start=col_start,
            width=out_spec.num_cols,
            eps=self.cfg.rms_eps,
            rate=self.cfg.dropout if self.training else 0.0,
            profiler=runtime.profiler,
            overwrite=overwrite,
        )
        return out, out_spec

    @classmethod
    def cost(
        cls,
        layout: Layout,
        widths: LayerWidths,
        cfg: ModelConfig,
        sizes: LocalSizes,
        needs_dx: bool,
    ) -> list[CollectiveCost]:
        """Collectives of :meth:`forward` and its backward for a layer reading ``layout``
        (no backward through the SpMM unless the input ``needs_dx``: the features do not);
        the forward's alone are those not marked ``backward``."""
        out = cls.kind.output_layout(layout)
        costs = cls.product_cost(layout, widths, cfg, sizes, needs_dx)
        if cfg.bias:
            costs += reduce_grad_cost(out.rows, sizes.cols(widths.width_out, out.cols))
        if widths.outputs_classes:
            return costs
        if cfg.norm:
            costs += sum_of_squares_cost(out, sizes)
            costs += reduce_grad_cost(out.rows, sizes.cols(cfg.hidden, out.cols))  # the gain
        if widths.residual:
            aggregated = cls.kind.spmm_layout(layout).after_spmm()
            source = aggregated if cfg.residual_from == "aggregated" else layout
            costs += redistribute_cost(source, out, cfg.hidden, sizes)
        return costs

    def aggregate(self, inputs: LayerInput) -> tuple[torch.Tensor, ShardSpec]:
        """:math:`A X` in ``inputs.spec.layout.after_spmm()``; with a folded projection
        (one TP rank) :math:`A (X W_{in} + 1 b_{in})` of the features ``x``
        (:meth:`aggregate_projected`)."""
        aggregated, aggregated_spec = parallel_spmm(
            inputs.x, inputs.adjacency, inputs.spec, self.runtime
        )
        projection = inputs.projection
        if projection is None:
            return aggregated, aggregated_spec
        aggregated = self.aggregate_projected(aggregated, inputs.adjacency, projection)
        return aggregated, aggregated_spec.with_layout(aggregated_spec.layout, self.cfg.hidden)

    def aggregate_projected(
        self, aggregated: torch.Tensor, adjacency: LocalSpMM, projection: InputProjection
    ) -> torch.Tensor:
        """:math:`(A X) W_{in} + (A 1) b_{in}` from ``aggregated`` :math:`= A X` on one
        TP rank (:meth:`~dgl_scalegnn.model.layers.InputProjection.project_aggregated`)."""
        if self.runtime.grid.shape.tp_size != 1:
            raise ValueError("the projection folds into a layer on one TP rank only")
        with self.runtime.profiler.region("gemm"):
            return projection.project_aggregated(aggregated, adjacency)

    def own_rows_in(self, layout: Layout, inputs: LayerInput) -> torch.Tensor:
        """The layer input at the output rows (the evaluation's ``own``, or ``x``),
        projected when a projection is folded in, moved to ``layout``: the residual, or
        a layer type's self term (SAGE's :math:`X W_{self}`)."""
        evaluation = inputs.evaluation
        rows = inputs.x if evaluation is None else evaluation.own
        if inputs.projection is not None:
            with self.runtime.profiler.region("gemm"):
                rows = inputs.projection.project_whole(rows)
        input_spec = inputs.spec.with_layout(inputs.spec.layout, self.widths.width_in)
        return redistribute(rows, input_spec, layout, self.runtime)
