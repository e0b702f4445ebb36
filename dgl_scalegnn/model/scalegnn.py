"""The ScaleGNN model distributed by 3D PMM: one implementation for every grid shape.

.. math::

    X_{h,0} = X_S W_{in}, \\qquad
    X_{h,l} = \\mathrm{Dropout}(\\mathrm{ReLU}(\\mathrm{RMSNorm}(P_l(X_{h,l-1})))) + X_{h,l-1},
    \\qquad O = X_{h,L} W_{out}

with :math:`P_l` the product of the layer type ``model.conv``
(:mod:`~dgl_scalegnn.model.convs`): GCN :math:`\\tilde A_S X W_l`, GraphSAGE-mean
:math:`X W_{self} + (D^{-1} A)_S X W_l`.
(Without input projection :math:`X_{h,0} = X_S`; without head the last layer is
:math:`O = P_L(X_{h,L-1})`, no tail; ``residual_from: aggregated`` adds the aggregated
input instead of :math:`X_{h,l-1}`; ``final_norm`` gives
:math:`O = \\mathrm{RMSNorm}(X_{h,L}) W_{out}`; with ``bias`` every product :math:`X W` is
:math:`X W + b`.)

Input features arrive in state ``(x, z, y)``; the projection gives ``(x, y, z)``; a GCN
or SAGE layer maps ``(r, c, o)`` to ``(o, r, c)`` and reads the adjacency shard of plane
``(o, r)``, so the planes repeat with period three (a layer type with more dense
products rotates otherwise: :meth:`~dgl_scalegnn.core.schedule.LayerKind.output_layout`).
Parameters are initialised from the seed and their *global* shape and then sliced, and
dropout masks hash global coordinates: the same run gives the same numbers on any grid
(up to reduction order). Full-graph evaluation is :mod:`~dgl_scalegnn.evaluation`.
"""

from __future__ import annotations

import torch
from torch import nn

from dgl_scalegnn.config import ModelConfig
from dgl_scalegnn.core.cost import CollectiveCost, LocalSizes
from dgl_scalegnn.core.layout import INPUT_LAYOUT
from dgl_scalegnn.core.schedule import layer_layouts, layer_widths
from dgl_scalegnn.distributed.comm import Runtime
from dgl_scalegnn.model.convs import GraphLayer
from dgl_scalegnn.model.convs.base import LayerInput
from dgl_scalegnn.model.layers import Head, InputFeatures, InputProjection
from dgl_scalegnn.model.stack import conv_layer, parameter_shards
from dgl_scalegnn.parallel.elementwise import LayerTail
from dgl_scalegnn.parallel.partition import ShardSpec
from dgl_scalegnn.sampling.batch import RankBatch

__all__ = ["ParallelScaleGNN"]


class ParallelScaleGNN(nn.Module):
    """ScaleGNN on the 4D grid: input projection, ``L`` graph layers of type
    ``cfg.conv`` and a head, each holding this rank's parameter shards.

    Parameters
    ----------
    cfg : ModelConfig
        Layer type, hidden size :math:`d_h`, layers :math:`L`, dropout rate,
        norm/residual switches.
    in_features, num_classes : int
        :math:`d_{in}` and :math:`d_{out}`.
    runtime : Runtime
        Grid, communication switches and profiler.
    seed : int
        Initialisation and dropout seed.
    fuse : bool or "auto"
        Fuse each layer's element-wise tail with ``torch.compile`` (``"auto"``: on CUDA
        tensors, not on CPU ones).
    native : bool
        Run the element-wise tail and the norms on the native CPU kernels where they
        build (:mod:`~dgl_scalegnn.parallel.cpu_kernels`), and the full-graph
        evaluation's SpMMs (:mod:`~dgl_scalegnn.evaluation.layerwise`).

    Examples
    --------
    >>> from dgl_scalegnn.config import ModelConfig
    >>> from dgl_scalegnn.distributed.comm import Runtime
    >>> model = ParallelScaleGNN(ModelConfig(hidden=8, layers=2), in_features=5,
    ...                          num_classes=3, runtime=Runtime.single_process(), seed=0)
    >>> sorted(model.sharded_state_dict())
    ['head', 'input_proj', 'layer0_gain', 'layer0_weight', 'layer1_gain', 'layer1_weight']
    >>> [str(layer.plane) for layer in model.layers]
    ['ZX', 'YZ']
    """

    def __init__(
        self,
        cfg: ModelConfig,
        *,
        in_features: int,
        num_classes: int,
        runtime: Runtime,
        seed: int,
        fuse: bool = False,
        native: bool = True,
    ) -> None:
        super().__init__()
        self.cfg, self.runtime = cfg, runtime
        self.in_features, self.num_classes = in_features, num_classes
        shards = parameter_shards(cfg, in_features, num_classes)
        layer = conv_layer(cfg)
        self.layer_tail = LayerTail(fuse, native=native)
        self.input_layer: InputProjection | InputFeatures = (
            InputProjection(cfg, shards, runtime, seed)
            if cfg.input_projection
            else InputFeatures(cfg, runtime, seed)
        )
        self.layers: list[GraphLayer] = nn.ModuleList(  # type: ignore[assignment]
            layer(widths, layout, cfg, shards, runtime, seed, self.layer_tail)
            for widths, layout in zip(
                layer_widths(cfg, in_features, num_classes), layer_layouts(cfg.layers, layer.kind)
            )
        )
        self.head = (
            Head(cfg, num_classes, shards, runtime, seed, self.layer_tail) if cfg.head else None
        )

    def sharded_state_dict(self) -> dict[str, nn.Parameter]:
        """Every parameter by its schedule name
        (:func:`~dgl_scalegnn.model.stack.parameter_shards`); ``param.shard`` gives its
        global shape and split (what a checkpoint needs to re-slice it for another grid)."""
        params = {}
        if isinstance(self.input_layer, InputProjection):
            params["input_proj"] = self.input_layer.weight
            params["input_proj_bias"] = self.input_layer.bias
        for layer in self.layers:
            prefix = layer.prefix(layer.index)
            params.update({prefix + name: param for name, param in layer.params.items()})
        if self.head is not None:
            params["final_gain"] = self.head.gain
            params["head"] = self.head.weight
            params["head_bias"] = self.head.bias
        return {name: param for name, param in params.items() if param is not None}

    def forward(self, batch: RankBatch) -> tuple[torch.Tensor, ShardSpec]:
        """Logits shard and its spec (classes split along the logits' column axis);
        dropout while ``self.training``."""
        spec = ShardSpec(INPUT_LAYOUT, batch.rows, self.in_features)
        hidden, spec = self.input_layer(batch.features, spec, batch.step)
        for layer in self.layers:
            hidden, spec = layer(LayerInput(hidden, spec, batch.adjacency[layer.plane]), batch.step)
        return (hidden, spec) if self.head is None else self.head(hidden, spec)

    @staticmethod
    def cost(
        cfg: ModelConfig, in_features: int, num_classes: int, sizes: LocalSizes
    ) -> list[CollectiveCost]:
        """Collectives of :meth:`forward` and its backward, layer by layer."""
        layer = conv_layer(cfg)
        layouts = layer_layouts(cfg.layers, layer.kind)
        if cfg.input_projection:
            costs = InputProjection.cost(cfg, in_features, sizes)
        else:
            costs = InputFeatures.cost(in_features, sizes)
        for layout, widths in zip(layouts, layer_widths(cfg, in_features, num_classes)):
            needs_dx = widths.index > 0 or cfg.input_projection
            costs += layer.cost(layout, widths, cfg, sizes, needs_dx)
        if cfg.head:
            costs += Head.cost(layouts[-1], cfg, num_classes, sizes)
        return costs
