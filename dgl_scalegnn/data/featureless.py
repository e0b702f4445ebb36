r"""The paper's recipe for graphs without useful features (Isolate-3-8M, Products-14M).

Every vertex gets :math:`D = 128` features drawn from :math:`\mathcal{N}(0, 1)`, which
carry no signal, and, where the graph has no labels, one of :math:`C = 32` classes by
its degree rank: vertices are sorted by degree (ties in a uniformly random order) and
the vertex of rank :math:`r \in \{0, \dots, N-1\}` gets class :math:`\lfloor C r / N \rfloor`,
so every class holds :math:`\lfloor N/C \rfloor` or :math:`\lceil N/C \rceil` vertices and
higher classes have higher degree. Both are a function of ``seed`` only.

``data.featureless: true`` applies it to any dataset (:func:`apply_recipe`); the
synthetic generator's ``data.synthetic.featureless`` draws its graph this way.

Example
-------
>>> import torch
>>> from dgl_scalegnn._dgl import dgl
>>> graph = dgl.graph((torch.tensor([0, 0, 0, 1]), torch.tensor([1, 2, 3, 2])))
>>> data = recipe_node_data(graph, seed=0, with_labels=True)
>>> tuple(data["feat"].shape), data["label"].tolist()
((4, 128), [24, 8, 16, 0])
"""

from __future__ import annotations

import numpy as np
import torch

from dgl_scalegnn._dgl import dgl

__all__ = ["FEATURELESS_DIM", "FEATURELESS_CLASSES", "degree_quantile_labels", "recipe_node_data"]

#: Feature width of the recipe.
FEATURELESS_DIM = 128
#: Number of degree-quantile classes of the recipe.
FEATURELESS_CLASSES = 32


def degree_quantile_labels(
    rng: np.random.Generator, degree: np.ndarray, num_classes: int = FEATURELESS_CLASSES
) -> np.ndarray:
    """``(n,)`` int64 class ``floor(num_classes * rank / n)`` of each vertex's degree rank.

    Ties in degree are ranked in a uniformly random order: a vertex of degree ``d`` is
    sorted by ``d + U`` with ``U ~ Uniform[0, 1)`` drawn per vertex.
    """
    n = degree.shape[0]
    order = np.argsort(degree + rng.random(n))
    labels = np.empty(n, dtype=np.int64)
    labels[order] = np.arange(n, dtype=np.int64) * num_classes // n
    return labels


def recipe_node_data(graph: dgl.DGLGraph, seed: int, with_labels: bool) -> dict[str, torch.Tensor]:
    """The recipe's ``feat`` ``(N, 128)`` float32 and, with ``with_labels``, ``label``
    ``(N,)`` int64 degree-quantile classes of ``graph`` (degree: in plus out edges)."""
    features_rng, ties_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2)
    )
    n = graph.num_nodes()
    data = {
        "feat": torch.from_numpy(
            features_rng.standard_normal((n, FEATURELESS_DIM), dtype=np.float32)
        )
    }
    if with_labels:
        degree = (graph.in_degrees() + graph.out_degrees()).numpy()
        data["label"] = torch.from_numpy(degree_quantile_labels(ties_rng, degree))
    return data
