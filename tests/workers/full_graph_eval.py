"""Rank worker: full-graph logits and accuracy, layer-wise in row chunks and as one batch.

Run by :func:`tests.ranks.spawn_ranks` as ``tests.workers.full_graph_eval:main``. For
each model variant of the spec, saves ``rank{r}_{variant}.pt`` to ``spec["out"]``: the
logits shard of :func:`~dgl_scalegnn.evaluation.layerwise.full_graph_forward`
(``spec["chunk_rows"]`` rows per chunk) and of the training forward on a whole-graph
batch built with :func:`~dgl_scalegnn.sampling.blocks.full_block` (the evaluation before
the layer-wise one), the accuracy counts of both and those counted chunk by chunk
(:func:`~dgl_scalegnn.evaluation.layerwise.full_graph_counts`), and the bytes of the
evaluation's whole-graph matrices.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dgl_scalegnn.config import config_from_mapping
from dgl_scalegnn.data.prepared import prepare_in_memory
from dgl_scalegnn.evaluation.layerwise import full_graph_counts, full_graph_forward
from dgl_scalegnn.evaluation.memory import full_graph_buffer_bytes
from dgl_scalegnn.train.metrics import MetricsWriter
from dgl_scalegnn.train.run import end_session, start_session
from dgl_scalegnn.train.trainer import Trainer
from tests.helpers import random_dataset, whole_graph_batch


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(1)
    base = {
        "sampling": {"batch_size": spec["batch_size"], "seed": 0},
        "train": {"seed": 0, "progress": False},
        "parallel": {"grid": spec["grid"]},
    }
    session = start_session(config_from_mapping(base).parallel)
    runtime = session.runtime
    grid = runtime.grid
    prepared = prepare_in_memory(random_dataset(**spec["graph"]), permutation_seed=3)
    try:
        for name, model in spec["variants"].items():
            cfg = config_from_mapping({**base, "model": model})
            trainer = Trainer(cfg, prepared, runtime, MetricsWriter(None, enabled=False))
            trainer.train_step(trainer.sample(0))  # weights no longer grid-symmetric
            graph = trainer.store.full_graph()
            trainer.model.eval()
            with torch.no_grad():
                logits, logits_spec = full_graph_forward(trainer.model, graph, spec["chunk_rows"])
                whole = whole_graph_batch(graph)
                batch_logits, _ = trainer.model(whole)
            record = {
                "coords": [grid.coords.d, grid.coords.x, grid.coords.y, grid.coords.z],
                "logits": logits,
                "batch_logits": batch_logits,
                "logit_rows": logits_spec.row_range(grid.coords),
                "logit_cols": logits_spec.col_range(grid.shape, grid.coords),
                "accuracy": trainer.evaluate(),
                "batch_counts": trainer.objective.counts(batch_logits, logits_spec, whole),
                "counts": trainer.objective.counts(logits, logits_spec, graph),
                "chunk_counts": full_graph_counts(
                    trainer.model, graph, trainer.objective, spec["chunk_rows"]
                ),
                "buffer_bytes": full_graph_buffer_bytes(trainer.model, graph),
                "params": {
                    n: p.detach().clone() for n, p in trainer.model.sharded_state_dict().items()
                },
            }
            torch.save(record, Path(spec["out"]) / f"rank{grid.rank}_{name}.pt")
    finally:
        end_session(session)
