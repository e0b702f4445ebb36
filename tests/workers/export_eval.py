"""Rank worker: train a few steps, checkpoint, and save the distributed evaluation.

Run by :func:`tests.ranks.spawn_ranks` as ``tests.workers.export_eval:main``. For each
variant of the spec (a config mapping with its own ``output.dir``), trains through
:meth:`Trainer.fit` (which checkpoints its last step), then saves ``rank{r}_{variant}.pt``
to ``spec["out"]``: this rank's shard of the full-graph logits with its row and column
ranges, the accuracy :meth:`Trainer.evaluate` reports, and (rank 0) the permutation from
the graph's vertex ids to the prepared order.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dgl_scalegnn.config import config_from_mapping
from dgl_scalegnn.data.datasets import load_dataset
from dgl_scalegnn.data.prepared import prepare_in_memory
from dgl_scalegnn.evaluation.layerwise import full_graph_forward
from dgl_scalegnn.train.metrics import MetricsWriter
from dgl_scalegnn.train.run import end_session, start_session
from dgl_scalegnn.train.trainer import Trainer


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    configs = {name: config_from_mapping(mapping) for name, mapping in spec["variants"].items()}
    session = start_session(next(iter(configs.values())).parallel)
    grid = session.runtime.grid
    try:
        for name, cfg in configs.items():
            prepared = prepare_in_memory(load_dataset(cfg.data), cfg.data.permutation_seed)
            trainer = Trainer(cfg, prepared, session.runtime, MetricsWriter(None, enabled=False))
            trainer.fit()
            trainer.model.eval()
            logits, logits_spec = full_graph_forward(trainer.model, trainer.store.full_graph())
            record = {
                "logits": logits,
                "logit_rows": logits_spec.row_range(grid.coords),
                "logit_cols": logits_spec.col_range(grid.shape, grid.coords),
                "accuracy": trainer.evaluate(),
                "permutation": torch.from_numpy(prepared.permutation),
            }
            torch.save(record, Path(spec["out"]) / f"rank{grid.rank}_{name}.pt")
    finally:
        end_session(session)
