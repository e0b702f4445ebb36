"""GraphSAGE with DGL's neighbour sampler, evaluated layer-wise as DistDGL does.

Training
    Mini-batches of ``batch_size`` training vertices (shuffled each epoch); their
    ``layers``-hop computation graph is drawn by
    ``dgl.dataloading.NeighborSampler(fanouts)`` (``fanouts[0]`` neighbours per vertex
    at the input layer) and fed to ``layers`` ``dgl.nn.SAGEConv`` layers with the mean
    aggregator (ReLU and dropout between layers). An epoch is one pass over the
    training vertices.
Evaluation
    Layer by layer, as DGL's distributed GraphSAGE example does: layer ``l`` is computed
    for every vertex in batches of ``eval_batch_size``, each batch's inputs drawn by a
    one-layer ``NeighborSampler([eval_fanout])`` (``-1``: all in-neighbours, which
    makes it exact), from the outputs of layer ``l - 1``; the last layer only for the
    validation and test vertices.

Run ``python -m benchmarks.baselines.run_peers --methods graphsage --dataset cora``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.baselines import training
from dgl_scalegnn._dgl import dgl
from dgl_scalegnn.data.graph import NodeDataset

__all__ = [
    "DEFAULTS",
    "LayerStack",
    "SAGE",
    "GraphSAGEBaseline",
    "resolve_fanouts",
    "layerwise_inference",
    "sampled_inference",
    "PEER",
]

METHOD = "graphsage"

#: Settings (``PEER.train``) and their defaults: ``batch_size`` training vertices per step,
#: ``fanouts`` one per layer, input layer first (``None``: 10 per layer).
DEFAULTS: dict[str, Any] = {
    "hidden": 128,
    "layers": 2,
    "lr": 0.003,
    "dropout": 0.5,
    "weight_decay": 0.0,
    "batch_size": 1024,
    "fanouts": None,
    "eval_fanout": -1,
    "eval_batch_size": 4096,
}


def resolve_fanouts(settings: Mapping[str, Any]) -> list[int]:
    """The training fanouts, input layer first: ``settings["fanouts"]`` or 10 per layer.

    Raises
    ------
    ValueError
        If the number of fanouts differs from ``layers``.
    """
    layers = int(settings["layers"])
    fanouts = settings["fanouts"]
    fanouts = [10] * layers if fanouts is None else [int(f) for f in fanouts]
    if len(fanouts) != layers:
        raise ValueError(f"{METHOD}: {len(fanouts)} fanouts for {layers} layers")
    return fanouts


class LayerStack(nn.Module):
    """``layers`` DGL layers, ReLU and dropout between them, each made by
    :meth:`make_conv`: what the neighbour-sampled trainers and their layer-wise and
    sampled inference (:func:`layerwise_inference`, :func:`sampled_inference`) read.

    Parameters
    ----------
    in_dim, hidden, out_dim : int
        Widths of the input features, the hidden layers and the output (classes).
    layers : int
        Number of layers (at least 1).
    dropout : float
        Dropout rate after each hidden layer.
    """

    def __init__(self, in_dim: int, hidden: int, out_dim: int, layers: int, dropout: float):
        super().__init__()
        if layers < 1:
            raise ValueError(f"layers must be at least 1, got {layers}")
        widths = [in_dim] + [hidden] * (layers - 1) + [out_dim]
        self.widths = tuple(widths)
        self.convs = nn.ModuleList(
            self.make_conv(a, b, index == layers - 1)
            for index, (a, b) in enumerate(itertools.pairwise(widths))
        )
        self.dropout = nn.Dropout(dropout)

    def make_conv(self, width_in: int, width_out: int, last: bool) -> nn.Module:
        """One layer from ``width_in`` to ``width_out`` columns (``last``: the classes)."""
        raise NotImplementedError

    @property
    def num_layers(self) -> int:
        return len(self.convs)

    def layer_width(self, index: int) -> int:
        """Output width of layer ``index``."""
        return self.widths[index + 1]

    def layer(self, index: int, block: dgl.DGLGraph, h: torch.Tensor) -> torch.Tensor:
        """Layer ``index`` on ``block`` (inputs ``h`` of its source vertices)."""
        h = self.convs[index](block, h)
        if index < self.num_layers - 1:
            h = self.dropout(F.relu(h))
        return h

    def forward(self, blocks: Sequence[dgl.DGLGraph], features: torch.Tensor) -> torch.Tensor:
        """Logits of the destination vertices of ``blocks[-1]``."""
        h = features
        for index, block in enumerate(blocks):
            h = self.layer(index, block, h)
        return h


class SAGE(LayerStack):
    """``layers`` mean-aggregator ``SAGEConv`` layers; ReLU and dropout between them."""

    def make_conv(self, width_in: int, width_out: int, last: bool) -> nn.Module:
        return dgl.nn.SAGEConv(width_in, width_out, "mean")


def layerwise_inference(
    model: LayerStack,
    graph: dgl.DGLGraph,
    features: torch.Tensor,
    ids: torch.Tensor,
    fanout: int,
    batch_size: int,
) -> torch.Tensor:
    """Logits of ``ids`` (in that order), computed one layer at a time over all vertices.

    Parameters
    ----------
    model : LayerStack
        In eval mode, under ``torch.no_grad()``.
    graph : dgl.DGLGraph
        The full graph.
    features : torch.Tensor
        ``(N, D)`` input features.
    ids : torch.Tensor
        The vertices whose logits are returned.
    fanout : int
        In-neighbours drawn per vertex and layer (``-1``: all).
    batch_size : int
        Output vertices per batch.
    """
    sampler = dgl.dataloading.NeighborSampler([fanout])
    all_ids = torch.arange(graph.num_nodes())
    h = features
    for index in range(model.num_layers):
        last = index == model.num_layers - 1
        seeds = ids if last else all_ids
        out = torch.empty(seeds.numel(), model.layer_width(index))
        loader = dgl.dataloading.DataLoader(
            graph, seeds, sampler, batch_size=batch_size, shuffle=False, drop_last=False
        )
        start = 0
        for input_nodes, output_nodes, blocks in loader:
            out[start : start + output_nodes.numel()] = model.layer(
                index, blocks[0], h[input_nodes]
            )
            start += output_nodes.numel()
        h = out
    return h


def sampled_inference(
    model: LayerStack,
    graph: dgl.DGLGraph,
    features: torch.Tensor,
    ids: torch.Tensor,
    fanouts: Sequence[int],
    batch_size: int,
) -> torch.Tensor:
    """Logits of ``ids`` (in that order) from their sampled ``layers``-hop neighbourhoods.

    Mini-batch inference as in training: each batch of ``batch_size`` vertices gets
    its computation graph from ``NeighborSampler(fanouts)`` (input layer first), and
    the whole model runs on it; no vertex outside those neighbourhoods is computed.
    The paper compares its full-graph evaluation against this.
    """
    loader = dgl.dataloading.DataLoader(
        graph,
        ids,
        dgl.dataloading.NeighborSampler(list(fanouts)),
        batch_size=batch_size,
        shuffle=False,
        drop_last=False,
    )
    return torch.cat([model(blocks, features[inputs]) for inputs, _, blocks in loader])


class GraphSAGEBaseline(training.MiniBatchBaseline):
    """GraphSAGE training state: graph, neighbour-sampling loader, model, Adam. Another
    layer type trains by the same loop from its own :meth:`build_model` (and
    :meth:`training_graph`).

    Parameters
    ----------
    dataset : NodeDataset
        The graph (single-label).
    settings : dict
        :data:`DEFAULTS` with any overrides.
    """

    @staticmethod
    def build_model(dataset: NodeDataset, settings: Mapping[str, Any]) -> LayerStack:
        """The model of ``settings`` for ``dataset``'s widths."""
        return SAGE(
            dataset.num_features,
            settings["hidden"],
            dataset.num_classes,
            settings["layers"],
            settings["dropout"],
        )

    @staticmethod
    def training_graph(graph: dgl.DGLGraph) -> dgl.DGLGraph:
        """The graph the sampler and the inference read (GraphSAGE's: as given)."""
        return graph

    def __init__(self, dataset: NodeDataset, settings: Mapping[str, Any]) -> None:
        self.graph = self.training_graph(dataset.graph)
        self.features = self.graph.ndata["feat"]
        self.eval_fanout = int(settings["eval_fanout"])
        self.eval_batch_size = int(settings["eval_batch_size"])
        self.loader = dgl.dataloading.DataLoader(
            self.graph,
            training.split_ids(self.graph, "train_mask"),
            dgl.dataloading.NeighborSampler(resolve_fanouts(settings)),
            batch_size=int(settings["batch_size"]),
            shuffle=True,
            drop_last=False,
        )
        super().__init__(
            self.build_model(dataset, settings),
            self.graph.ndata["label"],
            training.split_ids(self.graph, "val_mask"),
            training.split_ids(self.graph, "test_mask"),
            settings,
        )

    def batches(self) -> Iterator[Any]:
        return iter(self.loader)

    def loss(self, batch: Any) -> torch.Tensor:
        input_nodes, output_nodes, blocks = batch
        logits = self.model(blocks, self.features[input_nodes])
        return F.cross_entropy(logits, self.labels[output_nodes])

    def predict(self, ids: torch.Tensor) -> torch.Tensor:
        return layerwise_inference(
            self.model, self.graph, self.features, ids, self.eval_fanout, self.eval_batch_size
        )


#: This method of the comparison (``PEER.train``, ``PEER.sweep``).
PEER = training.Method(METHOD, GraphSAGEBaseline, DEFAULTS)
