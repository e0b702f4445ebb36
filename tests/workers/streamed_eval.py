"""Rank worker: the layer-wise evaluation with its matrices in scratch files.

Run by :func:`tests.ranks.spawn_ranks` as ``tests.workers.streamed_eval:main``. For each
model variant of the spec, saves ``rank{r}_{variant}.pt`` to ``spec["out"]``: the logits
shard of :func:`~dgl_scalegnn.evaluation.layerwise.full_graph_forward` streamed through
``spec["scratch"]`` (buffers of ``spec["stream_bytes"]``: several blocks and pieces) and
in memory, the training forward's on a whole-graph batch, their accuracy counts, the
streamed counts chunk by chunk, and what the scratch directory holds after the round.
With ``spec["no_room"]``, the scratch filesystem reports no free byte on rank 0: every
rank saves the refusal it got.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from dgl_scalegnn.config import config_from_mapping
from dgl_scalegnn.data.prepared import prepare_in_memory
from dgl_scalegnn.evaluation import memory, scratch
from dgl_scalegnn.evaluation.layerwise import full_graph_counts, full_graph_forward
from dgl_scalegnn.train.metrics import MetricsWriter
from dgl_scalegnn.train.run import end_session, start_session
from dgl_scalegnn.train.trainer import Trainer
from tests.helpers import random_dataset, whole_graph_batch


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(1)
    memory.STREAM_PIECE_BYTES = memory.STREAM_BLOCK_BYTES = spec["stream_bytes"]
    base = {
        "sampling": {"batch_size": spec["batch_size"], "seed": 0},
        "train": {"seed": 0, "progress": False},
        "parallel": {"grid": spec["grid"]},
    }
    session = start_session(config_from_mapping(base).parallel)
    grid = session.runtime.grid
    root = Path(spec["scratch"])
    if spec.get("no_room") and grid.rank == 0:
        real = shutil.disk_usage
        scratch.shutil.disk_usage = lambda path: real(path)._replace(free=0)
    prepared = prepare_in_memory(random_dataset(**spec["graph"]), permutation_seed=3)
    try:
        for name, model in spec["variants"].items():
            cfg = config_from_mapping({**base, "model": model})
            trainer = Trainer(cfg, prepared, session.runtime, MetricsWriter(None, enabled=False))
            trainer.train_step(trainer.sample(0))  # weights no longer grid-symmetric
            graph = trainer.store.full_graph()
            trainer.model.eval()
            chunk_rows = spec["chunk_rows"]
            out = Path(spec["out"]) / f"rank{grid.rank}_{name}.pt"
            if spec.get("no_room"):
                try:
                    full_graph_forward(trainer.model, graph, chunk_rows, scratch=root)
                except scratch.ScratchSpaceError as error:
                    torch.save(
                        {"refused": str(error), "left": sorted(map(str, root.iterdir()))}, out
                    )
                continue
            with torch.no_grad():
                streamed, streamed_spec = full_graph_forward(
                    trainer.model, graph, chunk_rows, scratch=root
                )
                in_memory, _ = full_graph_forward(trainer.model, graph, chunk_rows)
                whole = whole_graph_batch(graph)
                batch_logits, _ = trainer.model(whole)
            objective = trainer.objective
            record = {
                "logits": streamed,
                "in_memory": in_memory,
                "batch_logits": batch_logits,
                "counts": objective.counts(streamed, streamed_spec, graph),
                "batch_counts": objective.counts(batch_logits, streamed_spec, whole),
                "chunk_counts": full_graph_counts(
                    trainer.model, graph, objective, chunk_rows, scratch=root
                ),
                "left": sorted(map(str, root.iterdir())),
            }
            torch.save(record, out)
    finally:
        end_session(session)
