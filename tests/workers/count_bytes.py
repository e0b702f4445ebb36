"""Rank worker: payload bytes per group kind that each training step hands to collectives.

Run by :func:`tests.ranks.spawn_ranks` as ``tests.workers.count_bytes:main``; writes
``bytes{rank}.json`` (one dict per step) to ``out``.
"""

from __future__ import annotations

import json
from pathlib import Path

from dgl_scalegnn.config import config_from_mapping
from dgl_scalegnn.data.prepared import prepare_in_memory
from dgl_scalegnn.data.synthetic import generate
from dgl_scalegnn.train.metrics import MetricsWriter
from dgl_scalegnn.train.run import end_session, start_session
from dgl_scalegnn.train.trainer import Trainer


def main(config: dict, steps: int, out: str) -> None:
    cfg = config_from_mapping(config)
    session = start_session(cfg.parallel)
    try:
        graph = prepare_in_memory(generate(cfg.data.synthetic), 0)
        trainer = Trainer(cfg, graph, session.runtime, MetricsWriter(None, enabled=False))
        profiler = session.runtime.profiler
        counted = []
        for step in range(steps):
            batch = trainer.sample(step)
            profiler.reset()
            trainer.train_step(batch)
            counted.append(dict(profiler.bytes))
        rank = session.runtime.grid.rank
        Path(out, f"bytes{rank}.json").write_text(json.dumps(counted))
    finally:
        end_session(session)
