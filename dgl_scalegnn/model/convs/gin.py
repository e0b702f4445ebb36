"""GIN (Xu et al.), DGL's ``GINConv`` with the sum aggregator and a two-layer MLP, on
the 3D PMM grid.

.. math::

    P = \\mathrm{ReLU}\\big(((1 + \\epsilon) X + A X) W_1 + b_1\\big) W

with :math:`A` the graph without self loops, :math:`\\epsilon` fixed at
``model.gin_eps`` or learnt (``model.gin_learn_eps``), :math:`W_1` ``hidden_weight``
(:math:`d_{in} \\times d_h`) and :math:`b_1` ``hidden_bias`` (with ``model.bias``). The
MLP's second product is the layer's output product; its bias and the tail follow as for
every layer. Under uniform vertex sampling the sum is estimated by the sampled
neighbours divided by :math:`p` (unbiased); evaluation uses :math:`p = 1`.

Input ``(r, c, o)``: the SpMM gives ``(o, c, r)`` and the layer input moves there for
:math:`(1 + \\epsilon) X`; :math:`W_1` gives ``(o, r, c)`` and :math:`W` ``(o, c, r)``.
Three products, so the layer output is not GCN's rotation: the next layer's SpMM reads
plane ``(r, o)``, and a GIN model uses two adjacency planes, not three.
"""

from __future__ import annotations

import torch

from dgl_scalegnn._dgl import dgl
from dgl_scalegnn.config import ModelConfig
from dgl_scalegnn.core.cost import CollectiveCost, LocalSizes
from dgl_scalegnn.core.layout import Layout
from dgl_scalegnn.core.schedule import LayerKind, LayerWidths, ParamShard
from dgl_scalegnn.model.convs.base import GraphLayer, LayerInput, Product, aggregate_reference
from dgl_scalegnn.model.parameters import add_bias
from dgl_scalegnn.parallel.norm import reduce_grad, reduce_grad_cost
from dgl_scalegnn.parallel.products import linear_cost, parallel_linear, spmm_cost
from dgl_scalegnn.parallel.redistribute import redistribute_cost

__all__ = ["GINLayer"]


class GINLayer(GraphLayer):
    """:math:`\\mathrm{ReLU}(((1 + \\epsilon) X + A X) W_1 + b_1) W`.

    Examples
    --------
    >>> from dgl_scalegnn.config import ModelConfig
    >>> from dgl_scalegnn.core.schedule import LayerWidths, layer_layouts
    >>> widths = LayerWidths(0, 8, 4, outputs_classes=True, residual=False)
    >>> cfg = ModelConfig(conv="gin", gin_learn_eps=True)
    >>> sorted(GINLayer.parameter_shards(layer_layouts(1)[0], widths, cfg))
    ['layer0_eps', 'layer0_hidden_weight', 'layer0_weight']
    >>> from dgl_scalegnn.core.schedule import adjacency_planes
    >>> [str(plane) for plane in adjacency_planes(3, GINLayer.kind)]  # GCN: ZX, YZ, XY
    ['ZX', 'XZ']
    """

    kind = LayerKind(linears=2, normalisation="sum")

    @classmethod
    def product_shards(
        cls, layout: Layout, widths: LayerWidths, cfg: ModelConfig
    ) -> dict[str, ParamShard]:
        aggregated = layout.after_spmm()
        inner = aggregated.after_linear()
        shards = {
            "hidden_weight": ParamShard(
                (widths.width_in, cfg.hidden), (aggregated.cols, aggregated.rep)
            ),
            "weight": ParamShard((cfg.hidden, widths.width_out), (inner.cols, inner.rep)),
        }
        if cfg.bias:
            shards["hidden_bias"] = ParamShard((cfg.hidden,), (inner.cols,))
        if cfg.gin_learn_eps:
            shards["eps"] = ParamShard((), (), init=cfg.gin_eps)
        return shards

    def _eps(self, layout: Layout) -> torch.Tensor | float:
        """:math:`\\epsilon`: the learnt one, its gradient summed over the rows' and
        columns' axes of ``layout`` (it scales every element there), or the constant."""
        eps = self.params.get("eps")
        if eps is None:
            return self.cfg.gin_eps
        return reduce_grad(reduce_grad(eps, layout.rows, self.runtime), layout.cols, self.runtime)

    def product(self, inputs: LayerInput) -> Product:
        runtime, cfg = self.runtime, self.cfg
        aggregated, aggregated_spec = self.aggregate(inputs)
        own = self.own_rows_in(aggregated_spec.layout, inputs)
        combined = aggregated + (1 + self._eps(aggregated_spec.layout)) * own
        inner, inner_spec = parallel_linear(
            combined, self.params["hidden_weight"], aggregated_spec, cfg.hidden, runtime
        )
        inner = torch.relu(add_bias(inner, self.params.get("hidden_bias"), inner_spec, runtime))
        hidden, out_spec = parallel_linear(
            inner, self.params["weight"], inner_spec, self.widths.width_out, runtime
        )
        return Product(hidden, out_spec, combined, aggregated_spec)

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
        inner = aggregated.after_linear()
        costs = spmm_cost(layout, widths.width_in, sizes, needs_dx)
        costs += redistribute_cost(layout, aggregated, widths.width_in, sizes, needs_dx)
        costs += linear_cost(aggregated, widths.width_in, cfg.hidden, needs_dx, sizes)
        if cfg.bias:
            costs += reduce_grad_cost(inner.rows, sizes.cols(cfg.hidden, inner.cols))
        costs += linear_cost(inner, cfg.hidden, widths.width_out, True, sizes)
        if cfg.gin_learn_eps:
            costs += reduce_grad_cost(aggregated.rows, 1) + reduce_grad_cost(aggregated.cols, 1)
        return costs

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
        eps = params.get("eps", cfg.gin_eps)
        combined = aggregate_reference(graph, x, weight) + (1 + eps) * x
        inner = combined @ params["hidden_weight"]
        if "hidden_bias" in params:
            inner = inner + params["hidden_bias"]
        return torch.relu(inner) @ params["weight"], combined
