"""Rank worker: the collectives and host read-backs of one chunked full-graph evaluation.

Run by :func:`tests.ranks.spawn_ranks` as ``tests.workers.count_eval:main``. For each model
variant writes ``eval{rank}_{variant}.json``: the collectives per group kind (calls into
``torch.distributed``), the payload bytes the profiler counted, and the read-backs a GPU
would wait for (:class:`~tests.gpu.host_syncs.HostSyncCounter`).
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from pathlib import Path

import torch.distributed as dist

from dgl_scalegnn.config import config_from_mapping
from dgl_scalegnn.core.layout import Axis
from dgl_scalegnn.data.prepared import prepare_in_memory
from dgl_scalegnn.data.synthetic import generate
from dgl_scalegnn.distributed.grid import Grid4D
from dgl_scalegnn.evaluation.layerwise import full_graph_forward
from dgl_scalegnn.train.metrics import MetricsWriter
from dgl_scalegnn.train.run import end_session, start_session
from dgl_scalegnn.train.trainer import Trainer
from tests.gpu.host_syncs import HostSyncCounter


def _count_collectives(grid: Grid4D, calls: Counter) -> None:
    """Count each all-reduce and all-to-all by the kind of its group."""
    groups = (*(grid.group(axis) for axis in Axis), grid.tp_group, grid.dp_group)
    kinds = {group.handle: group.kind for group in groups if group.handle is not None}
    for name in ("all_reduce", "all_to_all_single"):
        collective = getattr(dist, name)

        @functools.wraps(collective)
        def counted(*args, _collective=collective, **kwargs):
            calls[kinds[kwargs["group"]]] += 1
            return _collective(*args, **kwargs)

        setattr(dist, name, counted)


def main(base: dict, variants: dict, chunk_rows: int, out: str) -> None:
    session = start_session(config_from_mapping(base).parallel)
    try:
        runtime = session.runtime
        graph = prepare_in_memory(generate(config_from_mapping(base).data.synthetic), 0)
        calls: Counter = Counter()
        _count_collectives(runtime.grid, calls)
        for name, model in variants.items():
            cfg = config_from_mapping({**base, "model": model})
            trainer = Trainer(cfg, graph, runtime, MetricsWriter(None, enabled=False))
            trainer.model.eval()
            full = trainer.store.full_graph()
            calls.clear()
            runtime.profiler.reset()
            with HostSyncCounter() as syncs:
                full_graph_forward(trainer.model, full, chunk_rows)
            record = {"calls": calls, "bytes": runtime.profiler.bytes, "syncs": syncs.total}
            path = Path(out, f"eval{runtime.grid.rank}_{name}.json")
            path.write_text(json.dumps(record))
    finally:
        end_session(session)
