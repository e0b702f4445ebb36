"""DGL's standard full-batch recipes: the GraphConv GCN and the GraphSAGE of DGL's examples.

Written independently of dgl_scalegnn, from DGL's own layers, as a DGL user trains a
graph of the size of Cora (``examples/pytorch/gcn/train.py`` and
``examples/pytorch/graphsage/train_full.py`` in DGL's repository):

GCN (``graphconv``)
    ``dgl.add_self_loop`` on the graph; ``GraphConv(D, hidden, activation=relu)`` and
    ``GraphConv(hidden, C)`` with ``norm="both"`` (:math:`\\tilde D^{-1/2} \\tilde A
    \\tilde D^{-1/2}`) and biases; dropout 0.5 before the second layer; Adam at 0.01 with
    weight decay 5e-4 on every parameter; 200 full-batch epochs; hidden 64 (the recipe
    of issue 40; DGL's example uses 16).
GraphSAGE (``sageconv``)
    ``SAGEConv(D, 16, "gcn")`` and ``SAGEConv(16, C, "gcn")``, ReLU and dropout 0.5
    between them; Adam at 0.01 with weight decay 5e-4; 200 full-batch epochs.
GraphSAGE-mean (``sageconv-mean``)
    The same with ``SAGEConv(.., "mean")`` and hidden 64 (the layer of ``model.conv:
    sage``).
GIN (``ginconv``)
    ``GINConv`` with the sum aggregator and a two-layer MLP each (``Linear, ReLU,
    Linear``; hidden 64), ReLU and dropout 0.5 between the two layers, as
    ``model.conv: gin``; Adam at 0.01 with weight decay 5e-4; 200 full-batch epochs.

Both read the features scaled as DGL's Planetoid classes scale them (rows summing to 1)
unless the settings say otherwise (``feature_norm``). Each epoch is one step on the
whole graph; evaluation is one forward pass in eval mode after every epoch.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.baselines import training
from dgl_scalegnn._dgl import dgl
from dgl_scalegnn.data.features import column_moments, scale_features
from dgl_scalegnn.data.graph import NodeDataset

__all__ = [
    "GCN_DEFAULTS",
    "SAGE_DEFAULTS",
    "FullBatchBaseline",
    "GraphConvBaseline",
    "SAGEConvBaseline",
    "GINConvBaseline",
    "GRAPHCONV",
    "SAGECONV",
    "SAGECONV_MEAN",
    "GINCONV",
]

GCN_DEFAULTS: dict[str, Any] = {
    "hidden": 64,
    "dropout": 0.5,
    "lr": 0.01,
    "weight_decay": 5e-4,
    "feature_norm": "row",
}
SAGE_DEFAULTS: dict[str, Any] = {**GCN_DEFAULTS, "hidden": 16, "aggregator": "gcn"}
SAGE_MEAN_DEFAULTS: dict[str, Any] = {**GCN_DEFAULTS, "aggregator": "mean"}


class _TwoLayers(nn.Module):
    """Two DGL layers, ReLU and dropout between them (DGL's examples' model)."""

    def __init__(self, first: nn.Module, second: nn.Module, dropout: float) -> None:
        super().__init__()
        self.first, self.second = first, second
        self.dropout = nn.Dropout(dropout)

    def forward(self, graph: dgl.DGLGraph, features: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.first(graph, features))
        return self.second(graph, self.dropout(h))


def _gcn(dim_in: int, classes: int, settings: Mapping[str, Any]) -> nn.Module:
    hidden = settings["hidden"]
    first = dgl.nn.GraphConv(dim_in, hidden, norm="both")
    return _TwoLayers(first, dgl.nn.GraphConv(hidden, classes, norm="both"), settings["dropout"])


def _sage(dim_in: int, classes: int, settings: Mapping[str, Any]) -> nn.Module:
    hidden, aggregator = settings["hidden"], settings["aggregator"]
    first = dgl.nn.SAGEConv(dim_in, hidden, aggregator)
    return _TwoLayers(first, dgl.nn.SAGEConv(hidden, classes, aggregator), settings["dropout"])


def _gin(dim_in: int, classes: int, settings: Mapping[str, Any]) -> nn.Module:
    hidden = settings["hidden"]

    def mlp(width_in: int, width_out: int) -> nn.Module:
        return nn.Sequential(nn.Linear(width_in, hidden), nn.ReLU(), nn.Linear(hidden, width_out))

    first = dgl.nn.GINConv(mlp(dim_in, hidden), "sum")
    return _TwoLayers(first, dgl.nn.GINConv(mlp(hidden, classes), "sum"), settings["dropout"])


class FullBatchBaseline(training.MiniBatchBaseline):
    """A recipe on ``dataset``: each epoch is one step on the whole graph; subclasses
    say which model (:meth:`build`)."""

    @staticmethod
    def build(dim_in: int, classes: int, settings: Mapping[str, Any]) -> nn.Module:
        raise NotImplementedError

    def __init__(self, dataset: NodeDataset, settings: Mapping[str, Any]) -> None:
        graph = dgl.add_self_loop(dgl.remove_self_loop(dataset.graph))
        features = graph.ndata["feat"].numpy()
        norm = settings["feature_norm"]
        moments = column_moments([features]) if norm == "standardize" else None
        self.graph = graph
        self.features = torch.from_numpy(scale_features(features, norm, moments))
        self.train_ids = training.split_ids(graph, "train_mask")
        model = self.build(self.features.shape[1], dataset.num_classes, settings)
        super().__init__(
            model,
            graph.ndata["label"],
            training.split_ids(graph, "val_mask"),
            training.split_ids(graph, "test_mask"),
            settings,
        )

    def batches(self) -> Iterator[None]:
        yield None

    def loss(self, batch: None) -> torch.Tensor:
        logits = self.model(self.graph, self.features)
        return F.cross_entropy(logits[self.train_ids], self.labels[self.train_ids])

    def predict(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(self.graph, self.features)[ids]


class GraphConvBaseline(FullBatchBaseline):
    """DGL's GCN recipe (``GraphConv``)."""

    build = staticmethod(_gcn)


class SAGEConvBaseline(FullBatchBaseline):
    """DGL's full-batch GraphSAGE recipe (``SAGEConv``)."""

    build = staticmethod(_sage)


class GINConvBaseline(FullBatchBaseline):
    """DGL's ``GINConv`` trained full batch, as the recipes above."""

    build = staticmethod(_gin)


#: DGL's GraphConv GCN recipe (``GRAPHCONV.train``, ``GRAPHCONV.sweep``).
GRAPHCONV = training.Method("dgl-graphconv", GraphConvBaseline, GCN_DEFAULTS)
#: DGL's full-batch GraphSAGE recipe.
SAGECONV = training.Method("dgl-sageconv", SAGEConvBaseline, SAGE_DEFAULTS)
#: The same with the mean aggregator (``model.conv: sage``'s layer).
SAGECONV_MEAN = training.Method("dgl-sageconv-mean", SAGEConvBaseline, SAGE_MEAN_DEFAULTS)
#: DGL's GINConv, full batch.
GINCONV = training.Method("dgl-ginconv", GINConvBaseline, GCN_DEFAULTS)
