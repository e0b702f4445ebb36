"""Rank worker: the parallel model's logits, loss and gradients for one sampled batch.

Run by :func:`tests.ranks.spawn_ranks` as ``tests.workers.grid_equivalence:main``.
Saves ``rank{r}_L{layers}.pt`` to ``spec["out"]``; the deepest model also takes
``spec["steps"]`` optimizer steps (the replica check).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dgl_scalegnn.config import config_from_mapping
from dgl_scalegnn.data.prepared import prepare_in_memory
from dgl_scalegnn.train.metrics import MetricsWriter
from dgl_scalegnn.train.run import end_session, start_session
from dgl_scalegnn.train.trainer import Trainer
from tests.helpers import first_step_gradients, random_dataset


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(1)
    base = {
        "model": spec["model"],
        "sampling": {"batch_size": spec["batch_size"], "seed": 0},
        "train": {"seed": 0, "progress": False},
        "parallel": {"grid": spec["grid"], **spec.get("parallel", {})},
        "optim": {"lr": 0.01},
    }
    cfg = config_from_mapping(base)
    session = start_session(cfg.parallel)
    runtime = session.runtime
    prepared = prepare_in_memory(random_dataset(**spec["graph"]), permutation_seed=3)
    grid = runtime.grid
    try:
        for layers in spec["layers"]:
            layer_cfg = config_from_mapping({**base, "model": {**spec["model"], "layers": layers}})
            trainer = Trainer(layer_cfg, prepared, runtime, MetricsWriter(None, enabled=False))
            model = trainer.model
            batch, logits, logits_spec, loss = first_step_gradients(trainer)
            row_start, row_stop = logits_spec.row_range(grid.coords)
            col_start, col_stop = logits_spec.col_range(grid.shape, grid.coords)
            record = {
                "coords": [grid.coords.d, grid.coords.x, grid.coords.y, grid.coords.z],
                "sample": batch.rows.vertex_ids,
                "logits": logits.detach(),
                "logit_rows": (row_start, row_stop),
                "logit_cols": (col_start, col_stop),
                "loss": loss.item(),
                "counts": trainer.objective.counts(logits.detach(), logits_spec, batch),
                "grads": {n: p.grad.clone() for n, p in model.sharded_state_dict().items()},
            }
            trainer.optimizer.step()
            params = model.sharded_state_dict()
            record["params_step1"] = {n: p.detach().clone() for n, p in params.items()}
            steps = spec.get("steps", 1) if layers == max(spec["layers"]) else 1
            for step in range(1, steps):
                trainer.train_step(trainer.sample(step))
            record["params_final"] = {n: p.detach().clone() for n, p in params.items()}
            torch.save(record, Path(spec["out"]) / f"rank{grid.rank}_L{layers}.pt")
    finally:
        end_session(session)
