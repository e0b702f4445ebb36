"""The training loss and the evaluation counts of a logits shard.

Single-label graphs: cross-entropy averaged over the labelled rows of a split, and
(correct, total) per split. Multi-label graphs: binary cross-entropy over the classes,
and the micro-F1 terms :math:`(2\\,TP,\\; 2\\,TP + FP + FN)` per split. Every value is
the same on every rank of the grid; the rows of a split are the batch's rows whose
mask is set.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dgl_scalegnn.config import ConfigError
from dgl_scalegnn.core.cost import CollectiveCost, LocalSizes
from dgl_scalegnn.core.layout import Layout
from dgl_scalegnn.distributed.comm import Runtime, all_reduce
from dgl_scalegnn.parallel.losses import (
    bce_cost,
    cross_entropy_cost,
    parallel_argmax,
    parallel_bce,
    parallel_cross_entropy,
)
from dgl_scalegnn.parallel.partition import ShardSpec
from dgl_scalegnn.sampling.batch import RankBatch
from dgl_scalegnn.sampling.store import FullGraph

__all__ = ["Objective", "split_counts"]


class Objective:
    """Loss and metric counting for a model on ``runtime``'s grid.

    Parameters
    ----------
    runtime : Runtime
        Grid and profiler.
    multilabel : bool
        Binary cross-entropy and micro-F1 instead of cross-entropy and accuracy.
    class_weights : torch.Tensor or None
        ``(C,)``: each class's weight in the loss (PyTorch's ``weight``), on every rank.
    label_smoothing : float
        PyTorch's ``label_smoothing`` (multi-label: targets :math:`t (1 - \\epsilon) +
        \\epsilon / 2`).
    """

    def __init__(
        self,
        runtime: Runtime,
        multilabel: bool = False,
        class_weights: torch.Tensor | None = None,
        label_smoothing: float = 0.0,
    ) -> None:
        if not 0.0 <= label_smoothing < 1.0:
            raise ConfigError(f"label_smoothing: got {label_smoothing}, expected 0 <= it < 1")
        self.runtime, self.multilabel = runtime, multilabel
        self.class_weights, self.label_smoothing = class_weights, label_smoothing

    def loss(
        self, logits: torch.Tensor, spec: ShardSpec, batch: RankBatch, split: str = "train"
    ) -> torch.Tensor:
        """Mean loss over the batch rows labelled for ``split`` (same value on every rank)."""
        mask = batch.masks[split]
        if self.multilabel:
            grid = self.runtime.grid
            class_start, class_stop = spec.col_range(grid.shape, grid.coords)
            targets = batch.labels[:, class_start:class_stop]
            return parallel_bce(
                logits, targets, mask, spec, self.runtime, self.class_weights, self.label_smoothing
            )
        return parallel_cross_entropy(
            logits, batch.labels, mask, spec, self.runtime, self.class_weights, self.label_smoothing
        )

    def __call__(
        self, logits: torch.Tensor, spec: ShardSpec, batch: RankBatch, split: str = "train"
    ) -> torch.Tensor:
        """:meth:`loss`."""
        return self.loss(logits, spec, batch, split)

    @staticmethod
    def loss_cost(layout: Layout, sizes: LocalSizes, multilabel: bool) -> list[CollectiveCost]:
        """Collectives of :meth:`loss` on logits in ``layout``."""
        return bce_cost(layout) if multilabel else cross_entropy_cost(layout, sizes)

    @torch.no_grad()
    def count_tensor(
        self,
        logits: torch.Tensor,
        spec: ShardSpec,
        batch: RankBatch | FullGraph,
        splits: Sequence[str],
    ) -> torch.Tensor:
        """Per split of ``splits``, (correct, total) summed over the grid (micro-F1 terms if
        multi-label), as a ``(len(splits), 2)`` float64 tensor on the logits' device:
        nothing is read back, so that the pieces of an evaluation add up on the device."""
        grid, profiler = self.runtime.grid, self.runtime.profiler
        if self.multilabel:
            class_start, class_stop = spec.col_range(grid.shape, grid.coords)
            predicted = logits > 0
            truth = batch.labels[:, class_start:class_stop] > 0.5
            rows = []
            for split in splits:
                mask = batch.masks[split].unsqueeze(1)
                true_pos = (predicted & truth & mask).sum()
                false_any = ((predicted ^ truth) & mask).sum()
                rows.append(torch.stack((2 * true_pos, 2 * true_pos + false_any)))
            counts = all_reduce(torch.stack(rows).double(), grid.group(spec.layout.cols), profiler)
        else:
            predicted = parallel_argmax(logits, spec, self.runtime)
            correct = predicted == batch.labels
            # every split in two reductions (an evaluation counts each chunk of logits)
            masks = torch.stack([batch.masks[s] for s in splits])
            counts = torch.stack(((masks & correct).sum(1), masks.sum(1)), dim=1).double()
        return all_reduce(counts, grid.group(spec.layout.rows), profiler)

    @torch.no_grad()
    def counts(
        self, logits: torch.Tensor, spec: ShardSpec, batch: RankBatch | FullGraph
    ) -> dict[str, tuple[float, float]]:
        """Per split, (correct, total) summed over the grid (micro-F1 terms if
        multi-label): :meth:`count_tensor` of every split, read back once."""
        splits = sorted(batch.masks)
        return split_counts(splits, self.count_tensor(logits, spec, batch, splits))


def split_counts(splits: Sequence[str], counts: torch.Tensor) -> dict[str, tuple[float, float]]:
    """``counts`` (:meth:`Objective.count_tensor` of ``splits``) per split, read back once.

    >>> split_counts(["train", "val"], torch.tensor([[3.0, 4.0], [1.0, 2.0]]))
    {'train': (3.0, 4.0), 'val': (1.0, 2.0)}
    """
    return {split: (hits, total) for split, (hits, total) in zip(splits, counts.tolist())}
