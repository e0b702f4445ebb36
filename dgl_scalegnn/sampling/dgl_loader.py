"""The paper's sampler for a single-process DGL loop: a normalised DGLGraph and a
:class:`dgl.dataloading.Sampler` whose subgraphs carry the unbiased edge rescaling of
:mod:`~dgl_scalegnn.sampling.uniform`.

The distributed trainer does not use this module (each rank cuts its blocks from its
own share of the graph, :mod:`~dgl_scalegnn.sampling.blocks`), so it alone of the
sampling package needs DGL.
"""

from __future__ import annotations

import torch

from dgl_scalegnn._dgl import dgl
from dgl_scalegnn.data.normalize import csr_row_ids, gcn_normalize, renormalize_block
from dgl_scalegnn.sampling.blocks import FULL_DEGREE
from dgl_scalegnn.sampling.uniform import UniformSampler

__all__ = ["norm_graph", "UniformVertexSampler"]


def norm_graph(
    graph: dgl.DGLGraph, normalisation: str = "symmetric", weight: str = "w"
) -> dgl.DGLGraph:
    """The normalised graph of ``graph`` for a single-process DGL loop.

    Returns a new graph on the same vertices (ndata copied) whose edges are the
    symmetrised, deduplicated edges, with ``edata[weight]`` the adjacency in
    ``normalisation`` (:func:`~dgl_scalegnn.data.normalize.renormalize_block`):
    ``symmetric`` adds one self loop per vertex and weighs
    :math:`(\\hat d_u \\hat d_v)^{-1/2}` (GCN), ``sum`` weighs 1 and has no self loops.
    Edge ``u -> v`` carries row ``v``, column ``u`` of :math:`A` (DGL aggregates over
    in-edges).

    >>> g = norm_graph(dgl.graph(([0, 0], [1, 2])), "sum")
    >>> g.num_edges(), g.edata["w"].tolist()
    (4, [1.0, 1.0, 1.0, 1.0])
    """
    src, dst = graph.edges()
    csr = gcn_normalize(src.numpy(), dst.numpy(), graph.num_nodes())
    entries = renormalize_block(
        csr.indptr, csr.indices, csr.values, 0, csr.degrees, csr.degrees, normalisation
    )
    rows = csr_row_ids(entries.indptr)
    normalized = dgl.graph(
        (torch.from_numpy(entries.indices), torch.from_numpy(rows)), num_nodes=graph.num_nodes()
    )
    for key, value in graph.ndata.items():
        normalized.ndata[key] = value
    normalized.edata[weight] = torch.from_numpy(entries.values)
    return normalized


class UniformVertexSampler(dgl.dataloading.Sampler):
    """The paper's sampler as a :class:`dgl.dataloading.Sampler`.

    Given the seed vertices of a batch (with ``dgl.dataloading.DataLoader`` over
    ``torch.arange(N)`` and ``shuffle=True`` each batch is a uniform ``B``-subset),
    returns the induced subgraph with ``edata[weight]`` divided by
    :math:`p = (B-1)/(N-1)` off the diagonal, and ``ndata[FULL_DEGREE]`` the in-degrees
    of its vertices in ``g`` (:data:`FULL_DEGREE`). The graph must come from
    :func:`norm_graph` (or carry the normalised weights under ``weight``).

    Parameters
    ----------
    weight : str
        Edge data key of the normalised adjacency values.

    Examples
    --------
    >>> import torch
    >>> from dgl_scalegnn._dgl import dgl
    >>> g = norm_graph(dgl.rand_graph(100, 400))
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
                f"edata[{self.weight!r}] is missing; build the graph with norm_graph(graph)"
            )
        vertices = torch.sort(torch.as_tensor(indices, dtype=torch.int64)).values
        subgraph = dgl.node_subgraph(g, vertices)
        subgraph.ndata[FULL_DEGREE] = g.in_degrees(vertices)
        if vertices.numel() < 2:  # a lone vertex keeps only its self loop: nothing to rescale
            return subgraph
        src, dst = subgraph.edges()
        scaling = UniformSampler(g.num_nodes(), vertices.numel()).scaling()
        subgraph.edata[self.weight] = scaling.apply(subgraph.edata[self.weight], src == dst)
        return subgraph
