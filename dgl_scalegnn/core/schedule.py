"""The model's communication schedule as values: the layout each layer reads, the
adjacency planes the layers use and how every parameter is split over the grid.

Model, store, performance model and checkpoints all read this one description.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dgl_scalegnn.config import ModelConfig
from dgl_scalegnn.core.grid_shape import Coords, GridShape
from dgl_scalegnn.core.layout import INPUT_LAYOUT, Axis, Layout, Plane, block_range

__all__ = [
    "ParamShard",
    "layer_layouts",
    "adjacency_planes",
    "logits_layout",
    "LayerWidths",
    "layer_widths",
    "parameter_shards",
    "steps_per_epoch",
    "learning_rate",
]


@dataclass(frozen=True)
class ParamShard:
    """How a parameter is split: its global shape and the grid axis of each dimension.

    The parameter is replicated along the axes it does not name.
    """

    global_shape: tuple[int, ...]
    axes: tuple[Axis, ...]

    def local_slices(self, shape: GridShape, coords: Coords) -> tuple[slice, ...]:
        slices = []
        for size, axis in zip(self.global_shape, self.axes):
            start, stop = block_range(size, shape.size(axis), coords.along(axis))
            slices.append(slice(start, stop))
        return tuple(slices)


def layer_layouts(num_layers: int) -> list[Layout]:
    """Input state of each GCN layer; index ``num_layers`` is the state the head reads."""
    states = [INPUT_LAYOUT.after_linear()]
    for _ in range(num_layers):
        states.append(states[-1].after_gcn_layer())
    return states


def adjacency_planes(num_layers: int) -> list[Plane]:
    """The distinct adjacency planes a model of ``num_layers`` layers reads (at most 3)."""
    planes: list[Plane] = []
    for state in layer_layouts(num_layers)[:num_layers]:
        if state.spmm_plane() not in planes:
            planes.append(state.spmm_plane())
    return planes


def logits_layout(num_layers: int, head: bool = True) -> Layout:
    """State of the logits: the head's output (rows along the last state's rows, classes
    along its rep), or without a head the last GCN layer's output. Both keep the rows."""
    last = layer_layouts(num_layers)[-1]
    return last.after_linear() if head else last


@dataclass(frozen=True)
class LayerWidths:
    """Input and output widths of GCN layer ``index`` and what follows its product.

    ``outputs_classes``: the last layer of a model without head, whose product is the
    logits (no tail); ``residual``: the tail adds the layer input (equal widths only).
    """

    index: int
    width_in: int
    width_out: int
    outputs_classes: bool
    residual: bool


def layer_widths(cfg: ModelConfig, in_features: int, num_classes: int) -> list[LayerWidths]:
    """The widths of every GCN layer of ``cfg``.

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


def parameter_shards(cfg: ModelConfig, in_features: int, num_classes: int) -> dict[str, ParamShard]:
    """Global shape and split of every parameter, by name. A gain or a bias (``*_bias``)
    is split along its layer's output columns, the weight's output axis."""
    states = layer_layouts(cfg.layers)
    shards = {}
    if cfg.input_projection:
        shards["input_proj"] = ParamShard(
            (in_features, cfg.hidden), (INPUT_LAYOUT.cols, INPUT_LAYOUT.rep)
        )
        if cfg.bias:
            shards["input_proj_bias"] = ParamShard((cfg.hidden,), (INPUT_LAYOUT.rep,))
    for state, widths in zip(states, layer_widths(cfg, in_features, num_classes)):
        aggregated = state.after_spmm()
        shards[f"layer{widths.index}_weight"] = ParamShard(
            (widths.width_in, widths.width_out), (aggregated.cols, aggregated.rep)
        )
        if cfg.bias:
            shards[f"layer{widths.index}_bias"] = ParamShard((widths.width_out,), (aggregated.rep,))
        if cfg.norm and not widths.outputs_classes:
            shards[f"layer{widths.index}_gain"] = ParamShard((cfg.hidden,), (aggregated.rep,))
    if cfg.head:
        last = states[-1]
        if cfg.final_norm:
            shards["final_gain"] = ParamShard((cfg.hidden,), (last.cols,))
        shards["head"] = ParamShard((cfg.hidden, num_classes), (last.cols, last.rep))
        if cfg.bias:
            shards["head_bias"] = ParamShard((num_classes,), (last.rep,))
    return shards


def steps_per_epoch(num_nodes: int, batch_size: int, dp_size: int) -> int:
    """``ceil(ceil(N / B) / Gd)``: each DP group covers its share of the vertices.

    >>> steps_per_epoch(1000, 100, 4)
    3
    """
    return max(1, math.ceil(math.ceil(num_nodes / batch_size) / dp_size))


def learning_rate(
    base: float, step: int, total_steps: int, schedule: str = "constant", warmup_steps: int = 0
) -> float:
    """The learning rate of global step ``step`` (0-based) of a run of ``total_steps``.

    .. math::

        \\eta_t = \\eta \\cdot \\min\\big(1, \\tfrac{t+1}{w}\\big) \\cdot
                  \\tfrac{1}{2}\\big(1 + \\cos(\\pi\\, t / T)\\big)

    with warm-up ``w`` (no warm-up factor when 0) and the cosine factor only for
    ``schedule == "cosine"``. A pure function of the step, so a resumed run (on any
    grid) continues on the same curve.

    >>> [round(learning_rate(0.01, t, 4, "cosine"), 5) for t in range(4)]
    [0.01, 0.00854, 0.005, 0.00146]
    >>> learning_rate(0.01, 0, 100, warmup_steps=4)
    0.0025
    """
    rate = base
    if warmup_steps > 0:
        rate *= min(1.0, (step + 1) / warmup_steps)
    if schedule == "cosine":
        rate *= 0.5 * (1.0 + math.cos(math.pi * min(step, total_steps) / max(1, total_steps)))
    return rate
