"""A graph as pieces that can be read in chunks: what bounded-memory preparation reads.

A :class:`GraphSource` gives the edges and the feature rows in chunks (and may give them
again: preparation reads them more than once), and the per-vertex labels and masks,
which are :math:`O(N)`, whole. :func:`source_from_dataset` wraps an in-memory
:class:`~dgl_scalegnn.data.graph.NodeDataset`; the synthetic generator has its own
(:func:`dgl_scalegnn.data.synthetic.synthetic_source`), which never holds all features.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from dgl_scalegnn.data.graph import NodeDataset, label_facts

__all__ = ["GraphSource", "EdgeChunks", "source_from_dataset", "MASK_NAMES"]

MASK_NAMES = ("train_mask", "val_mask", "test_mask")
#: ``edge_chunks(max_edges)`` yields ``(src, dst)`` int64 arrays of at most that many edges.
EdgeChunks = Callable[[int], Iterator[tuple[np.ndarray, np.ndarray]]]


@dataclass(frozen=True)
class GraphSource:
    """A node-classification graph read in pieces.

    ``edge_chunks(max_edges)`` yields the directed input edges ``(src, dst)`` (int64,
    original ids, duplicates and self loops allowed: normalisation merges them);
    ``feature_blocks()`` yields float32 feature rows ``(rows, D)`` of consecutive
    vertices from vertex 0 on; ``feature_rows(ids)``, when given, reads rows in any
    order (sources held in memory). ``labels`` is int64 ``(N,)`` or float32 ``(N, C)``,
    ``masks`` maps each of :data:`MASK_NAMES` to bool ``(N,)``. Each call of a chunk
    function starts from the beginning again. ``source_file`` identifies the
    ``dgl.save_graphs`` file it was read from, if any
    (:attr:`~dgl_scalegnn.data.graph.NodeDataset.source_file`).
    """

    name: str
    num_nodes: int
    num_features: int
    num_classes: int
    multilabel: bool
    labels: np.ndarray
    masks: dict[str, np.ndarray]
    edge_chunks: EdgeChunks
    feature_blocks: Callable[[], Iterator[np.ndarray]]
    feature_rows: Callable[[np.ndarray], np.ndarray] | None = None
    source_file: dict[str, Any] | None = None

    def recorded_facts(self) -> dict[str, Any]:
        """What a prepared graph records of its source besides the sizes (the
        :class:`~dgl_scalegnn.data.prepared.GraphMeta` fields ``source_file`` and
        ``label_facts``): the file it was read from, and
        :func:`~dgl_scalegnn.data.graph.label_facts`."""
        facts = label_facts(self.labels, self.masks, self.num_classes, self.multilabel)
        return {"source_file": self.source_file, "label_facts": facts}


def source_from_dataset(dataset: NodeDataset) -> GraphSource:
    """The pieces of an in-memory dataset (views of its arrays, no copies).

    Examples
    --------
    >>> from dgl_scalegnn.config import SyntheticConfig
    >>> from dgl_scalegnn.data.synthetic import generate
    >>> source = source_from_dataset(generate(SyntheticConfig(num_nodes=300)))
    >>> chunks = list(source.edge_chunks(100))
    >>> source.num_nodes, max(src.shape[0] for src, _ in chunks)
    (300, 100)
    """
    graph = dataset.graph
    src, dst = (t.numpy() for t in graph.edges())
    features = graph.ndata["feat"].numpy()
    label_dtype = np.float32 if dataset.multilabel else np.int64

    def edge_chunks(max_edges: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for start in range(0, src.shape[0], max_edges):
            yield src[start : start + max_edges], dst[start : start + max_edges]

    def feature_blocks() -> Iterator[np.ndarray]:
        yield features

    return GraphSource(
        name=dataset.name,
        num_nodes=graph.num_nodes(),
        num_features=dataset.num_features,
        num_classes=dataset.num_classes,
        multilabel=dataset.multilabel,
        labels=graph.ndata["label"].numpy().astype(label_dtype, copy=False),
        masks={name: graph.ndata[name].numpy().astype(np.bool_, copy=False) for name in MASK_NAMES},
        edge_chunks=edge_chunks,
        feature_blocks=feature_blocks,
        feature_rows=lambda ids: np.asarray(features[ids], dtype=np.float32),
        source_file=dataset.source_file,
    )
