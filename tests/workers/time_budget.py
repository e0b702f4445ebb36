"""Rank worker: a run stopped by ``train.max_train_s``, each rank on its own fake clock.

Run by :func:`tests.ranks.spawn_ranks` as ``tests.workers.time_budget:main``. The
trainer's ``time.perf_counter`` advances ``spec["ticks"][rank]`` seconds a call, so the
ranks count different training seconds for the same steps. Saves ``rank{r}.json`` to
``spec["out"]``: per step the rate Adam used, the agreed seconds and the rank's own, and
the steps run.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

from dgl_scalegnn.config import config_from_mapping
from dgl_scalegnn.data.prepared import prepare_in_memory
from dgl_scalegnn.train import trainer as trainer_module
from dgl_scalegnn.train.metrics import MetricsWriter
from dgl_scalegnn.train.run import end_session, start_session
from dgl_scalegnn.train.trainer import Trainer
from tests.helpers import random_dataset, record_steps


def fake_clock(tick: float) -> SimpleNamespace:
    """A stand-in for the ``time`` module whose ``perf_counter`` advances ``tick`` a call."""
    now = [0.0]

    def perf_counter() -> float:
        now[0] += tick
        return now[0]

    return SimpleNamespace(perf_counter=perf_counter)


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(1)
    cfg = config_from_mapping(spec["config"])
    session = start_session(cfg.parallel)
    prepared = prepare_in_memory(random_dataset(num_nodes=200, num_edges=1000), 0)
    try:
        trainer_module.time = fake_clock(spec["ticks"][dist.get_rank()])
        trainer = Trainer(cfg, prepared, session.runtime, MetricsWriter(None, enabled=False))
        seen = record_steps(trainer)
        summary = trainer.fit()
        record = {"steps": summary["steps"], "seen": seen}
        (Path(spec["out"]) / f"rank{dist.get_rank()}.json").write_text(json.dumps(record))
    finally:
        end_session(session)
