r"""A seeded, class-homophilous power-law graph with noisy class features.

Every vertex :math:`v \in \{0, \dots, N-1\}` gets a class :math:`y_v` drawn uniformly
from :math:`\{0, \dots, C-1\}` and a Pareto weight

.. math::

    w_v = c \, (1 - U_v)^{-1/(\gamma - 1)}, \qquad U_v \sim \mathrm{Uniform}[0, 1),

where :math:`\gamma` is ``degree_exponent`` (so :math:`\Pr[w > x] \propto x^{1-\gamma}`)
and :math:`c` rescales the weights to an empirical mean of :math:`\bar d`
(``avg_degree``). Edges follow a Chung–Lu model with homophily :math:`h`: vertex
:math:`u` starts :math:`k_u \sim \mathrm{Poisson}(w_u / 2)` edges, and the other end
:math:`v` of each is drawn

.. math::

    \Pr[v \mid u] = h \, \frac{w_v [y_v = y_u]}{W_{y_u}}
                  + (1 - h) \, \frac{w_v}{W}, \qquad
    W_c = \sum_{x : y_x = c} w_x, \quad W = \sum_x w_x,

so that the multigraph of the :math:`\sum_u k_u \approx N \bar d / 2` draws gives
vertex :math:`v` expected degree :math:`w_v`, and an edge joins two vertices of the
same class with probability :math:`h + (1 - h) \sum_c (W_c / W)^2 \approx h + (1 - h) / C`.
The multigraph is then made simple: self loops are dropped and parallel edges (in
either direction) are merged into one, which removes mostly edges between hubs (about
5% of the draws at the default 20,000 vertices, under 1% at :math:`10^7`) and a little
more of the same-class edges than of the others. Every remaining undirected edge
:math:`\{u, v\}` is returned as the two directed edges :math:`u \to v` and
:math:`v \to u`.

Features are a class centroid plus isotropic noise of scale :math:`\sigma`
(``feature_noise``):

.. math::

    x_v = \mu_{y_v} + \sigma \varepsilon_v, \qquad
    \mu_c \sim \mathcal{N}(0, I_D), \quad \varepsilon_v \sim \mathcal{N}(0, I_D),

so an MLP sees each vertex's class through the noise alone, while averaging over the
mostly same-class neighbours (a GCN) shrinks the noise.

With ``featureless: true`` (the recipe for graphs without features) the same graph is
drawn, but :math:`x_v \sim \mathcal{N}(0, I_{128})` carries no signal and the
labels are :math:`32` degree-quantile buckets: vertices are ranked by degree in
the returned graph, ties broken in a uniformly random order, and the vertex of
rank :math:`r \in \{0, \dots, N-1\}` gets class :math:`\lfloor 32 r / N \rfloor`. Every
class then holds :math:`\lfloor N/32 \rfloor` or :math:`\lceil N/32 \rceil` vertices and
higher classes have higher degree. ``num_features`` and ``num_classes`` of the config
are ignored in this mode (``num_classes`` still sets the number of latent communities
the edges follow).

Splits are a uniformly random permutation of the vertices: the first
``round(train_fraction * N)`` train, the next ``round(val_fraction * N)`` validate, the
rest test.

The result is a deterministic function of the config: the weights, classes, edges,
features and splits each draw from their own stream spawned from ``seed`` by
:class:`numpy.random.SeedSequence`, so switching ``featureless`` does not change the
graph.

Shapes
------
``graph``: :math:`N` vertices, :math:`2E` directed edges (int64 ids), no self loops, no
duplicates, symmetric. ``ndata["feat"]``: float32 :math:`(N, D)`; ``ndata["label"]``:
int64 :math:`(N,)`; ``ndata["train_mask"]``, ``["val_mask"]``, ``["test_mask"]``: bool
:math:`(N,)`, disjoint and covering every vertex.

Example
-------
>>> from dgl_scalegnn.config import SyntheticConfig
>>> from dgl_scalegnn.data.synthetic import generate
>>> data = generate(SyntheticConfig(num_nodes=1000, num_features=16, num_classes=4))
>>> data.name, data.num_nodes, data.num_features, data.num_classes
('synthetic', 1000, 16, 4)
>>> src, dst = data.graph.edges()
>>> bool((src != dst).all()), data.graph.ndata["label"].dtype
(True, torch.int64)
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from dgl_scalegnn._dgl import dgl
from dgl_scalegnn.config import ConfigError, SyntheticConfig
from dgl_scalegnn.data.featureless import (
    FEATURELESS_CLASSES,
    FEATURELESS_DIM,
    degree_quantile_labels,
)
from dgl_scalegnn.data.graph import NodeDataset
from dgl_scalegnn.data.source import MASK_NAMES, GraphSource

__all__ = ["generate", "synthetic_source", "FEATURELESS_DIM", "FEATURELESS_CLASSES"]


# Feature rows generated per chunk: bounds the float32 temporaries of the noise.
_FEATURE_CHUNK_ROWS = 1 << 18
_STREAMS = ("weights", "labels", "edges", "features", "splits", "ties")


def generate(cfg: SyntheticConfig) -> NodeDataset:
    """Draw the synthetic graph described in the module docstring.

    Parameters
    ----------
    cfg : SyntheticConfig
        Size, degree, homophily, feature and split parameters and the seed.

    Returns
    -------
    NodeDataset
        ``"synthetic"`` (``num_classes`` classes, ``num_features`` features) or
        ``"synthetic-featureless"`` (32 classes, 128 features).

    Raises
    ------
    ConfigError
        If a parameter is outside the range the generator can use.
    """
    drawn = _draw(cfg)
    n = cfg.num_nodes
    src, dst = _symmetric_edges(drawn.keys, n)
    graph = dgl.graph((src, dst), num_nodes=n)
    del src, dst
    feat = torch.empty((n, drawn.num_features), dtype=torch.float32)
    out, begin = feat.numpy(), 0
    for block in drawn.feature_blocks():
        out[begin : begin + block.shape[0]] = block
        begin += block.shape[0]
    graph.ndata["feat"] = feat
    graph.ndata["label"] = torch.from_numpy(drawn.labels)
    for key, mask in drawn.masks.items():
        graph.ndata[key] = torch.from_numpy(mask)
    return NodeDataset(name=drawn.name, graph=graph, num_classes=drawn.num_classes)


def synthetic_source(cfg: SyntheticConfig) -> GraphSource:
    """The graph of :func:`generate` in pieces: edges as the sorted undirected keys (one
    direction each; normalisation adds the other), features drawn anew, chunk by
    chunk, each time they are read. Peak memory is the edge keys (8 bytes per
    undirected edge), not the features.

    Examples
    --------
    >>> source = synthetic_source(SyntheticConfig(num_nodes=1000, num_features=16))
    >>> data = generate(SyntheticConfig(num_nodes=1000, num_features=16))
    >>> bool((next(source.feature_blocks()) == data.graph.ndata["feat"].numpy()).all())
    True
    """
    drawn = _draw(cfg)
    keys, n = drawn.keys, cfg.num_nodes

    def edge_chunks(max_edges: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for start in range(0, keys.shape[0], max_edges):
            part = keys[start : start + max_edges]
            low = part // n
            yield low, part - low * n

    return GraphSource(
        name=drawn.name,
        num_nodes=n,
        num_features=drawn.num_features,
        num_classes=drawn.num_classes,
        multilabel=False,
        labels=drawn.labels,
        masks=drawn.masks,
        edge_chunks=edge_chunks,
        feature_blocks=drawn.feature_blocks,
    )


@dataclass(frozen=True)
class _Drawn:
    """Everything :func:`generate` returns, with the features still to be drawn."""

    name: str
    num_classes: int
    num_features: int
    keys: np.ndarray
    labels: np.ndarray
    masks: dict[str, np.ndarray]
    feature_blocks: Callable[[], Iterator[np.ndarray]]


def _draw(cfg: SyntheticConfig) -> _Drawn:
    _check(cfg)
    rng = _streams(cfg.seed)
    n = cfg.num_nodes
    weights = _vertex_weights(rng["weights"], n, cfg.avg_degree, cfg.degree_exponent)
    communities = rng["labels"].integers(0, cfg.num_classes, size=n, dtype=np.int64)
    keys = _simple_edge_keys(rng["edges"], weights, communities, cfg.num_classes, cfg.homophily)
    del weights
    if cfg.featureless:
        name, num_classes = "synthetic-featureless", FEATURELESS_CLASSES
        dim, noise = FEATURELESS_DIM, 1.0
        labels = degree_quantile_labels(rng["ties"], _key_degrees(keys, n), num_classes)
        centroid_labels = None
    else:
        name, num_classes, dim = "synthetic", cfg.num_classes, cfg.num_features
        labels = centroid_labels = communities
        noise = cfg.feature_noise
    masks = _split_masks(rng["splits"], n, cfg.train_fraction, cfg.val_fraction)

    def feature_blocks() -> Iterator[np.ndarray]:
        # The features' own stream, from its start: every read draws the same rows.
        stream = _streams(cfg.seed)["features"]
        return _gaussian_features(stream, n, dim, noise, centroid_labels)

    return _Drawn(
        name=name,
        num_classes=num_classes,
        num_features=dim,
        keys=keys,
        labels=labels,
        masks={key: mask.numpy() for key, mask in zip(MASK_NAMES, masks, strict=True)},
        feature_blocks=feature_blocks,
    )


def _check(cfg: SyntheticConfig) -> None:
    """Refuse parameters the generator cannot use, naming the key."""
    problems = {
        "num_nodes": (cfg.num_nodes >= 2, "at least 2"),
        "num_classes": (cfg.num_classes >= 1, "at least 1"),
        "num_features": (cfg.num_features >= 1, "at least 1"),
        "avg_degree": (cfg.avg_degree > 0, "positive"),
        "degree_exponent": (cfg.degree_exponent > 1, "above 1"),
        "homophily": (0.0 <= cfg.homophily <= 1.0, "in [0, 1]"),
        "feature_noise": (cfg.feature_noise >= 0, "non-negative"),
        "train_fraction": (cfg.train_fraction > 0, "positive"),
        "val_fraction": (cfg.val_fraction >= 0, "non-negative"),
    }
    for key, (ok, expected) in problems.items():
        if not ok:
            raise ConfigError(
                f"data.synthetic.{key}: got {getattr(cfg, key)!r}; it must be {expected}"
            )
    if cfg.train_fraction + cfg.val_fraction > 1:
        raise ConfigError(
            "data.synthetic.train_fraction/val_fraction: got "
            f"{cfg.train_fraction}/{cfg.val_fraction}; their sum must be at most 1"
        )


def _streams(seed: int) -> dict[str, np.random.Generator]:
    """One independent generator per concern, all spawned from ``seed``."""
    children = np.random.SeedSequence(seed).spawn(len(_STREAMS))
    pairs = zip(_STREAMS, children, strict=True)
    return {name: np.random.default_rng(child) for name, child in pairs}


def _vertex_weights(
    rng: np.random.Generator, n: int, avg_degree: float, exponent: float
) -> np.ndarray:
    """``(n,)`` float64 Pareto weights of tail exponent ``exponent`` and mean ``avg_degree``."""
    weights = rng.pareto(exponent - 1.0, size=n)
    weights += 1.0
    weights *= avg_degree / weights.mean()
    return weights


def _id_dtype(n: int) -> type[np.integer]:
    """The narrowest integer type that holds vertex ids below ``n``."""
    return np.int32 if n <= np.iinfo(np.int32).max else np.int64


def _simple_edge_keys(
    rng: np.random.Generator,
    weights: np.ndarray,
    labels: np.ndarray,
    num_classes: int,
    homophily: float,
) -> np.ndarray:
    """Sorted unique keys ``min(u, v) * n + max(u, v)`` of the simple undirected graph.

    Vertex ``u`` starts ``Poisson(w_u / 2)`` edges; ``Binomial(., homophily)`` of them
    end in ``u``'s class, the rest anywhere, each end drawn in proportion to weight.
    """
    n = weights.shape[0]
    starts = rng.poisson(weights / 2.0)
    same_class = rng.binomial(starts, homophily)
    parts = [_pair_keys(rng, np.arange(n), starts - same_class, weights, n)]
    del starts
    by_class = np.argsort(labels, kind="stable")
    bounds = np.concatenate(([0], np.cumsum(np.bincount(labels, minlength=num_classes))))
    for begin, end in itertools.pairwise(bounds):
        members = by_class[begin:end]
        parts.append(_pair_keys(rng, members, same_class[members], weights[members], n))
    del same_class, by_class
    keys = np.concatenate(parts)
    del parts
    keys.sort()
    distinct = np.empty(keys.shape[0], dtype=bool)
    distinct[:1] = True
    np.not_equal(keys[1:], keys[:-1], out=distinct[1:])
    return keys[distinct]


def _pair_keys(
    rng: np.random.Generator,
    members: np.ndarray,
    starts: np.ndarray,
    weights: np.ndarray,
    n: int,
) -> np.ndarray:
    """Undirected keys of the edges started by ``members``, ended in ``members``.

    ``members[i]`` starts ``starts[i]`` edges; their other ends are a multinomial draw
    over ``members`` with probabilities ``weights / weights.sum()``, shuffled to pair
    them at random. Self loops are dropped; duplicates are left to the caller.
    """
    ids = members.astype(_id_dtype(n), copy=False)
    draws = int(starts.sum())
    if draws == 0:
        return np.empty(0, dtype=np.int64)
    ends = np.repeat(ids, rng.multinomial(draws, weights / weights.sum()))
    rng.shuffle(ends)
    begins = np.repeat(ids, starts)
    low = np.minimum(begins, ends).astype(np.int64)
    np.maximum(begins, ends, out=ends)
    del begins
    keys = low * n
    keys += ends
    return keys[low != ends]


def _symmetric_edges(keys: np.ndarray, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(2E,)`` int64 ``src``, ``dst``: each key's edge, then all of them reversed."""
    count = keys.shape[0]
    src = torch.empty(2 * count, dtype=torch.int64)
    dst = torch.empty(2 * count, dtype=torch.int64)
    low, high = src.numpy(), dst.numpy()
    np.floor_divide(keys, n, out=low[:count])
    np.multiply(low[:count], n, out=high[:count])
    np.subtract(keys, high[:count], out=high[:count])
    low[count:] = high[:count]
    high[count:] = low[:count]
    return src, dst


def _gaussian_features(
    rng: np.random.Generator,
    n: int,
    dim: int,
    noise: float = 1.0,
    labels: np.ndarray | None = None,
) -> Iterator[np.ndarray]:
    """Float32 rows of ``noise * N(0, I)`` plus a ``N(0, I)`` centroid per class, in
    chunks of :data:`_FEATURE_CHUNK_ROWS` consecutive vertices.

    Without ``labels`` the rows are pure noise. The centroids are drawn first, then
    the rows in order, so the chunking never changes the values.
    """
    centroids = None
    if labels is not None:
        centroids = rng.standard_normal((int(labels.max()) + 1, dim), dtype=np.float32)
    for begin in range(0, n, _FEATURE_CHUNK_ROWS):
        block = np.empty((min(_FEATURE_CHUNK_ROWS, n - begin), dim), dtype=np.float32)
        rng.standard_normal(dtype=np.float32, out=block)
        block *= np.float32(noise)
        if centroids is not None:
            block += centroids[labels[begin : begin + block.shape[0]]]
        yield block


def _key_degrees(keys: np.ndarray, n: int) -> np.ndarray:
    """``(n,)`` int64 degree of each vertex in the undirected edges ``keys``, counted in
    chunks (no full-size temporaries)."""
    degree = np.zeros(n, dtype=np.int64)
    for start in range(0, keys.shape[0], _FEATURE_CHUNK_ROWS):
        low, high = np.divmod(keys[start : start + _FEATURE_CHUNK_ROWS], n)
        degree += np.bincount(low, minlength=n)
        degree += np.bincount(high, minlength=n)
    return degree


def _split_masks(
    rng: np.random.Generator, n: int, train_fraction: float, val_fraction: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Disjoint ``(n,)`` bool train, validation and test masks covering every vertex."""
    order = torch.from_numpy(rng.permutation(n))
    n_train = round(train_fraction * n)
    n_val = min(round(val_fraction * n), n - n_train)
    split = torch.zeros(n, dtype=torch.uint8)
    split[order[n_train : n_train + n_val]] = 1
    split[order[n_train + n_val :]] = 2
    return split == 0, split == 1, split == 2
