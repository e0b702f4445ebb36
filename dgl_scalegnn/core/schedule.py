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


def logits_layout(num_layers: int) -> Layout:
    """State of the logits: rows along the last state's rows, classes along its rep."""
    return layer_layouts(num_layers)[-1].after_linear()


def parameter_shards(cfg: ModelConfig, in_features: int, num_classes: int) -> dict[str, ParamShard]:
    """Global shape and split of every parameter, by name."""
    states = layer_layouts(cfg.layers)
    shards = {
        "input_proj": ParamShard((in_features, cfg.hidden), (INPUT_LAYOUT.cols, INPUT_LAYOUT.rep))
    }
    for index, state in enumerate(states[: cfg.layers]):
        aggregated = state.after_spmm()
        shards[f"layer{index}_weight"] = ParamShard(
            (cfg.hidden, cfg.hidden), (aggregated.cols, aggregated.rep)
        )
        if cfg.norm:
            shards[f"layer{index}_gain"] = ParamShard((cfg.hidden,), (aggregated.rep,))
    last = states[-1]
    shards["head"] = ParamShard((cfg.hidden, num_classes), (last.cols, last.rep))
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
