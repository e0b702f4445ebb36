"""This rank's mini-batches, step by step and epoch by epoch: the sampler unit.

Step :math:`t` of data-parallel group :math:`d` draws its vertices from
:math:`(\\text{seed}, d, t)` (:mod:`~dgl_scalegnn.sampling.uniform`) and every rank
cuts its shard of the batch from its own share of the graph
(:class:`~dgl_scalegnn.sampling.store.RankStore`), with no message. So a batch is a
function of its step alone: a run resumed at step :math:`t` draws the batches it would
have drawn, and so does any grid with the same ``Gd``. An epoch is
:math:`\\lceil \\lceil N / B \\rceil / G_d \\rceil` steps.

Example
-------
>>> from dgl_scalegnn.config import SyntheticConfig
>>> from dgl_scalegnn.data.prepared import prepare_in_memory
>>> from dgl_scalegnn.data.synthetic import generate
>>> from dgl_scalegnn.distributed.grid import Grid4D
>>> from dgl_scalegnn.core.grid_shape import GridShape
>>> graph = prepare_in_memory(generate(SyntheticConfig(num_nodes=500)), 0)
>>> batches = MiniBatches(graph, Grid4D.view(GridShape(1, 1, 1, 1), 0), layers=2,
...                       batch_size=100)
>>> batches.steps_per_epoch, [batch.step for batch in batches.epoch(1)]
(5, [5, 6, 7, 8, 9])
>>> batches[7].rows.vertex_ids.numel()
100
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from dgl_scalegnn.config import ConfigError, SamplingConfig
from dgl_scalegnn.core.schedule import GCN_KIND, LayerKind, steps_per_epoch
from dgl_scalegnn.data.prepared import PreparedGraph
from dgl_scalegnn.distributed.grid import Grid4D
from dgl_scalegnn.profiling import Profiler
from dgl_scalegnn.sampling.batch import RankBatch
from dgl_scalegnn.sampling.sampler import build_sampler
from dgl_scalegnn.sampling.store import RankStore

__all__ = ["MiniBatches"]


class MiniBatches:
    """The batches of this rank on ``grid`` for a model of ``layers`` layers of ``kind``.

    Parameters
    ----------
    graph : PreparedGraph
        The prepared graph; the rank maps its share (:class:`RankStore`).
    grid : Grid4D
        This rank's place on the grid.
    layers : int
        The model's graph layers; with ``kind`` (the layer type's
        :class:`~dgl_scalegnn.core.schedule.LayerKind`, by default GCN's) they decide the
        adjacency planes and their normalisation.
    batch_size, seed, method :
        :class:`~dgl_scalegnn.config.SamplingConfig`'s (B per data-parallel group).
    spmm_kernel : str
        ``parallel.spmm_kernel``.
    device : torch.device or str
        Where the batches live.
    profiler : Profiler or None
        Times each batch's build as ``sampling``.
    """

    def __init__(
        self,
        graph: PreparedGraph,
        grid: Grid4D,
        layers: int,
        batch_size: int,
        *,
        kind: LayerKind = GCN_KIND,
        seed: int = 0,
        method: str = "uniform",
        spmm_kernel: str = "auto",
        device: torch.device | str = "cpu",
        profiler: Profiler | None = None,
    ) -> None:
        num_nodes = graph.meta.num_nodes
        if not 2 <= batch_size <= num_nodes:
            raise ConfigError(
                f"batch_size: got {batch_size}, but {graph.meta.name!r} has {num_nodes} "
                f"vertices; use 2 to {num_nodes}"
            )
        sampling = SamplingConfig(method=method, batch_size=batch_size, seed=seed)  # type: ignore[arg-type]
        self.graph, self.grid, self.batch_size = graph, grid, batch_size
        self.profiler = profiler if profiler is not None else Profiler()
        #: ``sampling.method``'s sampler: this rank's DP group's vertices of each step.
        self.sampler = build_sampler(sampling, num_nodes, group=grid.coords.d)
        #: This rank's share of the graph (the full-graph evaluation reads it too).
        self.store = RankStore(graph, grid, layers, spmm_kernel, device, kind=kind)
        #: Steps of one epoch: every vertex once over the data-parallel groups.
        self.steps_per_epoch = steps_per_epoch(num_nodes, batch_size, grid.shape.dp)

    def __getitem__(self, step: int) -> RankBatch:
        """This rank's batch of global step ``step`` (no communication)."""
        with self.profiler.region("sampling"):
            vertices = self.sampler.draw(step)  # on the CPU: see RankStore.batch
            return self.store.batch(vertices, step, self.sampler.scaling())

    def epoch(self, epoch: int, start: int = 0) -> Iterator[RankBatch]:
        """The batches of epoch ``epoch`` (0-based), from its step ``start`` on (a run
        resumed inside an epoch)."""
        first = epoch * self.steps_per_epoch
        for step in range(first + start, first + self.steps_per_epoch):
            yield self[step]
