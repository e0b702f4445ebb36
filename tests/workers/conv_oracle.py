"""Rank worker: each case's training step (logits, loss, gradients) and, where asked,
its full-graph evaluation, for the layer types of ``model.conv``.

Run by :func:`tests.ranks.spawn_ranks` as ``tests.workers.conv_oracle:main``; saves
``rank{r}_{case}.pt`` to ``spec["out"]``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dgl_scalegnn.config import config_from_mapping
from dgl_scalegnn.data.prepared import prepare_in_memory
from dgl_scalegnn.evaluation.layerwise import full_graph_forward
from dgl_scalegnn.train.metrics import MetricsWriter
from dgl_scalegnn.train.run import end_session, start_session
from dgl_scalegnn.train.trainer import Trainer
from tests.helpers import first_step_gradients, random_dataset


def _record(grid, spec, tensor: torch.Tensor) -> dict:
    row_start, row_stop = spec.row_range(grid.coords)
    col_start, col_stop = spec.col_range(grid.shape, grid.coords)
    return {"value": tensor.detach(), "rows": (row_start, row_stop), "cols": (col_start, col_stop)}


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(1)
    parallel = {"grid": spec["grid"]}
    session = start_session(config_from_mapping({"parallel": parallel}).parallel)
    runtime = session.runtime
    grid = runtime.grid
    prepared = prepare_in_memory(random_dataset(**spec["graph"]), permutation_seed=3)
    try:
        for name, case in spec["cases"].items():
            cfg = config_from_mapping(
                {
                    "model": case["model"],
                    "sampling": {"batch_size": case["batch_size"], "seed": 0},
                    "train": {"seed": 0, "progress": False},
                    "parallel": parallel,
                    "optim": {"lr": 0.01},
                }
            )
            trainer = Trainer(cfg, prepared, runtime, MetricsWriter(None, enabled=False))
            model = trainer.model
            _, logits, logits_spec, loss = first_step_gradients(trainer)
            record = {
                "coords": [grid.coords.d, grid.coords.x, grid.coords.y, grid.coords.z],
                "logits": _record(grid, logits_spec, logits),
                "loss": loss.item(),
                "grads": {n: p.grad.clone() for n, p in model.sharded_state_dict().items()},
            }
            if case.get("chunk_rows"):
                model.eval()
                full = full_graph_forward(model, trainer.store.full_graph(), case["chunk_rows"])
                record["eval"] = _record(grid, full[1], full[0])
            torch.save(record, Path(spec["out"]) / f"rank{grid.rank}_{name}.pt")
    finally:
        end_session(session)
