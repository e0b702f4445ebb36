"""GCN (Kipf & Welling), DGL's ``GraphConv`` with ``norm='both'``, on the 3D PMM grid.

.. math::

    P = \\tilde A X W, \\qquad \\tilde A = \\hat D^{-1/2} (A + I) \\hat D^{-1/2}

Input ``(r, c, o)``: the SpMM on plane ``(o, r)`` gives ``(o, c, r)``, the product with
:math:`W` ``(o, r, c)`` (the layer rotation). On one TP rank a layer that narrows
multiplies by :math:`W` first, :math:`\\tilde A (X W)` (DGL's ``GraphConv`` order), so
that the SpMM reads the narrower side (:meth:`GraphLayer.narrows_first
<dgl_scalegnn.model.convs.base.GraphLayer.narrows_first>`).
"""

from __future__ import annotations

import torch

from dgl_scalegnn._dgl import dgl
from dgl_scalegnn.config import ModelConfig
from dgl_scalegnn.core.cost import CollectiveCost, LocalSizes
from dgl_scalegnn.core.layout import Layout
from dgl_scalegnn.core.schedule import GCN_KIND, LayerWidths, ParamShard
from dgl_scalegnn.model.convs.base import GraphLayer, LayerInput, Product, aggregate_reference
from dgl_scalegnn.parallel.products import linear_cost, parallel_linear, parallel_spmm, spmm_cost

__all__ = ["GCNLayer"]


class GCNLayer(GraphLayer):
    """:math:`\\tilde A X W` (parameter ``weight``, :math:`d_{in} \\times d_{out}`).

    Examples
    --------
    >>> from dgl_scalegnn.config import ModelConfig
    >>> from dgl_scalegnn.core.schedule import LayerWidths, layer_layouts
    >>> widths = LayerWidths(0, 8, 4, outputs_classes=True, residual=False)
    >>> sorted(GCNLayer.parameter_shards(layer_layouts(1)[0], widths, ModelConfig(bias=True)))
    ['layer0_bias', 'layer0_weight']
    """

    kind = GCN_KIND
    narrowing_weights = ("weight",)

    @classmethod
    def product_shards(
        cls, layout: Layout, widths: LayerWidths, cfg: ModelConfig
    ) -> dict[str, ParamShard]:
        aggregated = layout.after_spmm()
        return {
            "weight": ParamShard(
                (widths.width_in, widths.width_out), (aggregated.cols, aggregated.rep)
            )
        }

    def product(self, inputs: LayerInput) -> Product:
        widths, runtime, spec = self.widths, self.runtime, inputs.spec
        narrowed = self.narrowed(inputs)
        if narrowed is not None:
            # (Ã X) W = Ã (X W); one TP rank: every layout is the whole matrix, no collective.
            narrow = spec.with_layout(spec.layout, widths.width_out)
            hidden = parallel_spmm(narrowed.rows, inputs.adjacency, narrow, runtime)[0]
            aggregated_spec = spec.with_layout(spec.layout.after_spmm())
            out_spec = aggregated_spec.with_layout(
                aggregated_spec.layout.after_linear(), widths.width_out
            )
            return Product(hidden, out_spec, hidden, aggregated_spec)  # no residual here
        aggregated, aggregated_spec = self.aggregate(inputs)
        hidden, out_spec = parallel_linear(
            aggregated, self.params["weight"], aggregated_spec, widths.width_out, runtime
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
        costs = spmm_cost(layout, widths.width_in, sizes, needs_dx)
        return costs + linear_cost(
            layout.after_spmm(), widths.width_in, widths.width_out, needs_dx, sizes
        )

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
        return aggregated @ params["weight"], aggregated
