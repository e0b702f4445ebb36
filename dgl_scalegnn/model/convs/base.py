"""What every graph layer type implements, and the parts they share.

A layer type is one subclass of :class:`GraphLayer` in one module of this package,
registered in :data:`~dgl_scalegnn.model.convs.CONV_LAYERS` under its ``model.conv``
name. It declares

- :attr:`GraphLayer.kind`: what the schedule needs (the dense products after its SpMM,
  which move the layout, and the normalisation of the adjacency it multiplies by);
- :meth:`GraphLayer.product_shards`: its parameters, their global shapes and splits;
- :meth:`GraphLayer.product`: its forward on the grid, up to the output product;
- :meth:`GraphLayer.product_cost`: the collectives of that product and its backward;
- :meth:`GraphLayer.reference`: the same product on one process, with DGL.

The base class adds what every layer shares: the output bias, the tail (RMSNorm, ReLU,
hashed dropout, residual; :class:`~dgl_scalegnn.parallel.elementwise.LayerTail`), their
parameters and costs, the one-TP-rank folding of the input projection into the
aggregation, and, for a layer type that sets :attr:`GraphLayer.aggregates_narrowed`,
the one-TP-rank order :math:`A (X W)` for a layer that narrows (DGL's ``GraphConv`` and
``SAGEConv`` order): the SpMM then reads :math:`d_{out}` columns, not :math:`d_{in}`.
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

__all__ = ["GraphLayer", "Narrowed", "Product", "aggregate_reference"]


@dataclass(frozen=True)
class Product:
    """A layer's product before its tail: the output ``hidden`` and its spec, and the
    aggregated input and its spec (what ``residual_from: aggregated`` adds)."""

    hidden: torch.Tensor
    spec: ShardSpec
    aggregated: torch.Tensor
    aggregated_spec: ShardSpec


@dataclass(frozen=True)
class Narrowed:
    """A narrowing layer's input times its weights (:meth:`GraphLayer.narrowed_input`):
    ``rows`` of every input row, which the SpMM reads, and ``own`` of the output rows
    (``rows`` itself where the output is every input row)."""

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
    #: Whether the type's product has a term :math:`(A X) W` (parameter ``weight``) that
    #: it can aggregate as :math:`A (X W)` (:meth:`narrows_first`). Its :meth:`product`
    #: given ``narrowed`` then reads neither ``x`` nor ``own_rows``: a chunked evaluation
    #: frees the input once narrowed and passes the narrowed matrix in its place.
    aggregates_narrowed: ClassVar[bool] = False

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

    def product(
        self,
        x: torch.Tensor,
        spec: ShardSpec,
        adjacency: LocalSpMM,
        own_rows: torch.Tensor | None,
        projection: InputProjection | None,
        narrowed: Narrowed | None,
    ) -> Product:
        """The product of ``x`` (in ``spec``) up to the output bias; see :meth:`forward`."""
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
    def narrows_first(cls, widths: LayerWidths, tp_size: int, projected: bool) -> bool:
        """Whether a layer of this type multiplies its input by ``weight`` before the
        aggregation (:meth:`narrowed_input`): on one TP rank, where every layout is the
        whole matrix and the order needs no collective, for a layer with fewer output
        than input columns, no residual, and no input projection folded into its
        aggregation (``projected``).

        >>> from dgl_scalegnn.model.convs import CONV_LAYERS
        >>> narrowing = LayerWidths(1, 128, 8, outputs_classes=True, residual=False)
        >>> [CONV_LAYERS[c].narrows_first(narrowing, 1, False) for c in ("gcn", "sage", "gin")]
        [True, True, False]
        >>> CONV_LAYERS["sage"].narrows_first(narrowing, 2, False)
        False
        """
        return (
            cls.aggregates_narrowed
            and tp_size == 1
            and not projected
            and not widths.residual
            and widths.width_out < widths.width_in
        )

    @classmethod
    def narrowed_width(cls, widths: LayerWidths) -> int:
        """The columns of :meth:`narrowed_input`: those of :meth:`narrowing_weight`."""
        return widths.width_out

    def narrowing_weight(self) -> torch.Tensor:
        """What a narrowing layer multiplies its whole input by: ``weight``, the matrix
        whose product it aggregates (a type with more terms in :math:`X` appends theirs)."""
        return self.params["weight"]

    def narrowed_input(
        self, x: torch.Tensor, spec: ShardSpec, projection: InputProjection | None
    ) -> torch.Tensor | None:
        """:math:`X W` (:meth:`narrowing_weight`) for every row of ``x`` (in ``spec``)
        where the layer aggregates it instead of :math:`X` (:meth:`narrows_first`, and no
        gradient through ``x``); ``None`` elsewhere. A chunked evaluation computes it once
        for all the layer's chunks."""
        widths, runtime = self.widths, self.runtime
        if x.requires_grad or not self.narrows_first(
            widths, runtime.grid.shape.tp_size, projection is not None
        ):
            return None
        input_spec = spec.with_layout(spec.layout, widths.width_in)
        width = self.narrowed_width(widths)
        return parallel_linear(x, self.narrowing_weight(), input_spec, width, runtime)[0]

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

    def forward(
        self,
        x: torch.Tensor,
        spec: ShardSpec,
        adjacency: LocalSpMM,
        step: int,
        own_rows: torch.Tensor | None = None,
        projection: InputProjection | None = None,
        narrowed: Narrowed | None = None,
    ) -> tuple[torch.Tensor, ShardSpec]:
        """``x`` in ``spec`` (layout :attr:`layout`) -> the layer's output and its spec.

        ``adjacency`` is the local block of :attr:`plane` for the output rows ``spec``
        names; ``own_rows`` the rows of the layer input at the output rows (``x`` itself
        unless the output covers only some rows of ``x``, as in chunked evaluation). With
        ``projection`` (one TP rank only, where every layout is the whole matrix) ``x``
        is the features and the layer input their projection, applied after the
        aggregation (:meth:`aggregate`) so that the projected features are never whole.
        ``narrowed`` is :meth:`narrowed_input` of ``x`` and of the output rows, computed
        here where the block's output rows are all its input rows (training; an
        evaluation in one chunk).
        """
        if narrowed is None and adjacency.num_rows == x.shape[0]:
            whole = self.narrowed_input(x, spec, projection)
            narrowed = None if whole is None else Narrowed(whole, whole)
        product = self.product(x, spec, adjacency, own_rows, projection, narrowed)
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
            residual = self.own_rows_in(out_spec.layout, x, spec, own_rows, projection)
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
            source = layout.after_spmm() if cfg.residual_from == "aggregated" else layout
            costs += redistribute_cost(source, out, cfg.hidden, sizes)
        return costs

    def aggregate(
        self,
        x: torch.Tensor,
        spec: ShardSpec,
        adjacency: LocalSpMM,
        projection: InputProjection | None,
    ) -> tuple[torch.Tensor, ShardSpec]:
        """:math:`A X` in ``spec.layout.after_spmm()``; with ``projection`` (one TP rank)
        :math:`A (X W_{in} + 1 b_{in})` of the features ``x`` (:meth:`aggregate_projected`)."""
        aggregated, aggregated_spec = parallel_spmm(x, adjacency, spec, self.runtime)
        if projection is None:
            return aggregated, aggregated_spec
        aggregated = self.aggregate_projected(aggregated, adjacency, projection)
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

    def own_rows_in(
        self,
        layout: Layout,
        x: torch.Tensor,
        spec: ShardSpec,
        own_rows: torch.Tensor | None,
        projection: InputProjection | None,
    ) -> torch.Tensor:
        """The layer input at the output rows (``own_rows``, or ``x``), projected when
        ``projection`` is folded in, moved to ``layout``: the residual, or a layer type's
        self term (SAGE's :math:`X W_{self}`)."""
        rows = x if own_rows is None else own_rows
        if projection is not None:
            with self.runtime.profiler.region("gemm"):
                rows = projection.project_whole(rows)
        input_spec = spec.with_layout(spec.layout, self.widths.width_in)
        return redistribute(rows, input_spec, layout, self.runtime)
