"""The evaluation a run asks for: one interface over both engines, and the choice.

An :class:`Evaluator` gives the full-graph accuracy of every split, collectively (every
rank calls it), in its own heap phase (:func:`~dgl_scalegnn.heap.evaluation_heap`).
Two engines compute the same counts:

- :class:`LayerwiseEvaluation`: one distributed layer-wise forward in row chunks
  (:mod:`~dgl_scalegnn.evaluation.layerwise`); it holds a layer's input and output over
  every vertex (:mod:`~dgl_scalegnn.evaluation.buffer_plan`);
- :class:`StreamedEvaluation`: the same forward with its whole-graph matrices in scratch
  files (:mod:`~dgl_scalegnn.evaluation.scratch`), streamed a piece at a time, so that
  a rank holds two buffers of them, not the matrices;
- :class:`NeighbourhoodEvaluation`: every rank its share of the vertices from their
  neighbourhoods (:mod:`~dgl_scalegnn.evaluation.neighbourhood`), in memory bounded by
  its pieces, at the price of recomputation.

:func:`choose_evaluator` takes ``train.evaluation``: ``neighbourhood`` as asked;
``layerwise`` in memory where it fits the memory every rank has, else streamed; ``auto``
the same, else the neighbourhood one, with a note saying why.

Example
-------
>>> from dgl_scalegnn.config import ModelConfig, SyntheticConfig
>>> from dgl_scalegnn.core.grid_shape import GridShape
>>> from dgl_scalegnn.data.prepared import prepare_in_memory
>>> from dgl_scalegnn.data.synthetic import generate
>>> from dgl_scalegnn.distributed.comm import Runtime
>>> from dgl_scalegnn.distributed.grid import Grid4D
>>> graph = prepare_in_memory(generate(SyntheticConfig(num_nodes=500)), 0)
>>> model = ParallelScaleGNN(ModelConfig(layers=2, hidden=16), in_features=64,
...                          num_classes=8, runtime=Runtime.single_process(), seed=0)
>>> store = RankStore(graph, Grid4D.view(GridShape.parse("1x1x1x1"), 0), 2)
>>> choice = choose_evaluator("auto", model, store, graph, Objective(model.runtime),
...                           available=lambda: (1 << 30, "this host"))
>>> choice.evaluator.name, sorted(choice.evaluator.accuracies())
('layerwise', ['test_acc', 'train_acc', 'val_acc'])
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from dgl_scalegnn.cache_dir import default_cache_dir
from dgl_scalegnn.config import ConfigError
from dgl_scalegnn.data.prepared import PreparedGraph
from dgl_scalegnn.distributed.comm import agree_on
from dgl_scalegnn.evaluation.layerwise import full_graph_counts, streams
from dgl_scalegnn.evaluation.memory import (
    ChunkMemory,
    agreed_chunk_rows,
    full_graph_memory,
    scratch_bytes,
    streamed_memory,
)
from dgl_scalegnn.evaluation.neighbourhood import neighbourhood_counts
from dgl_scalegnn.heap import evaluation_heap
from dgl_scalegnn.model.objective import Objective
from dgl_scalegnn.model.scalegnn import ParallelScaleGNN
from dgl_scalegnn.sampling.store import RankStore

__all__ = [
    "Evaluator",
    "LayerwiseEvaluation",
    "StreamedEvaluation",
    "NeighbourhoodEvaluation",
    "Choice",
    "choose_evaluator",
]


class Evaluator:
    """The full-graph accuracy of a model, by one engine (:attr:`name`).

    Subclasses implement :meth:`counts`; :meth:`accuracies` calls it in the evaluation's
    heap phase with the model in evaluation mode, without autograd.
    """

    name: str = ""

    def __init__(self, model: ParallelScaleGNN) -> None:
        self.model = model

    def counts(self) -> dict[str, tuple[float, float]]:
        """Per split, (correct, total) over every vertex, summed over the grid
        (micro-F1 terms if multi-label); collective."""
        raise NotImplementedError

    @torch.no_grad()
    def accuracies(self) -> dict[str, float | None]:
        """``{"train_acc": ..., "val_acc": ..., "test_acc": ...}``; ``None`` for a split
        that selects no vertex. Collective: every rank calls it."""
        self.model.eval()
        with evaluation_heap():
            counts = self.counts()
        return {
            f"{split}_acc": c / total if total else None for split, (c, total) in counts.items()
        }


class LayerwiseEvaluation(Evaluator):
    """A distributed layer-wise forward over ``store``'s resident blocks, each chunk of
    logits counted as the last layer makes it
    (:func:`~dgl_scalegnn.evaluation.layerwise.full_graph_counts`)."""

    name = "layerwise"

    def __init__(self, model: ParallelScaleGNN, store: RankStore, objective: Objective) -> None:
        super().__init__(model)
        self.store, self.objective = store, objective

    def counts(self) -> dict[str, tuple[float, float]]:
        return full_graph_counts(self.model, self.store.full_graph(), self.objective)


class StreamedEvaluation(LayerwiseEvaluation):
    """:class:`LayerwiseEvaluation` with its whole-graph matrices in scratch files under
    ``scratch`` (a directory of their own each round, removed after it)."""

    name = "streamed"

    def __init__(
        self, model: ParallelScaleGNN, store: RankStore, objective: Objective, scratch: Path
    ) -> None:
        super().__init__(model, store, objective)
        self.scratch = scratch

    def counts(self) -> dict[str, tuple[float, float]]:
        full = self.store.full_graph()
        return full_graph_counts(self.model, full, self.objective, scratch=self.scratch)


class NeighbourhoodEvaluation(Evaluator):
    """Every rank its share of the vertices of the prepared ``graph``, from their
    neighbourhoods (:func:`~dgl_scalegnn.evaluation.neighbourhood.neighbourhood_counts`)."""

    name = "neighbourhood"

    def __init__(self, model: ParallelScaleGNN, graph: PreparedGraph) -> None:
        super().__init__(model)
        self.graph = graph

    def counts(self) -> dict[str, tuple[float, float]]:
        return neighbourhood_counts(self.model, self.graph)


@dataclass(frozen=True)
class Choice:
    """What :func:`choose_evaluator` decided: the ``evaluator``, and the ``note`` that
    says why where ``auto`` fell back to neighbourhoods (else ``None``)."""

    evaluator: Evaluator
    note: str | None = None


def choose_evaluator(
    asked: str,
    model: ParallelScaleGNN,
    store: RankStore,
    graph: PreparedGraph,
    objective: Objective,
    available: Callable[[], tuple[int, str]],
) -> Choice:
    """The evaluator of ``train.evaluation`` ``asked`` (collective).

    For ``layerwise`` and ``auto``, a layer-wise evaluation's whole-graph matrices and
    one chunk's temporaries (:func:`~dgl_scalegnn.evaluation.memory.full_graph_memory`,
    in the chunk rows every rank agrees on:
    :func:`~dgl_scalegnn.evaluation.memory.agreed_chunk_rows`) are compared with
    ``available()``: the bytes each rank has, the least over the ranks, and where they
    are (for the message). Every rank compares the same figures (the most any rank
    needs: one all-reduce), so all choose alike. Where the matrices do not fit but the
    model :func:`~dgl_scalegnn.evaluation.layerwise.streams`, the streamed evaluation is
    taken where its buffers fit and the cache directory's filesystem has room for its
    files (:func:`~dgl_scalegnn.evaluation.memory.scratch_bytes`), with a note.

    Raises
    ------
    ConfigError
        ``layerwise`` was asked for and does not fit: it would be killed for memory at
        its first round, after all the training before it.
    """
    if asked == "neighbourhood":
        return Choice(NeighbourhoodEvaluation(model, graph))
    full = store.full_graph()
    chunk_rows = agreed_chunk_rows(model, full)
    room, where = available()

    def most(value: float) -> float:  # the largest over the ranks (collective)
        return agree_on(value, dist.ReduceOp.MAX, full.features.device)

    def needs(memory: ChunkMemory) -> float:
        return most(memory.reserved_bytes + chunk_rows * memory.row_bytes)

    need = needs(full_graph_memory(model, full))  # every rank is here: after loading
    if need <= room:
        return Choice(LayerwiseEvaluation(model, store, objective))
    shortfall = (
        f"parallel.grid {model.runtime.grid.shape}: a layer-wise evaluation needs "
        f"{need / 1e9:.2f} GB a rank beside what the rank holds (a layer's input and "
        f"output over all {store.num_nodes:,} vertices, and one chunk of {chunk_rows:,} "
        f"rows), but {where} has {room / 1e9:.2f} GB"
    )
    if streams(model):
        streamed_need = needs(streamed_memory(model, full))
        scratch = default_cache_dir("evaluation")
        disk = scratch_bytes(model, full)[0]
        free = shutil.disk_usage(scratch).free
        short_of_disk = most(float(disk > free))  # every rank decides alike
        if streamed_need <= room and not short_of_disk:
            return Choice(
                StreamedEvaluation(model, store, objective, scratch),
                f"{shortfall}: streaming them through scratch files in {scratch} instead "
                f"(up to {disk / 1e9:.2f} GB a rank there, {streamed_need / 1e9:.2f} GB "
                "of memory a rank), removed after each round",
            )
        shortfall += (
            f"; streamed through scratch files it needs {streamed_need / 1e9:.2f} GB a rank "
            f"and {disk / 1e9:.2f} GB of the {free / 1e9:.2f} GB free in {scratch}"
        )
    if asked == "auto":
        return Choice(
            NeighbourhoodEvaluation(model, graph),
            f"{shortfall}: evaluating in neighbourhoods instead (train.evaluation: auto): "
            "each rank its share of the vertices, in pieces whose memory is bounded by "
            "their adjacency entries, the hidden rows below the last layer recomputed for "
            "each piece that needs them",
        )
    raise ConfigError(
        f"{shortfall}: the run would be killed for memory at its first evaluation. Set "
        "train.evaluation to neighbourhood (or auto), whose memory is bounded by its "
        "chunk; or give each rank more memory (fewer ranks a host, or larger hosts), or "
        "use a grid whose ranks hold smaller shares (scalegnn plan ranks the grids by "
        "memory)"
    )
