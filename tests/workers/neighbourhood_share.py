"""Rank worker: the logits of every vertex from their neighbourhoods, the kept hubs'
rows shared out among the ranks.

Run by :func:`tests.ranks.spawn_ranks` as ``tests.workers.neighbourhood_share:main``.
After one training step (so that no two ranks' shards agree by symmetry), saves
``rank{r}.pt`` to ``spec["out"]``: the rank's coordinates and parameter shards, the
gathered one-process copy's parameters, the hubs, and the logits of every vertex by an
evaluator built with ``share=(rank, world)``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from dgl_scalegnn.config import config_from_mapping
from dgl_scalegnn.data.prepared import prepare_in_memory
from dgl_scalegnn.evaluation.neighbourhood import NeighbourhoodEvaluator, one_rank_copy
from dgl_scalegnn.train.metrics import MetricsWriter
from dgl_scalegnn.train.run import end_session, start_session
from dgl_scalegnn.train.trainer import Trainer
from tests.helpers import random_dataset


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(1)
    cfg = config_from_mapping(
        {
            "model": spec["model"],
            "sampling": {"batch_size": spec["batch_size"], "seed": 0},
            "train": {"seed": 0, "progress": False},
            "parallel": {"grid": spec["grid"]},
        }
    )
    session = start_session(cfg.parallel)
    grid = session.runtime.grid
    prepared = prepare_in_memory(random_dataset(**spec["graph"]), permutation_seed=3)
    try:
        trainer = Trainer(cfg, prepared, session.runtime, MetricsWriter(None, enabled=False))
        trainer.train_step(trainer.sample(0))
        trainer.model.eval()
        copy = one_rank_copy(trainer.model)
        evaluator = NeighbourhoodEvaluator(
            copy,
            prepared,
            spec["piece_entries"],
            spec["hub_bytes"],
            share=(dist.get_rank(), dist.get_world_size()),
        )
        logits, _ = evaluator.logits(np.arange(prepared.meta.num_nodes))
        record = {
            "coords": [grid.coords.d, grid.coords.x, grid.coords.y, grid.coords.z],
            "shards": {
                n: p.detach().clone() for n, p in trainer.model.sharded_state_dict().items()
            },
            "copy": {n: p.detach().clone() for n, p in copy.sharded_state_dict().items()},
            "hubs": torch.from_numpy(evaluator.hubs),
            "logits": logits,
        }
        torch.save(record, Path(spec["out"]) / f"rank{grid.rank}.pt")
    finally:
        end_session(session)
