r"""GraphSAINT with DGL's node sampler: a GCN trained on sampled induced subgraphs.

Sampling
    ``dgl.dataloading.SAINTSampler(mode="node", budget=B)``: ``B`` draws with
    replacement, vertex :math:`v` drawn with probability proportional to its
    out-degree, and the subgraph induced by the distinct vertices drawn. An epoch is
    :math:`\lceil N / B \rceil` subgraphs (as ScaleGNN's epochs of ``N / batch_size``
    steps).
Normalisation (``normalization``)
    ``"estimator"`` (the default), GraphSAINT's (Zeng et al., ICLR 2020, Sec. 3).
    Before training, :math:`N_s = \lceil c N / B \rceil` subgraphs are drawn, about
    :math:`c N` vertex draws in all (``norm_coverage`` :math:`c = 50`, the sample
    coverage of the paper's code, which counts sampled vertices against the training
    vertices), and every vertex and edge counted: :math:`C_v` subgraphs contain
    vertex :math:`v`, :math:`C_{u,v}` contain edge :math:`u \to v`. The paper's
    estimates are the loss normalisation :math:`\lambda_v = |V_L| \, C_v / N_s`
    (:math:`V_L` the training vertices) and the aggregator normalisation
    :math:`\alpha_{u,v} = C_{u,v} / C_v`. Training uses their reciprocals,
    :attr:`SaintNorm.loss_norm` :math:`= 1/\lambda_v = N_s / (C_v |V_L|)` and
    :attr:`SaintNorm.aggr_norm` :math:`= 1/\alpha_{u,v} = C_v / C_{u,v}`; a count of
    zero is taken as one, as in the paper's code.

    ``"global"``: no estimator; a subgraph keeps the full graph's weights
    :math:`\tilde A_{v,u}` and its loss is the mean cross-entropy over its training
    vertices :math:`V_s \cap V_L`.

    ``"subgraph"``: no estimator; every subgraph :math:`G_s` is normalised as a graph
    of its own, :math:`D_s^{-1/2} (A_s + I) D_s^{-1/2}` with :math:`D_s` the degrees
    within :math:`G_s` (its self loops are those of the full graph, one per vertex,
    which the induced subgraph keeps), and the loss is the mean over
    :math:`V_s \cap V_L`. Only ``"estimator"`` pre-samples.
Model
    ``layers`` DGL ``GraphConv`` layers (``norm="none"``) with edge weights: on the full
    graph the GCN propagation :math:`\tilde A = \tilde D^{-1/2} (A + I) \tilde D^{-1/2}`
    (self loops replaced by one per vertex), for every ``normalization``. On a subgraph,
    with ``"estimator"``, the same entries times :math:`1/\alpha_{u,v}`, which makes the
    subgraph aggregation an unbiased estimate of the full one, and the loss
    :math:`\sum_{v \in V_s \cap V_L} \mathrm{CE}_v / \lambda_v`, an unbiased estimate of
    the mean training loss; the other modes as above.
Evaluation
    Full graph, one process: the same layers on :math:`\tilde A`, no dropout.

Run ``python -m benchmarks.baselines.run_peers --methods graphsaint --dataset cora``.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.baselines import training
from dgl_scalegnn._dgl import dgl
from dgl_scalegnn.data.graph import NodeDataset

__all__ = [
    "DEFAULTS",
    "SaintNorm",
    "SaintGCN",
    "GraphSAINTBaseline",
    "NORMALIZATIONS",
    "gcn_graph",
    "gcn_weights",
    "count_occurrences",
    "norm_from_counts",
    "estimate_norm",
    "PEER",
]

METHOD = "graphsaint-node"

#: Settings (``PEER.train``) and their defaults: ``budget`` draws per subgraph (an epoch
#: is ``ceil(N / budget)`` subgraphs), ``normalization`` one of :data:`NORMALIZATIONS`
#: (``"estimator"``: GraphSAINT's, pre-sampled; ``"global"``: the full graph's GCN
#: weights; ``"subgraph"``: each subgraph's own GCN weights; the latter two with the mean
#: loss over a subgraph's training vertices), ``norm_coverage`` the estimator's
#: pre-sampling.
DEFAULTS: dict[str, Any] = {
    "hidden": 128,
    "layers": 2,
    "lr": 0.01,
    "dropout": 0.2,
    "weight_decay": 0.0,
    "budget": 4096,
    "norm_coverage": 50,
    "normalization": "estimator",
}

#: The values of the ``normalization`` setting (see the module docstring).
NORMALIZATIONS = ("estimator", "global", "subgraph")

# Subgraphs whose ids are concatenated before one bincount (bounds the temporaries).
_COUNT_CHUNK = 64


def gcn_weights(graph: dgl.DGLGraph) -> torch.Tensor:
    r"""``(E,)`` float32 :math:`1 / \sqrt{d_{\mathrm{out}}(u) \, d_{\mathrm{in}}(v)}` of
    every edge :math:`u \to v`, degrees counted in ``graph`` as it is (self loops
    included): :math:`D^{-1/2} A D^{-1/2}` for a symmetric ``graph``."""
    src, dst = graph.edges()
    out_degree = graph.out_degrees().float()
    in_degree = graph.in_degrees().float()
    return torch.rsqrt(out_degree[src] * in_degree[dst])


def gcn_graph(graph: dgl.DGLGraph) -> dgl.DGLGraph:
    r"""``graph`` with one self loop per vertex and ``edata["w"]`` of :math:`\tilde A`.

    The weights are :func:`gcn_weights` of the looped graph (the symmetric
    normalisation for a symmetric graph). Node data are kept.
    """
    looped = dgl.add_self_loop(dgl.remove_self_loop(graph))
    looped.edata["w"] = gcn_weights(looped)
    return looped


@dataclass(frozen=True)
class SaintNorm:
    """GraphSAINT's normalisation coefficients estimated from pre-sampled subgraphs.

    Attributes
    ----------
    num_samples : int
        :math:`N_s`, the subgraphs counted.
    node_count : torch.Tensor
        ``(N,)`` int64 :math:`C_v`.
    edge_count : torch.Tensor
        ``(E,)`` int64 :math:`C_{u,v}`, indexed by edge id of the sampled graph.
    loss_norm : torch.Tensor
        ``(N,)`` float32 :math:`1/\\lambda_v = N_s / (\\max(C_v, 1) |V_L|)` on training
        vertices, 0 elsewhere.
    aggr_norm : torch.Tensor
        ``(E,)`` float32 :math:`1/\\alpha_{u,v} = \\max(C_v, 1) / \\max(C_{u,v}, 1)` of
        edge :math:`u \\to v`.
    """

    num_samples: int
    node_count: torch.Tensor
    edge_count: torch.Tensor
    loss_norm: torch.Tensor
    aggr_norm: torch.Tensor


def count_occurrences(
    graph: dgl.DGLGraph, subgraphs: Iterable[dgl.DGLGraph]
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """How many of ``subgraphs`` contain each vertex and each edge of ``graph``.

    Parameters
    ----------
    graph : dgl.DGLGraph
        The sampled graph.
    subgraphs : iterable of dgl.DGLGraph
        Subgraphs of ``graph`` with ``ndata[dgl.NID]`` and ``edata[dgl.EID]`` (as
        ``SAINTSampler`` returns them); each id appears at most once per subgraph.

    Returns
    -------
    node_count, edge_count : torch.Tensor
        int64 ``(N,)`` and ``(E,)``.
    num_samples : int
        The number of subgraphs.
    """
    node_count = torch.zeros(graph.num_nodes(), dtype=torch.int64)
    edge_count = torch.zeros(graph.num_edges(), dtype=torch.int64)
    node_ids: list[torch.Tensor] = []
    edge_ids: list[torch.Tensor] = []
    num_samples = 0

    def flush() -> None:
        if node_ids:
            node_count.add_(
                torch.bincount(torch.cat(node_ids).long(), minlength=node_count.numel())
            )
            edge_count.add_(
                torch.bincount(torch.cat(edge_ids).long(), minlength=edge_count.numel())
            )
        node_ids.clear()
        edge_ids.clear()

    for subgraph in subgraphs:
        node_ids.append(subgraph.ndata[dgl.NID])
        edge_ids.append(subgraph.edata[dgl.EID])
        num_samples += 1
        if len(node_ids) == _COUNT_CHUNK:
            flush()
    flush()
    return node_count, edge_count, num_samples


def norm_from_counts(
    graph: dgl.DGLGraph,
    node_count: torch.Tensor,
    edge_count: torch.Tensor,
    num_samples: int,
    train_mask: torch.Tensor,
) -> SaintNorm:
    """:class:`SaintNorm` of the counts (see its attributes for the formulas)."""
    if num_samples < 1:
        raise ValueError("the normalisation needs at least one sampled subgraph")
    num_train = int(train_mask.sum())
    if num_train == 0:
        raise ValueError("GraphSAINT needs at least one training vertex")
    nodes = node_count.clamp(min=1).double()
    loss_norm = torch.where(train_mask, num_samples / (nodes * num_train), 0.0)
    _, dst = graph.edges()
    aggr_norm = nodes[dst.long()] / edge_count.clamp(min=1).double()
    return SaintNorm(
        num_samples=num_samples,
        node_count=node_count,
        edge_count=edge_count,
        loss_norm=loss_norm.float(),
        aggr_norm=aggr_norm.float(),
    )


def estimate_norm(
    graph: dgl.DGLGraph,
    sampler: dgl.dataloading.SAINTSampler,
    num_samples: int,
    train_mask: torch.Tensor,
) -> SaintNorm:
    """Draw ``num_samples`` subgraphs with ``sampler`` and count them (pre-sampling)."""
    subgraphs = (sampler.sample(graph, None) for _ in range(num_samples))
    node_count, edge_count, counted = count_occurrences(graph, subgraphs)
    return norm_from_counts(graph, node_count, edge_count, counted, train_mask)


class SaintGCN(nn.Module):
    """``layers`` weighted ``GraphConv`` layers, ReLU between, dropout before each.

    Parameters
    ----------
    in_dim, hidden, out_dim : int
        Feature widths of the input, the hidden layers and the output (classes).
    layers : int
        Number of ``GraphConv`` layers (at least 1).
    dropout : float
        Dropout rate on the input of every layer.
    """

    def __init__(self, in_dim: int, hidden: int, out_dim: int, layers: int, dropout: float):
        super().__init__()
        if layers < 1:
            raise ValueError(f"layers must be at least 1, got {layers}")
        widths = [in_dim] + [hidden] * (layers - 1) + [out_dim]
        self.convs = nn.ModuleList(
            dgl.nn.GraphConv(a, b, norm="none", allow_zero_in_degree=True)
            for a, b in itertools.pairwise(widths)
        )
        self.dropout = nn.Dropout(dropout)

    def forward(
        self, graph: dgl.DGLGraph, features: torch.Tensor, edge_weight: torch.Tensor
    ) -> torch.Tensor:
        """Logits ``(graph.num_nodes(), out_dim)`` with propagation weights ``edge_weight``."""
        h = features
        for index, conv in enumerate(self.convs):
            h = conv(graph, self.dropout(h), edge_weight=edge_weight)
            if index < len(self.convs) - 1:
                h = F.relu(h)
        return h


class GraphSAINTBaseline(training.MiniBatchBaseline):
    """GraphSAINT-node training state: graph, sampler, normalisation, model, Adam.

    Parameters
    ----------
    dataset : NodeDataset
        The graph (single-label).
    settings : dict
        :data:`DEFAULTS` with any overrides.
    norm_cache : Path, optional
        Where the estimated normalisation is kept: read when the file exists, written
        after estimating otherwise (the pre-sampling takes about a minute at 1M vertices
        and average degree 50; runs of one graph at one budget and coverage share it).
        Unused unless ``normalization`` is ``"estimator"``.

    Raises
    ------
    ValueError
        If ``normalization`` is not one of :data:`NORMALIZATIONS`, or ``budget`` < 1.
    """

    def __init__(
        self,
        dataset: NodeDataset,
        settings: Mapping[str, Any],
        norm_cache: Path | None = None,
    ) -> None:
        self.normalization: str = settings["normalization"]
        if self.normalization not in NORMALIZATIONS:
            raise ValueError(
                f"{METHOD}: normalization must be one of "
                f"{', '.join(map(repr, NORMALIZATIONS))}, got {self.normalization!r}"
            )
        budget = int(settings["budget"])
        if budget < 1:
            raise ValueError(f"{METHOD}: budget must be positive, got {budget}")
        self.graph = gcn_graph(dataset.graph)
        num_nodes = self.graph.num_nodes()
        self.sampler = dgl.dataloading.SAINTSampler(mode="node", budget=budget)
        self.steps_per_epoch = math.ceil(num_nodes / budget)
        # Only the estimator needs the pre-sampling, most of the set-up on large graphs.
        self.norm: SaintNorm | None = None
        if self.normalization == "estimator":
            norm_samples = math.ceil(settings["norm_coverage"] * num_nodes / budget)
            self.norm = self._estimator_norm(norm_samples, norm_cache)
        model = SaintGCN(
            dataset.num_features,
            settings["hidden"],
            dataset.num_classes,
            settings["layers"],
            settings["dropout"],
        )
        super().__init__(
            model,
            self.graph.ndata["label"],
            training.split_ids(self.graph, "val_mask"),
            training.split_ids(self.graph, "test_mask"),
            settings,
        )

    def _estimator_norm(self, num_samples: int, norm_cache: Path | None) -> SaintNorm:
        """:func:`estimate_norm` from ``num_samples`` subgraphs, or ``norm_cache``."""
        if norm_cache is not None and norm_cache.exists():
            return SaintNorm(**torch.load(norm_cache))
        norm = estimate_norm(self.graph, self.sampler, num_samples, self.graph.ndata["train_mask"])
        if norm_cache is not None:
            partial = norm_cache.with_suffix(".partial")
            torch.save(dataclasses.asdict(norm), partial)
            partial.replace(norm_cache)  # never a half-written cache
        return norm

    def batches(self) -> Iterator[dgl.DGLGraph]:
        for _ in range(self.steps_per_epoch):
            yield self.sampler.sample(self.graph, None)

    def edge_weight(self, batch: dgl.DGLGraph) -> torch.Tensor:
        r"""``(E_s,)`` propagation weights of subgraph ``batch`` under ``normalization``:
        :math:`\tilde A_{v,u} / \alpha_{u,v}`, :math:`\tilde A_{v,u}`, or
        :func:`gcn_weights` of ``batch`` itself (its own degrees, loops included)."""
        if self.normalization == "subgraph":
            return gcn_weights(batch)
        if self.norm is None:
            return batch.edata["w"]
        return batch.edata["w"] * self.norm.aggr_norm[batch.edata[dgl.EID]]

    def loss(self, batch: dgl.DGLGraph) -> torch.Tensor | None:
        # Where the estimator's 1/lambda_v is positive: the training vertices.
        labelled = batch.ndata["train_mask"]
        if not bool(labelled.any()):
            return None
        logits = self.model(batch, batch.ndata["feat"], self.edge_weight(batch))
        per_vertex = F.cross_entropy(
            logits[labelled], batch.ndata["label"][labelled], reduction="none"
        )
        if self.norm is None:
            return per_vertex.mean()
        loss_norm = self.norm.loss_norm[batch.ndata[dgl.NID][labelled]]
        return (per_vertex * loss_norm).sum()

    def predict(self, ids: torch.Tensor) -> torch.Tensor:
        logits = self.model(self.graph, self.graph.ndata["feat"], self.graph.edata["w"])
        return logits[ids]


#: This method of the comparison (``PEER.train``, ``PEER.sweep``).
PEER = training.Method(METHOD, GraphSAINTBaseline, DEFAULTS)
