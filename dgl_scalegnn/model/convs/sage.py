"""GraphSAGE with the mean aggregator, DGL's ``SAGEConv(aggregator_type='mean')``, on
the 3D PMM grid.

.. math::

    P = X W_{self} + (D^{-1} A X) W, \\qquad (D^{-1} A X)_v = \\frac{1}{d_v}
        \\sum_{u \\in N(v)} x_u

with :math:`A` the graph without self loops and :math:`d_v` the degree (an isolated
vertex aggregates 0, as in DGL).

**Under uniform vertex sampling** the mean is estimated by the sum over the sampled
neighbours, each divided by the *full* degree and by :math:`p`:
:math:`\\frac{1}{d_v p} \\sum_{u \\in N(v) \\cap S} x_u`. Its expectation is the full
mean (unbiased, like the GCN's estimator, and with the same blocks: only the values
differ); the mean over the sampled neighbours alone would be biased for a vertex none
of whose neighbours is drawn (it gives 0 there, and its ratio form is biased for small
:math:`d_v p`). Full-graph evaluation uses the same definition with :math:`p = 1`: the
exact mean.

Input ``(r, c, o)``: the SpMM gives ``(o, c, r)``; the layer input moves to that layout
too, and both products share one all-reduce: ``[X | D^{-1} A X] [W_{self}; W]`` over the
columns' axis, to ``(o, r, c)`` (GCN's rotation).
"""

from __future__ import annotations

import torch

from dgl_scalegnn._dgl import dgl
from dgl_scalegnn.config import ModelConfig
from dgl_scalegnn.core.cost import CollectiveCost, LocalSizes
from dgl_scalegnn.core.layout import Layout
from dgl_scalegnn.core.schedule import LayerKind, LayerWidths, ParamShard
from dgl_scalegnn.model.convs.base import GraphLayer, Product, aggregate_reference
from dgl_scalegnn.model.layers import InputProjection
from dgl_scalegnn.parallel.partition import ShardSpec
from dgl_scalegnn.parallel.products import linear_cost, parallel_linear, spmm_cost
from dgl_scalegnn.parallel.redistribute import redistribute_cost
from dgl_scalegnn.parallel.spmm import LocalSpMM

__all__ = ["SAGELayer"]


class SAGELayer(GraphLayer):
    """:math:`X W_{self} + (D^{-1} A X) W` (parameters ``self_weight`` and ``weight``,
    both :math:`d_{in} \\times d_{out}`; DGL's ``fc_self`` and ``fc_neigh``).

    Examples
    --------
    >>> from dgl_scalegnn.config import ModelConfig
    >>> from dgl_scalegnn.core.schedule import LayerWidths, layer_layouts
    >>> widths = LayerWidths(1, 8, 8, outputs_classes=False, residual=True)
    >>> sorted(SAGELayer.parameter_shards(layer_layouts(2)[1], widths, ModelConfig()))
    ['layer1_gain', 'layer1_self_weight', 'layer1_weight']
    """

    kind = LayerKind(linears=1, normalisation="mean")

    @classmethod
    def product_shards(
        cls, layout: Layout, widths: LayerWidths, cfg: ModelConfig
    ) -> dict[str, ParamShard]:
        aggregated = layout.after_spmm()
        shard = ParamShard((widths.width_in, widths.width_out), (aggregated.cols, aggregated.rep))
        return {"self_weight": shard, "weight": shard}

    def product(
        self,
        x: torch.Tensor,
        spec: ShardSpec,
        adjacency: LocalSpMM,
        own_rows: torch.Tensor | None,
        projection: InputProjection | None,
    ) -> Product:
        aggregated, aggregated_spec = self.aggregate(x, spec, adjacency, projection)
        own = self.own_rows_in(aggregated_spec.layout, x, spec, own_rows, projection)
        # Both factors split their columns along the same axis, so the local blocks side
        # by side are a block of [X | D^-1 A X] and one all-reduce completes both products.
        both = torch.cat((own, aggregated), dim=1)
        weights = torch.cat((self.params["self_weight"], self.params["weight"]), dim=0)
        both_spec = aggregated_spec.with_layout(aggregated_spec.layout, 2 * self.widths.width_in)
        hidden, out_spec = parallel_linear(
            both, weights, both_spec, self.widths.width_out, self.runtime
        )
        return Product(hidden, out_spec, aggregated, aggregated_spec)

    @classmethod
    def product_cost(
        cls,
        layout: Layout,
        widths: LayerWidths,
        cfg: ModelConfig,
        sizes: LocalSizes,
        needs_dx: bool,
    ) -> list[CollectiveCost]:
        aggregated = layout.after_spmm()
        costs = spmm_cost(layout, widths.width_in, sizes, needs_dx)
        costs += linear_cost(aggregated, 2 * widths.width_in, widths.width_out, needs_dx, sizes)
        return costs + redistribute_cost(layout, aggregated, widths.width_in, sizes, needs_dx)

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
        aggregated = aggregate_reference(graph, x, weight)
        return x @ params["self_weight"] + aggregated @ params["weight"], aggregated
