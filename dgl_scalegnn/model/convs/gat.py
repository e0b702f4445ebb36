"""GAT (Veličković et al.), DGL's ``GATConv`` (version 1), on the 3D PMM grid.

.. math::

    Z = X W, \\qquad
    e^h_{uv} = \\mathrm{LeakyReLU}\\big(a^h_l \\cdot z^h_u + a^h_r \\cdot z^h_v\\big), \\qquad
    \\alpha^h_{uv} = \\frac{\\exp e^h_{uv}}{\\sum_{u' \\in N(v)} \\exp e^h_{u'v}}, \\qquad
    P^h_v = \\sum_{u \\in N(v)} \\alpha^h_{uv} z^h_u

over the in-edges of the graph with one self loop a vertex, :math:`z^h_u` the columns of
head :math:`h` of :math:`Z` (parameters ``weight``, :math:`d_{in} \\times H F`, and the
attention vectors ``attn_l``, ``attn_r``, :math:`H F` each). Only the adjacency's
structure counts: the blocks are the symmetric normalisation's (:math:`A + I`), whose
values, the sampler's :math:`1/p` among them, no product reads. A hidden layer puts its
``model.gat_heads`` heads side by side (``hidden`` columns of ``hidden / gat_heads``);
the layer that outputs the classes (``head: false``) averages its ``model.gat_out_heads``
heads, as DGL's GAT example does. With ``model.gat_residual`` the input is added to
every head's output before that mean (DGL's residual: :math:`X` itself where its width
is :math:`H F`, else :math:`X R` with ``residual_weight``); then the output bias and the
tail (RMSNorm, ReLU, dropout, the tail's residual) where those switches are on.
Attention dropout (``model.gat_attn_dropout``) drops :math:`\\alpha^h_{uv}` by a hash of
the step, the layer, the edge's global ends and the head: every grid drops the same.

**Under uniform vertex sampling** the softmax runs over the sampled neighbours (the self
loop always among them), as DGL's neighbour-sampled ``GATConv`` does: :math:`P^h_v` is
then the attention-weighted mean of :math:`z^h_u` over :math:`(N(v) \\cap S) \\cup
\\{v\\}`, a ratio of two sums over the same sample, :math:`\\sum_{u \\in S} w_{uv} z_u /
\\sum_{u \\in S} w_{uv}` with :math:`w_{uv} = \\exp e_{uv}`, in which the self loop always
counts and each neighbour with probability :math:`p`: a ratio estimator of the
full-graph attention aggregate, biased towards :math:`z_v` (the self loop's share of the
attention is above the full graph's where few neighbours are drawn), its bias shrinking
as :math:`p` grows, and exact where every neighbour is in the batch (evaluation, a full
batch). ``tests/test_gat.py`` measures its error and bias.

Input ``(r, c, o)``: :math:`X W` gives ``(r, o, c)`` (rows along ``r``, the heads' columns
along ``o``), and the SpMM of the attention reads plane ``(c, r)``, giving ``(c, o, r)``
(:class:`~dgl_scalegnn.core.schedule.LayerKind` with ``linear_first``). Each rank's
block holds the edges from its ``r`` rows to its ``c`` rows:

- :math:`a_l \\cdot z_u` and :math:`a_r \\cdot z_v` are sums over a head's columns, partial
  over ``o``: one all-reduce over ``o`` of ``(rows, 2H)``; the destinations' terms move
  from rows along ``r`` to rows along ``c`` (:func:`rows_along`);
- the logits of the block's edges are an SDDMM over its rows and columns
  (``(E_local, H)``, no ``(E, F)`` or ``N x N`` tensor), the softmax per row spans the
  ranks along ``r`` that hold the row's column blocks: row max and row sum all-reduced
  over ``r`` in float32 (:func:`edge_softmax`);
- the weighted SpMM, one CSR per head over the head's local columns, all-reduced over
  ``r`` like every SpMM (:func:`attention_spmm`), and its gradient of :math:`\\alpha`
  an SDDMM of the output's gradient and :math:`Z` (partial over ``o``: every sum after
  it is linear, so the all-reduce over ``o`` of the logits' gradients completes it).

In a chunked evaluation :math:`X W` is the layer's narrowed input, made once for every
chunk on any grid (:meth:`GATLayer.narrows_first`; with a residual, which reads the
input's rows, it is made once from the input instead), and the sources' terms
:math:`a_l \\cdot z_u` once from it.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from typing import Any

import torch

from dgl_scalegnn._dgl import dgl
from dgl_scalegnn.config import ModelConfig
from dgl_scalegnn.core.cost import CollectiveCost, LocalSizes
from dgl_scalegnn.core.layout import Axis, Layout
from dgl_scalegnn.core.schedule import LayerKind, LayerWidths, ParamShard
from dgl_scalegnn.core.seeds import mix_seed
from dgl_scalegnn.distributed.comm import Runtime, all_reduce
from dgl_scalegnn.model.convs.base import GraphLayer, LayerInput, Product
from dgl_scalegnn.model.layers import InputProjection
from dgl_scalegnn.parallel.dropout_hash import dropout_hashes, dropout_keep
from dgl_scalegnn.parallel.norm import reduce_grad, reduce_grad_cost
from dgl_scalegnn.parallel.partition import ShardSpec
from dgl_scalegnn.parallel.products import linear_cost, parallel_linear, spmm_cost
from dgl_scalegnn.parallel.redistribute import redistribute, redistribute_cost
from dgl_scalegnn.parallel.spmm import csr_tensor

__all__ = [
    "GATLayer",
    "attention_keep",
    "attention_spmm",
    "edge_softmax",
    "head_scores",
    "rows_along",
]

#: Salts of the attention dropout's hashes of an edge's destination and source.
_DESTINATION_SALT, _SOURCE_SALT = 1, 2

#: A head's share of the local columns: ``(head, first, stop)``.
LocalHead = tuple[int, int, int]


def _local_heads(col_start: int, col_stop: int, head_width: int) -> list[LocalHead]:
    """The heads among global columns ``[col_start, col_stop)`` of heads of ``head_width``
    columns, each with its local columns ``[first, stop)``.

    >>> _local_heads(3, 9, 4)
    [(0, 0, 1), (1, 1, 5), (2, 5, 6)]
    """
    heads = []
    for head in range(col_start // head_width, math.ceil(col_stop / head_width)):
        first = max(col_start, head * head_width) - col_start
        stop = min(col_stop, (head + 1) * head_width) - col_start
        if first < stop:
            heads.append((head, first, stop))
    return heads


def _membership(heads: list[LocalHead], num_cols: int, num_heads: int, like: torch.Tensor):
    """``(num_cols, num_heads)`` ones where a local column belongs to a head."""
    out = like.new_zeros(num_cols, num_heads)
    for head, first, stop in heads:
        out[first:stop, head] = 1.0
    return out


def attention_keep(
    key: int, destinations: torch.Tensor, sources: torch.Tensor, heads: int, rate: float
) -> torch.Tensor:
    """Keep-mask ``(E, heads)`` (bytes) of the attention dropout of edges ``sources ->
    destinations`` (global vertex ids): a hash of ``key`` (seed, step and layer), both
    ends and the head, so that every grid, and the single-process oracle, drops the same.

    >>> mask = attention_keep(7, torch.arange(1000), torch.arange(1000) + 1, 4, rate=0.25)
    >>> mask.shape, 0.7 < mask.float().mean().item() < 0.8
    (torch.Size([1000, 4]), True)
    """
    destination_hash = dropout_hashes(mix_seed(key, _DESTINATION_SALT), destinations, 0, 0)[0]
    pairs = sources.reshape(-1, 1) * heads + torch.arange(heads, device=sources.device)
    source_hash = dropout_hashes(mix_seed(key, _SOURCE_SALT), pairs.reshape(-1), 0, 0)[0]
    return dropout_keep(destination_hash, source_hash.view(-1, heads), rate)


class _HeadScoresFn(torch.autograd.Function):
    """``(rows, k)``: each row's dot products with the vectors spread over ``weights``
    ``(cols, k)`` (zero where a column is not a vector's head's), partial over the
    columns' ``axis``: all-reduced there forward, and backward too (the ranks along
    ``axis`` hold different columns of the heads, so their gradients are partial)."""

    @staticmethod
    def forward(ctx: Any, z: torch.Tensor, weights: torch.Tensor, runtime: Runtime, axis: Axis):
        ctx.save_for_backward(z, weights)
        ctx.runtime, ctx.axis = runtime, axis
        with runtime.profiler.region("gemm"):
            partial = z @ weights
        return all_reduce(partial, runtime.grid.group(axis), runtime.profiler)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        z, weights = ctx.saved_tensors
        runtime = ctx.runtime
        grad = all_reduce(grad.contiguous(), runtime.grid.group(ctx.axis), runtime.profiler)
        with runtime.profiler.region("gemm"):
            grad_z = grad @ weights.t() if ctx.needs_input_grad[0] else None
            grad_weights = z.t() @ grad if ctx.needs_input_grad[1] else None
        return grad_z, grad_weights, None, None


def head_scores(
    z: torch.Tensor,
    vectors: list[torch.Tensor],
    heads: list[LocalHead],
    num_heads: int,
    axis: Axis,
    runtime: Runtime,
) -> torch.Tensor:
    """``(rows, len(vectors) * num_heads)``: per vector and head, :math:`a^h \\cdot z^h` of
    every row of ``z`` (its local columns, split along ``axis``; ``vectors`` this rank's
    columns of each), summed over ``axis`` (one all-reduce of them all)."""
    membership = _membership(heads, z.shape[1], num_heads, z)
    weights = torch.cat([membership * vector.unsqueeze(1) for vector in vectors], dim=1)
    return _HeadScoresFn.apply(z, weights, runtime, axis)


class _RowsAlongFn(torch.autograd.Function):
    """A matrix replicated along ``dst`` with rows along ``src`` -> replicated along
    ``src`` with rows along ``dst``: each rank writes the rows its two parts share (one
    slice: both are slices of the sorted rows) into zeros, and the ranks along ``src``
    sum them. Backward: the gradient is summed over ``src`` (its ranks consume the rows
    differently), its shared rows written back, and summed over ``dst``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, spec: ShardSpec, src: Axis, dst: Axis, runtime):
        grid = runtime.grid
        (a0, a1), (b0, b1) = (spec.rows.range(axis, grid.coord(axis)) for axis in (src, dst))
        lo, hi = max(a0, b0), max(max(a0, b0), min(a1, b1))
        ctx.runtime, ctx.src, ctx.dst = runtime, src, dst
        ctx.slices = slice(lo - a0, hi - a0), slice(lo - b0, hi - b0), a1 - a0
        out = x.new_zeros(b1 - b0, x.shape[1])
        out[ctx.slices[1]] = x[ctx.slices[0]]
        return all_reduce(out, grid.group(src), runtime.profiler)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        runtime = ctx.runtime
        grid, profiler = runtime.grid, runtime.profiler
        grad = all_reduce(grad.contiguous(), grid.group(ctx.src), profiler)
        source, destination, rows = ctx.slices
        out = grad.new_zeros(rows, grad.shape[1])
        out[source] = grad[destination]
        return all_reduce(out, grid.group(ctx.dst), profiler), None, None, None, None


def rows_along(
    x: torch.Tensor, spec: ShardSpec, src: Axis, dst: Axis, runtime: Runtime
) -> torch.Tensor:
    """``x`` (rows of ``spec`` along ``src``, every column; replicated along ``dst``) with
    its rows along ``dst`` instead: GAT's destination terms at the block's output rows.
    A no-op where the two axes split the rows alike (one rank each)."""
    shape = runtime.grid.shape
    if shape.size(src) == 1 and shape.size(dst) == 1:
        return x
    return _RowsAlongFn.apply(x, spec, src, dst, runtime)


class _EdgeSoftmaxFn(torch.autograd.Function):
    """Per row and head, the softmax of ``logits`` ``(E, H)`` over the row's edges, which
    the ranks along ``axis`` share: the row max (all-reduced, a constant: no gradient)
    and the row sum of the exponentials all-reduced in float32. Backward
    :math:`\\partial e = \\alpha \\odot (\\partial \\alpha - \\sum_u \\alpha\\, \\partial
    \\alpha)`, the row sums all-reduced over ``axis`` too."""

    @staticmethod
    def forward(ctx: Any, logits, rows, num_rows: int, runtime: Runtime, axis: Axis):
        group, profiler = runtime.grid.group(axis), runtime.profiler
        index = rows.unsqueeze(1).expand_as(logits)
        with profiler.region("elementwise"):
            peak = logits.new_full((num_rows, logits.shape[1]), -math.inf)
            peak.scatter_reduce_(0, index, logits, reduce="amax")
        peak = all_reduce(peak, group, profiler, op=torch.distributed.ReduceOp.MAX)
        with profiler.region("elementwise"):
            weights = (logits - peak.index_select(0, rows)).exp_()
            total = logits.new_zeros(num_rows, logits.shape[1]).index_add_(0, rows, weights)
        total = all_reduce(total, group, profiler)
        with profiler.region("elementwise"):
            alpha = weights.div_(total.index_select(0, rows))
        ctx.save_for_backward(alpha, rows)
        ctx.runtime, ctx.axis, ctx.num_rows = runtime, axis, num_rows
        return alpha

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        alpha, rows = ctx.saved_tensors
        runtime = ctx.runtime
        weighted = alpha * grad
        with runtime.profiler.region("elementwise"):
            sums = weighted.new_zeros(ctx.num_rows, alpha.shape[1]).index_add_(0, rows, weighted)
        sums = all_reduce(sums, runtime.grid.group(ctx.axis), runtime.profiler)
        with runtime.profiler.region("elementwise"):
            grad_logits = weighted.sub_(alpha * sums.index_select(0, rows))
        return grad_logits, None, None, None, None


def edge_softmax(
    logits: torch.Tensor, rows: torch.Tensor, num_rows: int, axis: Axis, runtime: Runtime
) -> torch.Tensor:
    """:math:`\\alpha` ``(E, H)``: the softmax of ``logits`` over each of the ``num_rows``
    rows' edges (``rows`` the edges' local rows), the rows' other edges on the ranks
    along ``axis`` (every rank of a row must call it)."""
    return _EdgeSoftmaxFn.apply(logits.float(), rows, num_rows, runtime, axis)


def _csr(
    rows: torch.Tensor, cols: torch.Tensor, values: torch.Tensor, shape: tuple[int, int]
) -> torch.Tensor:
    boundaries = torch.arange(shape[0] + 1, dtype=rows.dtype, device=rows.device)
    return csr_tensor(torch.searchsorted(rows, boundaries), cols, values, shape)


class _AttentionSpMMFn(torch.autograd.Function):
    """Per local head, :math:`\\alpha^h` (as a CSR of the block's entries) times ``z``'s
    columns of the head, all-reduced over the input's rows' axis; backward the
    transposed products (``dZ``, all-reduced over its replication axis) and the SDDMM
    of the output's gradient with ``z`` at the block's entries (``d alpha``, partial
    over the columns' axis)."""

    @staticmethod
    def forward(
        ctx: Any,
        alpha: torch.Tensor,
        z: torch.Tensor,
        structure: tuple[torch.Tensor, torch.Tensor],
        num_rows: int,
        heads: list[LocalHead],
        runtime: Runtime,
        layout: Layout,
    ):
        rows, cols = structure
        ctx.save_for_backward(alpha, z)
        ctx.structure, ctx.num_rows, ctx.heads = structure, num_rows, heads
        ctx.runtime, ctx.layout = runtime, layout
        out = z.new_zeros(num_rows, z.shape[1])
        if rows.numel():
            with runtime.profiler.region("spmm"):
                for head, first, stop in heads:
                    values = alpha[:, head].to(z.dtype)
                    matrix = _csr(rows, cols, values, (num_rows, z.shape[0]))
                    out[:, first:stop] = matrix @ z[:, first:stop]
        return all_reduce(
            out,
            runtime.grid.group(layout.rows),
            runtime.profiler,
            low_precision=runtime.options.bf16,
        )

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        alpha, z = ctx.saved_tensors
        rows, cols = ctx.structure
        runtime, layout, num_rows = ctx.runtime, ctx.layout, ctx.num_rows
        grad = grad.contiguous()
        grad_alpha = torch.zeros_like(alpha) if ctx.needs_input_grad[0] else None
        grad_z = torch.zeros_like(z) if ctx.needs_input_grad[1] else None
        if rows.numel():
            order = torch.argsort(cols, stable=True)
            rows_t, cols_t = cols.index_select(0, order), rows.index_select(0, order)
            pattern = _csr(rows, cols, alpha.new_ones(rows.numel()), (num_rows, z.shape[0]))
            with runtime.profiler.region("spmm"):
                for head, first, stop in ctx.heads:
                    columns = slice(first, stop)
                    if grad_z is not None:
                        values = alpha[:, head].index_select(0, order).to(z.dtype)
                        matrix = _csr(rows_t, cols_t, values, (z.shape[0], num_rows))
                        grad_z[:, columns] = matrix @ grad[:, columns]
                    if grad_alpha is not None:
                        sampled = torch.sparse.sampled_addmm(
                            pattern, grad[:, columns], z[:, columns].t(), beta=0.0
                        )
                        grad_alpha[:, head] = sampled.values()
        if grad_z is not None:
            grad_z = all_reduce(
                grad_z,
                runtime.grid.group(layout.rep),
                runtime.profiler,
                low_precision=runtime.options.bf16,
            )
        return grad_alpha, grad_z, None, None, None, None, None


def attention_spmm(
    alpha: torch.Tensor,
    z: torch.Tensor,
    structure: tuple[torch.Tensor, torch.Tensor],
    num_rows: int,
    heads: list[LocalHead],
    layout: Layout,
    runtime: Runtime,
) -> torch.Tensor:
    """:math:`P^h = \\alpha^h Z^h` of every local head: ``z`` in ``layout`` ``(a, b, e)``
    (every input row the block's columns read), ``alpha`` ``(E, H)`` at the block's
    entries ``structure``; the result ``(num_rows, local columns)`` in ``(e, b, a)``, as
    :func:`~dgl_scalegnn.parallel.products.parallel_spmm`."""
    return _AttentionSpMMFn.apply(alpha, z, structure, num_rows, heads, runtime, layout)


class _HeadMeanFn(torch.autograd.Function):
    """The mean over the heads of a ``(rows, heads x width)`` matrix whose columns are
    split along ``axis``: each rank adds its columns into the ``width`` columns of the
    mean, the sum is all-reduced over ``axis`` and each rank keeps its columns of it.
    Backward: its columns' gradient padded into every column, summed over ``axis``."""

    @staticmethod
    def forward(
        ctx: Any, x, col_start: int, cols: tuple[int, int], width: int, heads: int, runtime, axis
    ):
        columns = (col_start + torch.arange(x.shape[1], device=x.device)) % width
        spread = x.new_zeros(x.shape[1], width)
        spread[torch.arange(x.shape[1], device=x.device), columns] = 1.0 / heads
        ctx.save_for_backward(spread)
        ctx.runtime, ctx.axis, ctx.cols, ctx.width = runtime, axis, cols, width
        with runtime.profiler.region("gemm"):
            mean = x @ spread
        group, bf16 = runtime.grid.group(axis), runtime.options.bf16
        mean = all_reduce(mean, group, runtime.profiler, low_precision=bf16)
        return mean[:, cols[0] : cols[1]].contiguous()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        (spread,) = ctx.saved_tensors
        runtime = ctx.runtime
        padded = grad.new_zeros(grad.shape[0], ctx.width)
        padded[:, ctx.cols[0] : ctx.cols[1]] = grad
        group, bf16 = runtime.grid.group(ctx.axis), runtime.options.bf16
        padded = all_reduce(padded, group, runtime.profiler, low_precision=bf16)
        with runtime.profiler.region("gemm"):
            return padded @ spread.t(), None, None, None, None, None, None


class _OncePerMatrix:
    """What a layer derives from a whole-graph matrix that every chunk of an evaluation
    hands it (its input, or its narrowed input): made at the first chunk, kept while
    that matrix lives (a weak reference to it) and dropped with it."""

    def __init__(self) -> None:
        self._matrix: weakref.ref | None = None
        self._value: torch.Tensor | None = None

    def get(self, matrix: torch.Tensor, make: Callable[[], torch.Tensor]) -> torch.Tensor:
        if self._matrix is None or self._matrix() is not matrix:
            self._matrix = self._value = None
            self._value = make()
            self._matrix = weakref.ref(matrix, self._forget)
        return self._value

    def _forget(self, reference: weakref.ref) -> None:
        if self._matrix is reference:
            self._matrix = self._value = None


class GATLayer(GraphLayer):
    """:math:`\\Vert_h \\sum_u \\alpha^h_{uv} z^h_u` (a hidden layer) or
    :math:`\\frac{1}{H} \\sum_h \\sum_u \\alpha^h_{uv} z^h_u` (the layer that outputs the
    classes), :math:`Z = X W`; parameters ``weight``, ``attn_l``, ``attn_r`` and, with a
    residual of another width, ``residual_weight`` (DGL's ``fc``, ``attn_l``,
    ``attn_r``, ``res_fc``).

    Examples
    --------
    >>> from dgl_scalegnn.config import ModelConfig
    >>> from dgl_scalegnn.core.schedule import LayerWidths, adjacency_planes, layer_layouts
    >>> widths = LayerWidths(0, 6, 4, outputs_classes=True, residual=False)  # Z: 2 x 4
    >>> cfg = ModelConfig(conv="gat", gat_out_heads=2, gat_residual=True)
    >>> sorted(GATLayer.parameter_shards(layer_layouts(1)[0], widths, cfg))
    ['layer0_attn_l', 'layer0_attn_r', 'layer0_residual_weight', 'layer0_weight']
    >>> [str(plane) for plane in adjacency_planes(3, GATLayer.kind)]  # GCN: ZX, YZ, XY
    ['YX', 'ZY', 'XZ']
    """

    kind = LayerKind(linears=1, normalisation="symmetric", linear_first=True)
    narrowing_weights = ("weight",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._projected_rows = _OncePerMatrix()  # X W of an evaluation's input
        self._source_scores = _OncePerMatrix()  # a_l . z_u of its X W
        self._step = 0

    def forward(self, inputs: LayerInput, step: int) -> tuple[torch.Tensor, ShardSpec]:
        """:meth:`GraphLayer.forward`; ``step`` keys the attention dropout too."""
        self._step = step
        return super().forward(inputs, step)

    # ---- shapes -------------------------------------------------------------------

    @staticmethod
    def num_heads(widths: LayerWidths, cfg: ModelConfig) -> int:
        """Heads of the layer: the output's heads for the layer that outputs the classes."""
        return cfg.gat_out_heads if widths.outputs_classes else cfg.gat_heads

    @classmethod
    def head_width(cls, widths: LayerWidths, cfg: ModelConfig) -> int:
        """Columns of one head: the classes' (averaged heads), or a share of the hidden's."""
        if widths.outputs_classes:
            return widths.width_out
        return widths.width_out // cls.num_heads(widths, cfg)

    @classmethod
    def projected_width(cls, widths: LayerWidths, cfg: ModelConfig) -> int:
        """Columns of :math:`Z = X W`: every head's."""
        return cls.num_heads(widths, cfg) * cls.head_width(widths, cfg)

    @classmethod
    def narrows_first(
        cls, widths: LayerWidths, tp_size: int, projected: bool, cfg: ModelConfig
    ) -> bool:
        """Always multiplied first, on any grid, where no residual reads the input's rows
        (the tail's or DGL's): :math:`X W` then replaces the input."""
        return not widths.residual and not cfg.gat_residual

    @classmethod
    def narrowed_width(cls, widths: LayerWidths, cfg: ModelConfig) -> int:
        return cls.projected_width(widths, cfg)

    @classmethod
    def product_shards(
        cls, layout: Layout, widths: LayerWidths, cfg: ModelConfig
    ) -> dict[str, ParamShard]:
        projected = layout.after_linear()
        width = cls.projected_width(widths, cfg)
        matrix = ParamShard((widths.width_in, width), (layout.cols, layout.rep))
        # DGL draws them as a (1, H, F) tensor: fans H F and F
        vector = ParamShard((width,), (projected.cols,), fans=(width, cls.head_width(widths, cfg)))
        shards = {"weight": matrix, "attn_l": vector, "attn_r": vector}
        if cfg.gat_residual and widths.width_in != width:
            shards["residual_weight"] = matrix
        return shards

    # ---- the product --------------------------------------------------------------

    def narrowed_input(
        self, x: torch.Tensor, spec: ShardSpec, projection: InputProjection | None
    ) -> torch.Tensor | None:
        widths, tp_size = self.widths, self.runtime.grid.shape.tp_size
        if x.requires_grad or not self.narrows_first(
            widths, tp_size, projection is not None, self.cfg
        ):
            return None
        return self._times_weight(x, spec, projection)

    def _times_weight(
        self, x: torch.Tensor, spec: ShardSpec, projection: InputProjection | None
    ) -> torch.Tensor:
        """:math:`X W` of the rows of ``x`` (in ``spec``'s layout); with a folded
        projection (one TP rank) :math:`X (W_{in} W) + b_{in} W` of the features."""
        weight, runtime = self.params["weight"], self.runtime
        if projection is not None:
            with runtime.profiler.region("gemm"):
                out = x @ (projection.weight @ weight)
                return out if projection.bias is None else out + projection.bias @ weight
        input_spec = spec.with_layout(spec.layout, self.widths.width_in)
        width = self.projected_width(self.widths, self.cfg)
        return parallel_linear(x, weight, input_spec, width, runtime)[0]

    def _projected(self, inputs: LayerInput) -> tuple[torch.Tensor, torch.Tensor]:
        """:math:`Z` of every input row, and of the output rows (rows along the input's)."""
        evaluation = inputs.evaluation
        if evaluation is None:  # a training step: the output rows are the input rows
            z = self._times_weight(inputs.x, inputs.spec, None)
            return z, z
        if evaluation.narrowed is not None:
            return evaluation.narrowed, evaluation.own
        x, spec, projection = inputs.x, inputs.spec, inputs.projection
        rows = self._projected_rows.get(x, lambda: self._times_weight(x, spec, projection))
        return rows, self._times_weight(evaluation.own, spec, projection)

    def product(self, inputs: LayerInput) -> Product:
        widths, cfg, runtime, spec = self.widths, self.cfg, self.runtime, inputs.spec
        grid = runtime.grid
        projected = spec.layout.after_linear()  # (r, o, c): rows along r, heads along o
        out_layout = projected.after_spmm()  # (c, o, r)
        heads, width = self.num_heads(widths, cfg), self.projected_width(widths, cfg)
        z, z_own = self._projected(inputs)
        z_spec = spec.with_layout(projected, width)
        col_start, col_stop = z_spec.col_range(grid.shape, grid.coords)
        local = _local_heads(col_start, col_stop, self.head_width(widths, cfg))
        attn_l, attn_r = (
            reduce_grad(self.params[name], projected.rows, runtime) for name in ("attn_l", "attn_r")
        )

        def scores(rows: torch.Tensor, *vectors: torch.Tensor) -> torch.Tensor:
            return head_scores(rows, list(vectors), local, heads, projected.cols, runtime)

        if inputs.evaluation is None:  # one all-reduce for both
            source, destination = scores(z, attn_l, attn_r).split(heads, dim=1)
        else:
            source = self._source_scores.get(z, lambda: scores(z, attn_l))
            destination = scores(z_own, attn_r)
        source = reduce_grad(source, projected.rep, runtime)  # its edges' rows differ along c
        destination = rows_along(destination, spec, projected.rows, out_layout.rows, runtime)
        adjacency = inputs.adjacency
        rows, cols = adjacency.structure()
        with runtime.profiler.region("elementwise"):
            logits = source.index_select(0, cols) + destination.index_select(0, rows)
            logits = torch.nn.functional.leaky_relu(logits, cfg.gat_negative_slope)
        alpha = edge_softmax(logits, rows, adjacency.num_rows, projected.rows, runtime)
        if self.training and cfg.gat_attn_dropout > 0:
            grid_rows = (out_layout.rows, projected.rows)
            ends = (spec.rows.ids(axis, grid.coord(axis)) for axis in grid_rows)
            destinations, sources = (ids.index_select(0, at) for ids, at in zip(ends, (rows, cols)))
            key = mix_seed(self.seed, self._step, self.index)
            keep = attention_keep(key, destinations, sources, heads, cfg.gat_attn_dropout)
            with runtime.profiler.region("elementwise"):
                alpha = alpha * keep * (1.0 / (1.0 - cfg.gat_attn_dropout))
        aggregated = attention_spmm(
            alpha, z, (rows, cols), adjacency.num_rows, local, projected, runtime
        )
        aggregated_spec = spec.with_layout(out_layout, width)
        hidden = aggregated
        if cfg.gat_residual:
            hidden = hidden + self._residual(inputs, projected, out_layout)
        out_spec = aggregated_spec.with_layout(out_layout, widths.width_out)
        if heads > 1 and widths.outputs_classes:
            out_cols = out_spec.col_range(grid.shape, grid.coords)
            hidden = _HeadMeanFn.apply(
                hidden, col_start, out_cols, widths.width_out, heads, runtime, out_layout.cols
            )
        return Product(hidden, out_spec, aggregated, aggregated_spec)

    def _residual(self, inputs: LayerInput, projected: Layout, out_layout: Layout) -> torch.Tensor:
        """DGL's residual at the output rows in ``out_layout``: the input, or its product
        with ``residual_weight`` where the widths differ."""
        weight = self.params.get("residual_weight")
        if weight is None:
            return self.own_rows_in(out_layout, inputs)
        spec, runtime = inputs.spec, self.runtime
        own = self.own_rows_in(spec.layout, inputs)
        width = self.projected_width(self.widths, self.cfg)
        input_spec = spec.with_layout(spec.layout, self.widths.width_in)
        residual, residual_spec = parallel_linear(own, weight, input_spec, width, runtime)
        return redistribute(residual, residual_spec, out_layout, runtime)

    # ---- what the engine reads ------------------------------------------------------

    @classmethod
    def product_cost(
        cls,
        layout: Layout,
        widths: LayerWidths,
        cfg: ModelConfig,
        sizes: LocalSizes,
        needs_dx: bool,
    ) -> list[CollectiveCost]:
        projected = layout.after_linear()
        r, o, c = projected.rows, projected.cols, projected.rep
        heads, width = cls.num_heads(widths, cfg), cls.projected_width(widths, cfg)
        sources, destinations = sizes.rows(r) * heads, sizes.rows(c) * heads
        costs = linear_cost(layout, widths.width_in, width, needs_dx, sizes)
        # [a_l . z | a_r . z] over o, forward and backward; the sources' gradient over c
        costs += [CollectiveCost(o, 2 * sources), CollectiveCost(o, 2 * sources, backward=True)]
        costs += reduce_grad_cost(c, sources)
        # the destinations' terms to the output rows (rows_along): over r; back over r, c
        costs.append(CollectiveCost(r, destinations))
        costs += [
            CollectiveCost(r, destinations, backward=True),
            CollectiveCost(c, sources, backward=True),
        ]
        # the edge softmax: row max and row sum over r; backward the rows' weighted sums
        costs += [CollectiveCost(r, destinations), CollectiveCost(r, destinations)]
        costs.append(CollectiveCost(r, destinations, backward=True))
        costs += spmm_cost(projected, width, sizes, needs_grad=True)
        costs += 2 * reduce_grad_cost(r, sizes.cols(width, o))  # attn_l, attn_r
        out = projected.after_spmm()
        if cfg.gat_residual and widths.width_in != width:
            costs += linear_cost(layout, widths.width_in, width, needs_dx, sizes)
            costs += redistribute_cost(projected, out, width, sizes)
        elif cfg.gat_residual:
            costs += redistribute_cost(layout, out, width, sizes, needs_dx)
        if heads > 1 and widths.outputs_classes:
            mean = sizes.rows(out.rows) * widths.width_out
            costs.append(CollectiveCost(out.cols, mean, low_precision=True))
            costs.append(CollectiveCost(out.cols, mean, low_precision=True, backward=True))
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
        """The product with DGL's edge softmax over ``graph``'s in-edges (its self loops
        included; ``edata[weight]`` is not read), without attention dropout: the single
        process has no step to key it (the oracle tests check it against DGL's module)."""
        heads, head_width = cls.num_heads(widths, cfg), cls.head_width(widths, cfg)
        z = (x @ params["weight"]).view(-1, heads, head_width)
        source = (z * params["attn_l"].view(heads, head_width)).sum(-1)
        destination = (z * params["attn_r"].view(heads, head_width)).sum(-1)
        src, dst = graph.edges()
        logits = torch.nn.functional.leaky_relu(
            source[src] + destination[dst], cfg.gat_negative_slope
        )
        alpha = dgl.ops.edge_softmax(graph, logits)
        aggregated = dgl.ops.u_mul_e_sum(graph, z, alpha.unsqueeze(-1))
        hidden = aggregated
        if cfg.gat_residual:
            residual = x @ params["residual_weight"] if "residual_weight" in params else x
            hidden = hidden + residual.view_as(hidden)
        flat = aggregated.reshape(x.shape[0], -1)
        if widths.outputs_classes:
            return hidden.mean(dim=1), flat
        return hidden.reshape(x.shape[0], -1), flat
