"""GIN and GAT with DGL's neighbour sampler: GraphSAGE's trainer with DGL's other layers.

Training and evaluation are :mod:`benchmarks.baselines.graphsage`'s (mini-batches of
``batch_size`` training vertices, ``NeighborSampler(fanouts)``, Adam, layer-wise
evaluation with all neighbours), with the model of the layer type:

GIN (``dgl-gin-ns``)
    ``layers`` ``dgl.nn.GINConv`` with the sum aggregator (:math:`\\epsilon = 0`), each
    with a two-layer MLP (``Linear, ReLU, Linear``, hidden ``hidden``), as
    ``model.conv: gin``; ReLU and dropout between the layers. It sums the *sampled*
    neighbours as DGL's module does, with no rescaling: at most ``fanouts[l]`` of them in
    training, all of them in the evaluation.
GAT (``dgl-gat-ns``)
    ``layers`` ``dgl.nn.GATConv``, as DGL's GAT example stacks them: ``heads`` heads of
    ``hidden / heads`` columns side by side in each hidden layer, ELU between the
    layers, one head (``out_heads``, averaged) in the layer that outputs the classes;
    ``dropout`` on each layer's input features and ``attn_dropout`` on the attention
    coefficients (GATConv's ``feat_drop`` and ``attn_drop``), LeakyReLU slope
    ``negative_slope``. The graph gets one self loop per vertex first (DGL's GAT
    examples), so each vertex attends to itself and its sampled neighbours.

``make bench-scale`` runs both beside GraphSAGE (:func:`benchmarks.methods.run_peer`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.baselines import training
from benchmarks.baselines.graphsage import DEFAULTS, GraphSAGEBaseline, LayerStack
from dgl_scalegnn._dgl import dgl
from dgl_scalegnn.data.graph import NodeDataset

__all__ = [
    "GIN",
    "GAT",
    "GAT_DEFAULTS",
    "GINBaseline",
    "GATBaseline",
    "GIN_PEER",
    "GAT_PEER",
]

#: GAT's settings: GraphSAGE's, and the heads, attention dropout and LeakyReLU slope
#: (8 heads, as ``model.gat_heads``; ``hidden`` must divide by them).
GAT_DEFAULTS: dict[str, Any] = {
    **DEFAULTS,
    "heads": 8,
    "out_heads": 1,
    "attn_dropout": 0.0,
    "negative_slope": 0.2,
}


class GIN(LayerStack):
    """``layers`` ``GINConv`` (sum, two-layer MLP of width ``hidden``); ReLU and dropout
    between them."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int, layers: int, dropout: float):
        self.mlp_hidden = hidden
        super().__init__(in_dim, hidden, out_dim, layers, dropout)

    def make_conv(self, width_in: int, width_out: int, last: bool) -> nn.Module:
        hidden = self.mlp_hidden
        mlp = nn.Sequential(nn.Linear(width_in, hidden), nn.ReLU(), nn.Linear(hidden, width_out))
        return dgl.nn.GINConv(mlp, "sum")


class GAT(LayerStack):
    """``layers`` ``GATConv`` as DGL's GAT example: hidden layers of ``heads`` heads of
    ``hidden / heads`` columns (concatenated, then ELU), the last of ``out_heads`` heads
    of the classes (averaged); feature dropout inside each layer.

    Raises
    ------
    ValueError
        If ``hidden`` does not divide into ``heads``.
    """

    def __init__(
        self,
        in_dim: int,
        hidden: int,
        out_dim: int,
        layers: int,
        dropout: float,
        heads: int,
        out_heads: int,
        attn_dropout: float,
        negative_slope: float,
    ) -> None:
        if hidden % heads:
            raise ValueError(f"GAT: hidden {hidden} does not divide into {heads} heads")
        self.heads, self.out_heads = heads, out_heads
        self.conv_options = {
            "feat_drop": dropout,
            "attn_drop": attn_dropout,
            "negative_slope": negative_slope,
            "allow_zero_in_degree": True,  # a block's vertex may have none sampled
        }
        super().__init__(in_dim, hidden, out_dim, layers, 0.0)  # dropout is feat_drop

    def make_conv(self, width_in: int, width_out: int, last: bool) -> nn.Module:
        heads = self.out_heads if last else self.heads
        per_head = width_out if last else width_out // heads
        return dgl.nn.GATConv(width_in, per_head, heads, **self.conv_options)

    def layer(self, index: int, block: dgl.DGLGraph, h: torch.Tensor) -> torch.Tensor:
        h = self.convs[index](block, h)  # (vertices, heads, columns)
        if index == self.num_layers - 1:
            return h.mean(1)
        return F.elu(h.flatten(1))


class GINBaseline(GraphSAGEBaseline):
    """GIN trained as :class:`~benchmarks.baselines.graphsage.GraphSAGEBaseline`."""

    @staticmethod
    def build_model(dataset: NodeDataset, settings: Mapping[str, Any]) -> LayerStack:
        return GIN(
            dataset.num_features,
            settings["hidden"],
            dataset.num_classes,
            settings["layers"],
            settings["dropout"],
        )


class GATBaseline(GraphSAGEBaseline):
    """GAT trained as :class:`~benchmarks.baselines.graphsage.GraphSAGEBaseline`, on the
    graph with one self loop per vertex."""

    @staticmethod
    def build_model(dataset: NodeDataset, settings: Mapping[str, Any]) -> LayerStack:
        return GAT(
            dataset.num_features,
            settings["hidden"],
            dataset.num_classes,
            settings["layers"],
            settings["dropout"],
            settings["heads"],
            settings["out_heads"],
            settings["attn_dropout"],
            settings["negative_slope"],
        )

    @staticmethod
    def training_graph(graph: dgl.DGLGraph) -> dgl.DGLGraph:
        return dgl.add_self_loop(dgl.remove_self_loop(graph))


#: DGL's GIN with neighbour sampling (``GIN_PEER.train``, ``GIN_PEER.sweep``).
GIN_PEER = training.Method("dgl-gin-ns", GINBaseline, DEFAULTS)
#: DGL's GAT with neighbour sampling.
GAT_PEER = training.Method("dgl-gat-ns", GATBaseline, GAT_DEFAULTS)
