"""The buffer plan of a layer-wise evaluation: which whole-graph matrices it holds.

A layer-wise evaluation (:mod:`~dgl_scalegnn.evaluation.layerwise`) keeps a layer's
input and output over every vertex; everything else lives for one chunk. Which of those
matrices exist depends on the model and on the grid alone:

- the first layer's input: the features in the first layer's layout, or their
  projection; on one TP rank, where every layout is the whole matrix, the first layer
  reads the features in place and projects its aggregation,
  :math:`(\\hat A X) W_{in} + (\\hat A 1) b_{in}` (``fold``), so the evaluation makes
  no input matrix (``owned`` is false);
- each layer's output, the last one the head's logits where there is a head;
- on one TP rank, each layer that aggregates its input times its weights,
  :math:`\\hat A (X W)`, where :math:`W` narrows it
  (:meth:`~dgl_scalegnn.model.convs.base.GraphLayer.narrows_first`), and on any grid
  each layer of a type that multiplies first (GAT's :math:`A (X W)`, without a
  residual): that product (``narrowed``, in the layout the product gives) takes the
  input's place.

The plan is a value (layouts and widths, no tensors): the engine makes its matrices from
it, and the cost model (:mod:`~dgl_scalegnn.perfmodel`) prices the same matrices, so an
optimisation of the evaluation's memory is written once.

Examples
--------
>>> from dgl_scalegnn.config import ModelConfig
>>> from dgl_scalegnn.core.grid_shape import GridShape
>>> cfg = ModelConfig(hidden=16, layers=2, input_projection=False, residual=False, head=False)
>>> plan = BufferPlan.of(cfg, in_features=32, num_classes=4, shape=GridShape(1, 1, 1, 1))
>>> plan.owned, [m.width for m in plan.outputs], [m and m.width for m in plan.narrowed]
(False, [16, 4], [16, 4])
>>> plan.peak_bytes(lambda matrix: 10 * matrix.width)  # X W_0, then (X_1 W_1) chunk by chunk
200
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dgl_scalegnn.config import ModelConfig
from dgl_scalegnn.core.grid_shape import GridShape
from dgl_scalegnn.core.layout import INPUT_LAYOUT, Layout
from dgl_scalegnn.core.schedule import layer_layouts, layer_widths
from dgl_scalegnn.model.stack import conv_layer

__all__ = ["Matrix", "BufferPlan", "buffer_peak"]


@dataclass(frozen=True)
class Matrix:
    """A whole-graph matrix of an evaluation: its layout and its global columns (its rows
    are every vertex)."""

    layout: Layout
    width: int


@dataclass(frozen=True)
class BufferPlan:
    """The whole-graph matrices of a layer-wise evaluation on a grid.

    ``first`` is the first layer's input, made by the evaluation where ``owned`` (else
    the features, read in place); ``fold``: the first layer projects its aggregation;
    ``outputs``: each layer's output (the last one the head's logits where there is a
    head; the head's alone for a model without graph layers); ``narrowed``: per layer,
    its input times its narrowing weights where it aggregates that (``None``
    elsewhere).
    """

    first: Matrix
    owned: bool
    fold: bool
    outputs: tuple[Matrix, ...]
    narrowed: tuple[Matrix | None, ...]

    @classmethod
    def of(
        cls, cfg: ModelConfig, in_features: int, num_classes: int, shape: GridShape
    ) -> BufferPlan:
        """The plan of a model of ``cfg`` (``in_features`` to ``num_classes``) on a grid
        of ``shape``."""
        one_tp_rank = shape.tp_size == 1
        fold = one_tp_rank and cfg.input_projection and cfg.layers > 0
        projected = cfg.input_projection and not fold
        first = Matrix(INPUT_LAYOUT.after_linear(), cfg.hidden if projected else in_features)
        outputs: list[Matrix] = []
        narrowed: list[Matrix | None] = []
        if not cfg.layers:  # the head on the whole input
            outputs.append(Matrix(first.layout.after_linear(), num_classes))
        layer = conv_layer(cfg)
        widths_of = layer_widths(cfg, in_features, num_classes)
        for layout, widths in zip(layer_layouts(cfg.layers, layer.kind), widths_of):
            narrows = layer.narrows_first(widths, shape.tp_size, fold and widths.index == 0, cfg)
            product = Matrix(layout.after_linear(), layer.narrowed_width(widths, cfg))
            narrowed.append(product if narrows else None)
            outputs.append(Matrix(layer.kind.output_layout(layout), widths.width_out))
        if cfg.layers and cfg.head:  # rows stay, classes along the head's columns
            outputs[-1] = Matrix(outputs[-1].layout.after_linear(), num_classes)
        owned = not (one_tp_rank and not projected)
        return cls(first, owned, fold, tuple(outputs), tuple(narrowed))

    def peak_bytes(self, size: Callable[[Matrix], float]) -> float:
        """Peak bytes of the plan's matrices held at once
        (:func:`buffer_peak`), each matrix's bytes on the
        rank given by ``size``."""
        sizes = [size(matrix) for matrix in (self.first, *self.outputs)]
        narrowed = [0.0 if matrix is None else size(matrix) for matrix in self.narrowed]
        return buffer_peak(sizes, input_owned=self.owned, narrowed=narrowed)


def buffer_peak(sizes: Sequence[float], input_owned: bool, narrowed: Sequence[float] = ()) -> float:
    """Peak bytes of the whole-graph matrices of a layer-wise forward, whose ``sizes`` are
    the first layer's input then each layer's output: a layer holds its input and its
    output at once (the input is freed when the output is complete). A layer that
    aggregates its input times its weights (``narrowed``, per layer; none by default)
    takes that product in its input's place: the layer before makes it, narrowing each
    chunk of its output as it is made, so that output is never whole. The first layer
    narrows its input itself: it holds its input and the product, then frees the input
    and holds the product and its output. The first input counts only where the forward
    made it (``input_owned``), not where it reads the features in place.

    >>> buffer_peak([100, 40, 8], input_owned=True), buffer_peak([100, 40, 8], input_owned=False)
    (140, 48)
    >>> buffer_peak([100, 8], input_owned=False)  # one layer
    8
    >>> buffer_peak([100, 40, 30], input_owned=False, narrowed=[0, 10])  # 40 never whole
    40
    >>> buffer_peak([100, 40, 30], input_owned=True, narrowed=[10, 0])  # 10 + 100, 40 + 30
    110
    """
    narrowed = [*narrowed, *[0] * (len(sizes) - 1 - len(narrowed))]
    # what each layer takes: its input, or a narrowing layer's product in its place
    taken = [sizes[0] if input_owned else 0]
    taken += [product or size for product, size in zip(narrowed[1:], sizes[1:-1])]
    made = [*taken[1:], sizes[-1]]
    first = narrowed[0] + max(taken[0], made[0]) if narrowed[0] else taken[0] + made[0]
    return max([first, *(given + output for given, output in zip(taken[1:], made[1:]))])
