"""GIN (Xu et al.), DGL's ``GINConv`` with the sum aggregator and a two-layer MLP, on
the 3D PMM grid.

.. math::

    P = \\mathrm{ReLU}\\big(((1 + \\epsilon) X + A X) W_1 + b_1\\big) W

with :math:`A` the graph without self loops, :math:`\\epsilon` fixed at
``model.gin_eps`` or learnt (``model.gin_learn_eps``), :math:`W_1` ``hidden_weight``
(:math:`d_{in} \\times d_h`) and :math:`b_1` ``hidden_bias`` (with ``model.bias``). The
MLP's second product is the layer's output product; its bias and the tail follow as for
every layer.

**Under uniform vertex sampling** ``model.gin_sum`` chooses the estimator of the sum
:math:`(A X)_v = \\sum_{u \\in N(v)} x_u` from the sampled block :math:`\\tilde A_S`
(off-diagonal entries :math:`1/p`):

- ``degree_mean`` (the default): the full degree times the mean over the sampled
  neighbours, :math:`d_v \\, (\\tilde A_S X)_v / (\\tilde A_S \\mathbf 1)_v` (0 where no
  neighbour is drawn), SAGE's ratio scaled back to the sum. Biased (a ratio estimator;
  0 for a vertex none of whose neighbours is drawn, whose expected share is
  :math:`(1 - p)^{d_v}`) but of low variance: each row's scale is the full graph's;
- ``unbiased``: :math:`(\\tilde A_S X)_v`, the sampled neighbours' sum divided by
  :math:`p`. Its variance grows as :math:`1/p`: at :math:`p = 0.01` most rows aggregate
  nothing and a few a hundred times a neighbour.

``tests/test_convs.py`` measures both against the full-graph sum, and ``docs/
configuration.md`` what each trained. The degree is each sampled row's entry count
before sampling (:class:`~dgl_scalegnn.sampling.blocks.SampledBlock`), summed with the
sampled count over the ranks of the row's column blocks in one all-reduce. With every
neighbour in the batch (a full batch, or an evaluation, whose blocks are the whole
graph's) both are the exact sum: :math:`d_v / (\\tilde A_S \\mathbf 1)_v = 1`.

``residual_from: aggregated`` adds the MLP's input :math:`(1 + \\epsilon) X + A X`, a
sum whose scale grows with the degree: under sampling most rows draw few neighbours or
none, so training sees that residual near the scale of :math:`X`, the full-graph
evaluation at about :math:`d_v` times it (``docs/results.md`` measures GIN with and
without the residual).

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
from dgl_scalegnn.distributed.comm import all_reduce
from dgl_scalegnn.model.convs.base import GraphLayer, LayerInput, Product, aggregate_reference
from dgl_scalegnn.model.parameters import add_bias
from dgl_scalegnn.parallel.norm import reduce_grad, reduce_grad_cost
from dgl_scalegnn.parallel.partition import ShardSpec
from dgl_scalegnn.parallel.products import linear_cost, parallel_linear, spmm_cost
from dgl_scalegnn.parallel.redistribute import redistribute_cost
from dgl_scalegnn.sampling.blocks import FULL_DEGREE, SampledBlock

__all__ = ["GINLayer", "degree_mean"]


def degree_mean(summed: torch.Tensor, count: torch.Tensor, degree: torch.Tensor) -> torch.Tensor:
    """``summed * degree / count`` row by row: the full degree times the mean over the
    sampled neighbours (``summed`` their sum, ``count`` theirs, both in the sampler's
    :math:`1/p`, which cancels); a row without a sampled neighbour (``count`` 0, so
    ``summed`` 0) stays 0. Where ``count`` equals ``degree`` (every neighbour drawn) the
    scale is exactly 1, so a full batch is the exact sum. The ``(rows, 1)`` scale is
    made first, so the ``(rows, D)`` sums take one pass; without autograd in place.

    >>> degree_mean(torch.tensor([[4.0], [0.0]]), torch.tensor([[2.0], [0.0]]),
    ...             torch.tensor([[3.0], [5.0]])).tolist()
    [[6.0], [0.0]]
    """
    scale = degree / torch.where(count > 0, count, 1.0)
    return summed.mul_(scale) if not torch.is_grad_enabled() else summed * scale


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

    def estimates_by_degree(self, inputs: LayerInput) -> bool:
        """Whether the sum of ``inputs`` is :func:`degree_mean`'s: ``model.gin_sum:
        degree_mean`` on a sampled block (an evaluation's whole blocks sum exactly)."""
        return self.cfg.gin_sum == "degree_mean" and isinstance(inputs.adjacency, SampledBlock)

    def sampled_and_full_counts(
        self, inputs: LayerInput, like: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``(rows, 1)`` sampled neighbour count :math:`\\tilde A_S \\mathbf 1` and
        full degree of the block's rows, in ``like``'s dtype, without gradient: each
        rank's share over its columns, side by side in one all-reduce over the rows'
        axis of the input (the SpMM's, so the same ranks as the sum's)."""
        adjacency = inputs.adjacency
        runtime = self.runtime
        with runtime.profiler.region("spmm"):
            local = torch.cat(
                (adjacency.row_sums(like), adjacency.row_lengths.to(like.dtype).unsqueeze(1)), 1
            )
        group = runtime.grid.group(inputs.spec.layout.rows)
        total = all_reduce(local, group, runtime.profiler, low_precision=runtime.options.bf16)
        return total[:, :1], total[:, 1:]

    def aggregate_sum(self, inputs: LayerInput) -> tuple[torch.Tensor, ShardSpec]:
        """The estimate of :math:`A X` that ``model.gin_sum`` chooses (the exact sum on
        the whole graph), in the layout after the SpMM."""
        summed, spec = self.aggregate(inputs)
        if not self.estimates_by_degree(inputs):
            return summed, spec
        return degree_mean(summed, *self.sampled_and_full_counts(inputs, summed)), spec

    def product(self, inputs: LayerInput) -> Product:
        runtime, cfg = self.runtime, self.cfg
        aggregated, aggregated_spec = self.aggregate_sum(inputs)
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
        if cfg.gin_sum == "degree_mean" and sizes.sampled:  # count and degree, forward only
            costs.append(
                CollectiveCost(layout.rows, 2 * sizes.rows(layout.rep), low_precision=True)
            )
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
        summed = aggregate_reference(graph, x, weight)
        if cfg.gin_sum == "degree_mean" and FULL_DEGREE in graph.ndata:  # a sampled graph
            count = aggregate_reference(graph, x.new_ones(x.shape[0], 1), weight)
            summed = degree_mean(summed, count, graph.ndata[FULL_DEGREE].to(x.dtype)[:, None])
        combined = summed + (1 + eps) * x
        inner = combined @ params["hidden_weight"]
        if "hidden_bias" in params:
            inner = inner + params["hidden_bias"]
        return torch.relu(inner) @ params["weight"], combined
