"""The model's communication schedule as values: the layout each layer reads, the
adjacency planes the layers use, how a parameter is split over the grid.

A layer type describes itself to the schedule by a :class:`LayerKind`; the model
(:mod:`~dgl_scalegnn.model.convs`) names the parameters, and the store, the performance
model and checkpoints read the layouts and splits from here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dgl_scalegnn.config import ModelConfig
from dgl_scalegnn.core.grid_shape import Coords, GridShape
from dgl_scalegnn.core.layout import INPUT_LAYOUT, Axis, Layout, Plane, block_range

__all__ = [
    "ParamShard",
    "NORMALISATIONS",
    "LayerKind",
    "GCN_KIND",
    "layer_layouts",
    "adjacency_planes",
    "logits_layout",
    "LayerWidths",
    "layer_widths",
    "steps_per_epoch",
    "learning_rate",
]

#: How a layer type wants the adjacency it multiplies by: ``symmetric``
#: :math:`\hat D^{-1/2} (A + I) \hat D^{-1/2}` (GCN) or ``sum`` :math:`A` (no self loops:
#: sums over the neighbours, and GraphSAGE's mean as a ratio of two of them).
NORMALISATIONS = ("symmetric", "sum")


@dataclass(frozen=True)
class ParamShard:
    r"""How a parameter is split: its global shape and the grid axis of each dimension.

    The parameter is replicated along the axes it does not name (a 0-d parameter, shape
    ``()``, on every rank). ``init`` is a constant initial value (a scalar a layer learns);
    ``None`` initialises by name (:func:`~dgl_scalegnn.model.parameters.init_global_parameter`).
    ``fans`` draws a vector as Glorot-uniform of a matrix of those fans (GAT's attention
    vectors, which DGL draws as an ``(H, F)`` matrix); a vector without is ones or zeros.
    """

    global_shape: tuple[int, ...]
    axes: tuple[Axis, ...]
    init: float | None = None
    fans: tuple[int, int] | None = None

    def local_slices(self, shape: GridShape, coords: Coords) -> tuple[slice, ...]:
        slices = []
        for size, axis in zip(self.global_shape, self.axes):
            start, stop = block_range(size, shape.size(axis), coords.along(axis))
            slices.append(slice(start, stop))
        return tuple(slices)


@dataclass(frozen=True)
class LayerKind:
    """What the schedule needs of a layer type: an SpMM and ``linears`` dense products
    (each moves the layout, :class:`~dgl_scalegnn.core.layout.Layout`), all after the
    SpMM or, with ``linear_first``, the first of them before it (GAT's
    :math:`A (X W)`), and the normalisation (one of :data:`NORMALISATIONS`) of the
    adjacency it multiplies by.

    >>> from dgl_scalegnn.core.layout import INPUT_LAYOUT
    >>> first = INPUT_LAYOUT.after_linear()
    >>> str(GCN_KIND.output_layout(first)), str(LayerKind(linears=2).output_layout(first))
    ('(z,x,y)', '(z,y,x)')
    >>> attention = LayerKind(linear_first=True)
    >>> str(attention.spmm_layout(first)), str(attention.plane(first)), str(GCN_KIND.plane(first))
    ('(x,z,y)', 'YX', 'ZX')
    >>> str(attention.output_layout(first))
    '(y,z,x)'
    """

    linears: int = 1
    normalisation: str = "symmetric"
    linear_first: bool = False

    def __post_init__(self) -> None:
        if self.normalisation not in NORMALISATIONS:
            raise ValueError(
                f"normalisation {self.normalisation!r}: choose one of {', '.join(NORMALISATIONS)}"
            )
        if self.linear_first and self.linears < 1:
            raise ValueError("linear_first needs a linear to put before the SpMM")

    def spmm_layout(self, layout: Layout) -> Layout:
        """The layout the layer's SpMM reads for an input in ``layout``: the input's, or
        with ``linear_first`` the first product's."""
        return layout.after_linear() if self.linear_first else layout

    def plane(self, layout: Layout) -> Plane:
        """The adjacency plane the layer's SpMM multiplies by, for an input in ``layout``."""
        return self.spmm_layout(layout).spmm_plane()

    def output_layout(self, layout: Layout) -> Layout:
        """The layout of the layer's output for an input in ``layout``."""
        out = self.spmm_layout(layout).after_spmm()
        for _ in range(self.linears - self.linear_first):
            out = out.after_linear()
        return out


#: GCN's kind: :math:`\tilde A X W` (SpMM, one linear: the layer rotation
#: :meth:`~dgl_scalegnn.core.layout.Layout.after_gcn_layer`), symmetric normalisation.
GCN_KIND = LayerKind()


def layer_layouts(num_layers: int, kind: LayerKind = GCN_KIND) -> list[Layout]:
    """Input state of each graph layer; index ``num_layers`` is the state the head reads."""
    states = [INPUT_LAYOUT.after_linear()]
    for _ in range(num_layers):
        states.append(kind.output_layout(states[-1]))
    return states


def adjacency_planes(num_layers: int, kind: LayerKind = GCN_KIND) -> list[Plane]:
    """The distinct adjacency planes a model of ``num_layers`` layers reads (at most 3)."""
    planes: list[Plane] = []
    for state in layer_layouts(num_layers, kind)[:num_layers]:
        if kind.plane(state) not in planes:
            planes.append(kind.plane(state))
    return planes


def logits_layout(num_layers: int, head: bool = True, kind: LayerKind = GCN_KIND) -> Layout:
    """State of the logits: the head's output (rows along the last state's rows, classes
    along its rep), or without a head the last graph layer's output. Both keep the rows."""
    last = layer_layouts(num_layers, kind)[-1]
    return last.after_linear() if head else last


@dataclass(frozen=True)
class LayerWidths:
    """Input and output widths of graph layer ``index`` and what follows its product.

    ``outputs_classes``: the last layer of a model without head, whose product is the
    logits (no tail); ``residual``: the tail adds the layer input (equal widths only).
    """

    index: int
    width_in: int
    width_out: int
    outputs_classes: bool
    residual: bool


def layer_widths(cfg: ModelConfig, in_features: int, num_classes: int) -> list[LayerWidths]:
    """The widths of every graph layer of ``cfg``.

    >>> from dgl_scalegnn.config import ModelConfig
    >>> cfg = ModelConfig(hidden=16, layers=2, input_projection=False, head=False)
    >>> [(w.width_in, w.width_out, w.outputs_classes) for w in layer_widths(cfg, 100, 7)]
    [(100, 16, False), (16, 7, True)]
    """
    widths = []
    for index in range(cfg.layers):
        width_in = cfg.hidden if index > 0 or cfg.input_projection else in_features
        outputs_classes = not cfg.head and index == cfg.layers - 1
        width_out = num_classes if outputs_classes else cfg.hidden
        residual = cfg.residual and not outputs_classes and width_in == width_out
        widths.append(LayerWidths(index, width_in, width_out, outputs_classes, residual))
    return widths


def steps_per_epoch(num_nodes: int, batch_size: int, dp_size: int) -> int:
    """``ceil(ceil(N / B) / Gd)``: each DP group covers its share of the vertices.

    >>> steps_per_epoch(1000, 100, 4)
    3
    """
    return max(1, math.ceil(math.ceil(num_nodes / batch_size) / dp_size))


def learning_rate(
    base: float,
    step: int,
    total_steps: int,
    schedule: str = "constant",
    warmup_steps: int = 0,
    done: float | None = None,
) -> float:
    """The learning rate of global step ``step`` (0-based) of a run of ``total_steps``.

    .. math::

        \\eta_t = \\eta \\cdot \\min\\big(1, \\tfrac{t+1}{w}\\big) \\cdot
                  \\tfrac{1}{2}\\big(1 + \\cos(\\pi\\, f)\\big)

    with warm-up ``w`` (no warm-up factor when 0) and the cosine factor only for
    ``schedule == "cosine"``, where ``f`` is the share of the run done: ``done`` (a run
    with a budget of training seconds gives the share of them spent), by default
    ``t / T``. A pure function of the step and the seconds trained, both checkpointed, so
    a resumed run (on any grid) continues on the same curve.

    >>> [round(learning_rate(0.01, t, 4, "cosine"), 5) for t in range(4)]
    [0.01, 0.00854, 0.005, 0.00146]
    >>> learning_rate(0.01, 0, 100, warmup_steps=4)
    0.0025
    >>> round(learning_rate(0.01, 3, 100, "cosine", done=0.5), 5)
    0.005
    """
    rate = base
    if warmup_steps > 0:
        rate *= min(1.0, (step + 1) / warmup_steps)
    if schedule == "cosine":
        if done is None:
            done = step / max(1, total_steps)
        rate *= 0.5 * (1.0 + math.cos(math.pi * min(1.0, done)))
    return rate
