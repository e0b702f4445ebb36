"""Uniform vertex sampling with unbiased edge rescaling.

At step :math:`t` a data-parallel group :math:`d` draws
:math:`S \\sim \\mathrm{Uniform}\\binom{V}{B}` from a seed that depends only on
``(base_seed, d, t)``, so every rank of the group derives the same sorted :math:`S`
without a message. The mini-batch adjacency keeps the edges with both ends in
:math:`S` and divides off-diagonal values by

.. math::

    p = \\Pr[u \\in S \\mid v \\in S] = \\frac{B - 1}{N - 1},

so that :math:`E[\\sum_{u \\in S} \\tilde a_{vu} x_u \\mid v \\in S] = \\sum_u a_{vu} x_u`.
"""

from __future__ import annotations

import numpy as np
import torch

from dgl_scalegnn._dgl import dgl
from dgl_scalegnn.data.normalize import gcn_normalize

__all__ = [
    "sample_vertices",
    "inclusion_probability",
    "rescale_off_diagonal",
    "gcn_norm_graph",
    "UniformVertexSampler",
]


def sample_vertices(num_nodes: int, batch_size: int, seed: int) -> torch.Tensor:
    """Sorted ``(B,)`` int64 vertex ids drawn uniformly without replacement.

    For small ``B / N`` candidates are drawn with replacement and deduplicated, which
    costs :math:`O(B \\log B)` instead of a permutation of all ``N`` vertices; the set
    of distinct draws is exchangeable, so a uniform choice of ``B`` of them is a
    uniform ``B``-subset. Every rank calling with the same arguments gets the same ids.

    >>> sample_vertices(10, 4, seed=7).tolist() == sample_vertices(10, 4, seed=7).tolist()
    True
    """
    if not 2 <= batch_size <= num_nodes:
        raise ValueError(
            f"batch_size must be in [2, N={num_nodes}], got {batch_size}; "
            "set sampling.batch_size to at most the number of vertices"
        )
    generator = torch.Generator().manual_seed(seed)
    if batch_size * 8 >= num_nodes:
        chosen = torch.randperm(num_nodes, generator=generator)[:batch_size]
        return torch.sort(chosen).values
    distinct = torch.empty(0, dtype=torch.int64)
    while distinct.numel() < batch_size:
        draws = torch.randint(num_nodes, (batch_size + batch_size // 8 + 16,), generator=generator)
        distinct = torch.unique(torch.cat((distinct, draws)))
    keep = torch.randperm(distinct.numel(), generator=generator)[:batch_size]
    return torch.sort(distinct[keep]).values


def inclusion_probability(num_nodes: int, batch_size: int) -> float:
    """``p = (B - 1) / (N - 1)``: the chance a neighbour of a sampled vertex is sampled."""
    if num_nodes < 2:
        raise ValueError(f"sampling needs at least 2 vertices, got N={num_nodes}")
    return (batch_size - 1) / (num_nodes - 1)


def rescale_off_diagonal(values: torch.Tensor, diagonal: torch.Tensor, p: float) -> torch.Tensor:
    """Divide the values of the entries off the diagonal (``diagonal`` False) by ``p``."""
    if p == 1.0:
        return values
    return torch.where(diagonal, values, values / p)


def gcn_norm_graph(graph: dgl.DGLGraph, weight: str = "w") -> dgl.DGLGraph:
    """The GCN-normalised graph of ``graph`` for a single-process DGL loop.

    Returns a new graph on the same vertices (ndata copied) whose edges are the
    symmetrised, deduplicated edges plus one self loop per vertex, with
    ``edata[weight]`` = :math:`(\\hat d_u \\hat d_v)^{-1/2}`. Edge ``u -> v`` carries
    row ``v``, column ``u`` of :math:`A` (DGL aggregates over in-edges).
    """
    src, dst = graph.edges()
    csr = gcn_normalize(src.numpy(), dst.numpy(), graph.num_nodes())
    rows = np.repeat(np.arange(csr.num_nodes), np.diff(csr.indptr))
    normalized = dgl.graph(
        (torch.from_numpy(csr.indices), torch.from_numpy(rows)), num_nodes=graph.num_nodes()
    )
    for key, value in graph.ndata.items():
        normalized.ndata[key] = value
    normalized.edata[weight] = torch.from_numpy(csr.values)
    return normalized


class UniformVertexSampler(dgl.dataloading.Sampler):
    """The paper's sampler as a :class:`dgl.dataloading.Sampler`.

    Given the seed vertices of a batch (with ``dgl.dataloading.DataLoader`` over
    ``torch.arange(N)`` and ``shuffle=True`` each batch is a uniform ``B``-subset),
    returns the induced subgraph with ``edata[weight]`` divided by
    :math:`p = (B-1)/(N-1)` off the diagonal. The graph must come from
    :func:`gcn_norm_graph` (or carry the normalised weights under ``weight``).

    Parameters
    ----------
    weight : str
        Edge data key of the normalised adjacency values.

    Examples
    --------
    >>> import torch
    >>> from dgl_scalegnn._dgl import dgl
    >>> g = gcn_norm_graph(dgl.rand_graph(100, 400))
    >>> loader = dgl.dataloading.DataLoader(
    ...     g, torch.arange(100), UniformVertexSampler(), batch_size=20, shuffle=True)
    >>> subgraph = next(iter(loader))
    >>> subgraph.num_nodes()
    20
    """

    def __init__(self, weight: str = "w") -> None:
        super().__init__()
        self.weight = weight

    def sample(self, g: dgl.DGLGraph, indices: torch.Tensor) -> dgl.DGLGraph:
        if self.weight not in g.edata:
            raise KeyError(
                f"edata[{self.weight!r}] is missing; build the graph with gcn_norm_graph(graph)"
            )
        vertices = torch.sort(torch.as_tensor(indices, dtype=torch.int64)).values
        subgraph = dgl.node_subgraph(g, vertices)
        if vertices.numel() < 2:  # a lone vertex keeps only its self loop: nothing to rescale
            return subgraph
        src, dst = subgraph.edges()
        p = inclusion_probability(g.num_nodes(), vertices.numel())
        subgraph.edata[self.weight] = rescale_off_diagonal(
            subgraph.edata[self.weight], src == dst, p
        )
        return subgraph
