"""Rank worker: load the graph as training does (no ``data.prepared``) and record what
this rank read and holds.

Run by :func:`tests.ranks.spawn_ranks` as ``tests.workers.rank_share:main``; writes
``share{rank}.json`` to ``out``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from dgl_scalegnn.config import config_from_mapping
from dgl_scalegnn.sampling.store import RankStore
from dgl_scalegnn.train.run import end_session, load_graph, start_session


def main(config: dict, out: str) -> None:
    cfg = config_from_mapping(config)
    session = start_session(cfg.parallel)
    failure = None
    try:
        graph = load_graph(cfg, session)
        store = RankStore(graph, session.runtime.grid, cfg.model.layers)
        mapped = all(isinstance(array, np.memmap) for array in graph.arrays().values())
        record = {
            "bytes_read": store.bytes_read,
            "resident": store.nbytes(),
            "entries": sum(block.nnz for block in store.blocks.values()),
            "memory_mapped": mapped,
            "directory": str(Path(graph.adjacency.rows.filename).parent),
        }
        Path(out, f"share{session.launch.rank}.json").write_text(json.dumps(record))
    except BaseException as error:
        failure = error
        raise
    finally:
        end_session(session, failure)
