"""The model's stack read from the config and the layer registry: its layer type, the
schedule kind of that type and every parameter's name, shape and split.

Model, reference, checkpoints, export and the performance model read these; none lists
a layer type's parameters itself.
"""

from __future__ import annotations

from dgl_scalegnn.config import ModelConfig
from dgl_scalegnn.core.layout import INPUT_LAYOUT
from dgl_scalegnn.core.schedule import LayerKind, ParamShard, layer_layouts, layer_widths
from dgl_scalegnn.model.convs import CONV_LAYERS, GraphLayer

__all__ = ["conv_layer", "layer_kind", "parameter_shards"]


def conv_layer(cfg: ModelConfig) -> type[GraphLayer]:
    """The layer class of ``cfg.conv``."""
    return CONV_LAYERS[cfg.conv]


def layer_kind(cfg: ModelConfig) -> LayerKind:
    """What the schedule needs of ``cfg``'s layers (layouts, adjacency normalisation)."""
    return conv_layer(cfg).kind


def parameter_shards(cfg: ModelConfig, in_features: int, num_classes: int) -> dict[str, ParamShard]:
    """Global shape and split of every parameter, by name: the input projection's, each
    layer's (:meth:`~dgl_scalegnn.model.convs.base.GraphLayer.parameter_shards`), the
    head's. A gain or a bias (``*_bias``) is split along its map's output columns.

    >>> from dgl_scalegnn.config import ModelConfig
    >>> sorted(parameter_shards(ModelConfig(conv="sage", layers=1, norm=False), 5, 3))
    ['head', 'input_proj', 'layer0_self_weight', 'layer0_weight']
    """
    layer = conv_layer(cfg)
    states = layer_layouts(cfg.layers, layer.kind)
    shards = {}
    if cfg.input_projection:
        shards["input_proj"] = ParamShard(
            (in_features, cfg.hidden), (INPUT_LAYOUT.cols, INPUT_LAYOUT.rep)
        )
        if cfg.bias:
            shards["input_proj_bias"] = ParamShard((cfg.hidden,), (INPUT_LAYOUT.rep,))
    for state, widths in zip(states, layer_widths(cfg, in_features, num_classes)):
        shards.update(layer.parameter_shards(state, widths, cfg))
    if cfg.head:
        last = states[-1]
        if cfg.final_norm:
            shards["final_gain"] = ParamShard((cfg.hidden,), (last.cols,))
        shards["head"] = ParamShard((cfg.hidden, num_classes), (last.cols, last.rep))
        if cfg.bias:
            shards["head_bias"] = ParamShard((num_classes,), (last.rep,))
    return shards
