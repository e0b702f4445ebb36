"""Uniform vertex sampling with unbiased edge rescaling.

At step :math:`t` a data-parallel group :math:`d` draws
:math:`S \\sim \\mathrm{Uniform}\\binom{V}{B}` from a seed that depends only on
``(base_seed, d, t)``, so every rank of the group derives the same sorted :math:`S`
without a message. The mini-batch adjacency keeps the edges with both ends in
:math:`S` and divides off-diagonal values by

.. math::

    p = \\Pr[u \\in S \\mid v \\in S] = \\frac{B - 1}{N - 1},

so that :math:`E[\\sum_{u \\in S} \\tilde a_{vu} x_u \\mid v \\in S] = \\sum_u a_{vu} x_u`.
:class:`UniformSampler` is this method behind the sampler interface
(:class:`~dgl_scalegnn.sampling.sampler.VertexSampler`, ``sampling.method: uniform``):
it draws :math:`S` and gives :math:`p` as the :class:`EdgeScaling` the blocks apply.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dgl_scalegnn.core.seeds import step_seed

__all__ = [
    "EdgeScaling",
    "UniformSampler",
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


@dataclass(frozen=True)
class EdgeScaling:
    """What makes a sampled block unbiased: its off-diagonal values divided by ``p``.

    ``p`` is the probability that a neighbour of a sampled vertex is sampled too (1: no
    rescaling). A sampler gives it (:meth:`UniformSampler.scaling`); the blocks apply it.

    >>> EdgeScaling(p=0.5).apply(torch.tensor([1.0, 1.0]), torch.tensor([True, False])).tolist()
    [1.0, 2.0]
    """

    p: float

    @property
    def inverse(self) -> float:
        """``1 / p``: the factor of the off-diagonal sum in the ``dgl-scaled`` kernel."""
        return 1.0 / self.p

    def apply(self, values: torch.Tensor, diagonal: torch.Tensor) -> torch.Tensor:
        """``values`` with the entries off the diagonal (``diagonal`` False) divided by ``p``."""
        return rescale_off_diagonal(values, diagonal, self.p)


@dataclass(frozen=True)
class UniformSampler:
    """``sampling.method: uniform``: ``batch_size`` of ``num_nodes`` vertices a step.

    Data-parallel group ``group`` draws step ``t`` from ``(seed, group, t)``, so every
    rank of the group draws the same sorted vertices without a message. (The
    :class:`dgl.dataloading.Sampler` of this method for a single-process DGL loop is
    :class:`~dgl_scalegnn.sampling.dgl_loader.UniformVertexSampler`.)

    >>> sampler = UniformSampler(num_nodes=10, batch_size=4, seed=0, group=1)
    >>> torch.equal(sampler.draw(3), sample_vertices(10, 4, step_seed(0, 1, 3)))
    True
    >>> sampler.scaling().p == 3 / 9
    True
    """

    num_nodes: int
    batch_size: int
    seed: int = 0
    group: int = 0

    def draw(self, step: int) -> torch.Tensor:
        """The sorted ``(batch_size,)`` int64 vertex ids of global step ``step``."""
        seed = step_seed(self.seed, self.group, step)
        return sample_vertices(self.num_nodes, self.batch_size, seed)

    def scaling(self) -> EdgeScaling:
        """The scaling of every sample drawn: :math:`p = (B - 1) / (N - 1)`."""
        return EdgeScaling(inclusion_probability(self.num_nodes, self.batch_size))
