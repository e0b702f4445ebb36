"""GraphSAGE with the mean aggregator, DGL's ``SAGEConv(aggregator_type='mean')``, on
the 3D PMM grid.

.. math::

    P = X W_{self} + \\mathrm{mean}_{u \\in N(v)}(x_u) W, \\qquad
    \\mathrm{mean}_{u \\in N(v)}(x_u) = \\frac{(A X)_v}{(A \\mathbf{1})_v}

with :math:`A` the graph without self loops (``sum`` normalisation): the mean is the
ratio of two sums over the same block, :math:`A X` and the neighbour count
:math:`A \\mathbf 1` (the block's row sums, without backward). An isolated vertex
aggregates 0, as in DGL.

**Under uniform vertex sampling** the ratio over the sampled block is the mean over the
sampled neighbours, :math:`\\frac{1}{|N(v) \\cap S|} \\sum_{u \\in N(v) \\cap S} x_u` (0
when none is drawn; the sampler's :math:`1/p` cancels), as DGL's neighbour-sampled
``SAGEConv`` computes it. It is biased (its error is 1.7 standard errors on average in
``tests/test_convs.py``, against 0.8 for an unbiased estimator) but of low variance. The
unbiased alternative, the sum over the sampled neighbours divided by the *full* degree
and by :math:`p`, has a variance that grows as :math:`1/p`: at :math:`p = 0.01` most rows
aggregate nothing and a few ten times the mean. Measured on the sparse 1M graph (one
process, the preset's model and settings, B = N/40): 0.803 / 0.826 test accuracy after
2.4 / 8.9 s of training with the sampled mean, 0.767 / 0.802 with the unbiased sum.
Full-graph evaluation (every neighbour in the batch) computes the exact mean with either.

Input ``(r, c, o)``: the SpMM gives ``(o, c, r)``; the layer input moves to that layout
too, and both products share one all-reduce: ``[X | mean] [W_{self}; W]`` over the
columns' axis, to ``(o, r, c)`` (GCN's rotation), computed as
:math:`X W_{self} + \\mathrm{mean} \\, W` without joining the two
(:func:`~dgl_scalegnn.parallel.products.parallel_linear_sum`). The count
:math:`A \\mathbf 1` is the block's row sums, which never read a column of ones
(:func:`~dgl_scalegnn.parallel.products.parallel_row_sums`).

On one TP rank a layer that narrows aggregates :math:`X W` instead,
:math:`\\mathrm{mean}(X) W = D^{-1} A (X W)` (DGL's ``SAGEConv`` order where
:math:`d_{in} > d_{out}`): the SpMM reads :math:`d_{out}` columns
(:meth:`GraphLayer.narrows_first
<dgl_scalegnn.model.convs.base.GraphLayer.narrows_first>`). One product
:math:`X [W | W_{self}]` gives both terms of every row, so the input is read once.
"""

from __future__ import annotations

import torch

from dgl_scalegnn._dgl import dgl
from dgl_scalegnn.config import ModelConfig
from dgl_scalegnn.core.cost import CollectiveCost, LocalSizes
from dgl_scalegnn.core.layout import Layout
from dgl_scalegnn.core.schedule import LayerKind, LayerWidths, ParamShard
from dgl_scalegnn.model.convs.base import GraphLayer, LayerInput, Product, aggregate_reference
from dgl_scalegnn.parallel.products import (
    linear_cost,
    parallel_linear_sum,
    parallel_row_sums,
    parallel_spmm,
    spmm_cost,
)
from dgl_scalegnn.parallel.redistribute import redistribute_cost

__all__ = ["SAGELayer", "neighbour_mean"]


def neighbour_mean(summed: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """``summed / count`` row by row; a row without neighbours (``count`` 0, so its
    ``summed`` is 0) stays 0. The guard is on the ``(rows, 1)`` count, so the ``(rows,
    D)`` sums take one pass (a ``where`` over them took 5x as long on the CPU); without
    autograd (an evaluation) in place, over the SpMM's own new matrix.

    >>> neighbour_mean(torch.tensor([[2.0], [0.0]]), torch.tensor([[2.0], [0.0]])).tolist()
    [[1.0], [0.0]]
    """
    divisor = torch.where(count > 0, count, 1.0)
    return summed.div_(divisor) if not torch.is_grad_enabled() else summed / divisor


class SAGELayer(GraphLayer):
    """:math:`X W_{self} + \\mathrm{mean}_{N(v)}(X) W` (parameters ``self_weight`` and
    ``weight``, both :math:`d_{in} \\times d_{out}`; DGL's ``fc_self`` and ``fc_neigh``).

    Examples
    --------
    >>> from dgl_scalegnn.config import ModelConfig
    >>> from dgl_scalegnn.core.schedule import LayerWidths, layer_layouts
    >>> widths = LayerWidths(1, 8, 8, outputs_classes=False, residual=True)
    >>> sorted(SAGELayer.parameter_shards(layer_layouts(2)[1], widths, ModelConfig()))
    ['layer1_gain', 'layer1_self_weight', 'layer1_weight']
    """

    kind = LayerKind(linears=1, normalisation="sum")
    #: ``[W | W_self]``: one pass over the input gives the aggregated term and the self
    #: term of every row.
    narrowing_weights = ("weight", "self_weight")

    @classmethod
    def product_shards(
        cls, layout: Layout, widths: LayerWidths, cfg: ModelConfig
    ) -> dict[str, ParamShard]:
        aggregated = layout.after_spmm()
        shard = ParamShard((widths.width_in, widths.width_out), (aggregated.cols, aggregated.rep))
        return {"self_weight": shard, "weight": shard}

    def product(self, inputs: LayerInput) -> Product:
        widths, runtime, spec, adjacency = self.widths, self.runtime, inputs.spec, inputs.adjacency
        narrowed = self.narrowed(inputs)
        like = inputs.x if narrowed is None else narrowed.rows  # the count's dtype and device
        count = parallel_row_sums(like, adjacency, spec, runtime)[0]  # no gradient
        if narrowed is not None:  # one TP rank: every layout is the whole matrix
            out = widths.width_out  # narrowed: [X W | X W_self]
            narrow_spec = spec.with_layout(spec.layout, out)
            summed, aggregated_spec = parallel_spmm(
                narrowed.rows[:, :out], adjacency, narrow_spec, runtime
            )
            mean = neighbour_mean(summed, count)  # mean(X) W
            out_spec = aggregated_spec.with_layout(aggregated_spec.layout.after_linear(), out)
            own = narrowed.own[:, out:]
            # without autograd into the SpMM's own new matrix (no residual reads it here)
            hidden = mean.add_(own) if not torch.is_grad_enabled() else own + mean
            return Product(hidden, out_spec, mean, aggregated_spec)
        summed, aggregated_spec = self.aggregate(inputs)
        mean = neighbour_mean(summed, count)
        aggregated_spec = aggregated_spec.with_layout(aggregated_spec.layout, mean.shape[1])
        own = self.own_rows_in(aggregated_spec.layout, inputs)
        # Both factors split their columns along the same axis, so the local blocks side
        # by side are a block of [X | mean] and one all-reduce completes both products.
        hidden, out_spec = parallel_linear_sum(
            ((own, self.params["self_weight"]), (mean, self.params["weight"])),
            aggregated_spec,
            widths.width_out,
            runtime,
        )
        return Product(hidden, out_spec, mean, aggregated_spec)

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
        # the neighbour count: one column on every rank (not split), forward only
        costs.append(CollectiveCost(layout.rows, sizes.rows(layout.rep), low_precision=True))
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
        count = aggregate_reference(graph, x.new_ones(x.shape[0], 1), weight)
        mean = neighbour_mean(aggregate_reference(graph, x, weight), count)
        return x @ params["self_weight"] + mean @ params["weight"], mean
