"""The mini-batch sampler as one unit: ``sampling.method`` picks it from :data:`SAMPLERS`.

A :class:`VertexSampler` draws the vertices of a step and gives the
:class:`~dgl_scalegnn.sampling.uniform.EdgeScaling` that makes the blocks cut from them
unbiased. The trainer builds it once from the config (:func:`build_sampler`), and hands
each step's vertices and the scaling to the rank's store
(:meth:`~dgl_scalegnn.sampling.store.RankStore.batch`); the store and the blocks apply
the scaling and compute no probability of their own.

Example
-------
>>> from dgl_scalegnn.config import SamplingConfig
>>> sampler = build_sampler(SamplingConfig(method="uniform", batch_size=4), num_nodes=10)
>>> sampler.draw(0).numel(), sampler.scaling().p == 3 / 9
(4, True)
"""

from __future__ import annotations

from typing import Protocol

import torch

from dgl_scalegnn.config import SAMPLING_METHODS, SamplingConfig, registry
from dgl_scalegnn.sampling.uniform import EdgeScaling, UniformSampler

__all__ = ["VertexSampler", "SAMPLERS", "build_sampler"]


class VertexSampler(Protocol):
    """What a sampling method gives the trainer and the store."""

    def draw(self, step: int) -> torch.Tensor:
        """The sorted int64 vertex ids of global step ``step``: the same on every rank of
        the data-parallel group, found without a message."""

    def scaling(self) -> EdgeScaling:
        """How the blocks of the drawn vertices are rescaled to be unbiased."""


#: The sampler of each ``sampling.method``, built as ``(num_nodes, batch_size, seed, group)``.
SAMPLERS = registry("sampling.method", SAMPLING_METHODS, {"uniform": UniformSampler})


def build_sampler(sampling: SamplingConfig, num_nodes: int, group: int = 0) -> VertexSampler:
    """The sampler of ``sampling.method`` over ``num_nodes`` vertices for data-parallel
    group ``group`` (the group's coordinate ``d`` on the grid)."""
    return SAMPLERS[sampling.method](num_nodes, sampling.batch_size, sampling.seed, group)
