"""Rank worker: the parallel losses with class weights and label smoothing, per shard.

Run by :func:`tests.ranks.spawn_ranks` as ``tests.workers.weighted_losses:main`` with a
grid, a multi-label flag and an output directory. Each rank trains nothing: it takes the
model's logits of batch 0 as a leaf, computes the loss of
:class:`~dgl_scalegnn.model.objective.Objective` with weights ``1 + c / C`` and smoothing
0.1, backpropagates, and saves ``rank{r}.pt``: its logits shard with the global rows and
columns it holds, its data-parallel group (whose batch it is), their gradient, the loss,
and the batch's labels and training mask.
"""

from __future__ import annotations

from pathlib import Path

import torch

from dgl_scalegnn.config import config_from_mapping
from dgl_scalegnn.data.prepared import prepare_in_memory
from dgl_scalegnn.model.objective import Objective
from dgl_scalegnn.train.metrics import MetricsWriter
from dgl_scalegnn.train.run import end_session, start_session
from dgl_scalegnn.train.trainer import Trainer
from tests.helpers import random_dataset

SMOOTHING = 0.1


def main(grid_text: str, multilabel: bool, out: str) -> None:
    torch.set_num_threads(1)
    cfg = config_from_mapping(
        {
            "model": {"hidden": 8, "layers": 2, "head": True},
            "sampling": {"batch_size": 60},
            "parallel": {"grid": grid_text},
        }
    )
    session = start_session(cfg.parallel)
    runtime, grid = session.runtime, session.runtime.grid
    try:
        dataset = random_dataset(num_nodes=90, num_edges=400, num_classes=6, multilabel=multilabel)
        graph = prepare_in_memory(dataset, permutation_seed=1)
        trainer = Trainer(cfg, graph, runtime, MetricsWriter(None, enabled=False))
        batch = trainer.sample(0)
        logits, spec = trainer.model(batch)
        leaf = logits.detach().requires_grad_()
        weights = 1 + torch.arange(6, dtype=torch.float32) / 6
        loss = Objective(runtime, multilabel, weights, SMOOTHING).loss(leaf, spec, batch)
        loss.backward()
        rows = spec.rows.ids(spec.layout.rows, grid.coord(spec.layout.rows))
        record = {
            "logits": leaf.detach(),
            "grad": leaf.grad,
            "rows": rows,
            "cols": spec.col_range(grid.shape, grid.coords),
            "loss": loss.detach(),
            "group": grid.coords.d,
            "labels": batch.labels,
            "mask": batch.masks["train"],
        }
        torch.save(record, Path(out) / f"rank{grid.rank}.pt")
    finally:
        end_session(session)
