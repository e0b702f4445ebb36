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

import torch

__all__ = [
    "sample_vertices",
    "inclusion_probability",
    "rescale_off_diagonal",
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
