"""Rank worker: count calls into torch.distributed while sampling, then while training.

Run by :func:`tests.ranks.spawn_ranks` as ``tests.workers.count_collectives:main``; writes
``counts{rank}.json`` with the calls seen during sampling and during one train step.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections import Counter
from pathlib import Path

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from dgl_scalegnn.config import config_from_mapping
from dgl_scalegnn.data.prepared import prepare_in_memory
from dgl_scalegnn.train.metrics import MetricsWriter
from dgl_scalegnn.train.run import end_session, start_session
from dgl_scalegnn.train.trainer import Trainer
from tests.helpers import random_dataset


def count_every_function(counter: Counter) -> None:
    """Wrap every public function of torch.distributed (both namespaces) in a counter."""
    for name, value in vars(c10d).items():
        if name.startswith("_") or not inspect.isfunction(value):
            continue

        @functools.wraps(value)
        def counted(*args, _name=name, _fn=value, **kwargs):
            counter[_name] += 1
            return _fn(*args, **kwargs)

        setattr(c10d, name, counted)
        if getattr(dist, name, None) is value:
            setattr(dist, name, counted)


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    cfg = config_from_mapping(
        {
            "model": {"hidden": 16, "layers": 3},
            "sampling": {"batch_size": 40},
            "train": {"progress": False},
            "parallel": {"grid": spec["grid"]},
        }
    )
    session = start_session(cfg.parallel)
    try:
        graph = prepare_in_memory(random_dataset(num_nodes=120, num_edges=600), 0)
        trainer = Trainer(cfg, graph, session.runtime, MetricsWriter(None, enabled=False))
        counter: Counter = Counter()
        count_every_function(counter)
        batches = [trainer.sample(step) for step in range(spec["steps"])]
        sampling = dict(counter)
        counter.clear()
        trainer.train_step(batches[0])
        training = dict(counter)
        rank = session.runtime.grid.rank
        Path(spec["out"], f"counts{rank}.json").write_text(
            json.dumps({"sampling": sampling, "training": training})
        )
    finally:
        end_session(session)
