"""Rank worker: a layer-wise evaluation whose ranks each find room for a different number
of chunk rows, as GPUs with different free memory would.

Run by :func:`tests.ranks.spawn_ranks` as ``tests.workers.chunk_agreement:main``. Rank
``r``'s device "allows" ``rows[r]`` rows a chunk (the chunk sizing of
:mod:`~dgl_scalegnn.evaluation.memory` stubbed per rank). Writes ``rank{r}.json``: the
accuracies of :meth:`~dgl_scalegnn.train.trainer.Trainer.evaluate` and, per layer, the
chunk rows and chunk count it ran.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from dgl_scalegnn.config import config_from_mapping
from dgl_scalegnn.data.prepared import prepare_in_memory
from dgl_scalegnn.data.synthetic import generate
from dgl_scalegnn.evaluation import layerwise, memory
from dgl_scalegnn.train.metrics import MetricsWriter
from dgl_scalegnn.train.run import end_session, start_session
from dgl_scalegnn.train.trainer import Trainer


def main(base: dict, rows: list[int], out: str) -> None:
    rank = int(os.environ["RANK"])
    memory.chunk_rows_for = lambda device, tp_size, memory: rows[rank]
    layers = []
    chunks_of = layerwise.csr_row_chunks

    def recorded(block, chunk_rows, count, native=False):
        layers.append((chunk_rows, count))
        return chunks_of(block, chunk_rows, count, native)

    layerwise.csr_row_chunks = recorded
    cfg = config_from_mapping(base)
    session = start_session(cfg.parallel)
    try:
        graph = prepare_in_memory(generate(cfg.data.synthetic), cfg.data.permutation_seed)
        metrics = MetricsWriter(None, enabled=False)
        trainer = Trainer(cfg, graph, session.runtime, metrics, session.device)
        accuracy = trainer.evaluate()
        record = {"accuracy": accuracy, "layers": layers}
        Path(out, f"rank{rank}.json").write_text(json.dumps(record))
    finally:
        end_session(session)
