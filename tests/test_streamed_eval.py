"""The layer-wise evaluation with its whole-graph matrices in scratch files (streamed).

Oracle: the training forward on one whole-graph batch on the same ranks (no chunks, no
files), and the in-memory layer-wise evaluation (bit for bit, on the native loop);
several chunks, blocks of chunks and pieces of the input, on grids whose replicas share
the files (one host) with data parallelism among them. The products off the native loop
(CUDA, other dtypes) against the dense product: ``test_full_graph_eval.py``.
"""

from __future__ import annotations

import json

import pytest
import torch

from dgl_scalegnn.config import ModelConfig
from dgl_scalegnn.core.grid_shape import GridShape
from dgl_scalegnn.distributed.comm import Runtime
from dgl_scalegnn.evaluation.layerwise import streams
from dgl_scalegnn.model.scalegnn import ParallelScaleGNN
from tests.helpers import relative_error
from tests.ranks import spawn_ranks

GRAPH = {"num_nodes": 97, "num_edges": 400, "num_features": 11, "num_classes": 5}
VARIANTS = {
    # the preset's model: projection, norm, residual of the aggregated input, final norm
    "preset": {"hidden": 13, "layers": 2, "residual_from": "aggregated", "final_norm": True},
    "paper3-bias": {"hidden": 13, "layers": 3, "dropout": 0.3, "bias": True},
    "sage": {"conv": "sage", "hidden": 13, "layers": 2, "bias": True},
    "gin": {"conv": "gin", "hidden": 13, "layers": 2},
}
TOLERANCE = 1e-5


def _spec(tmp_path, grid: str, **extra) -> str:
    spec = {
        "grid": grid,
        "graph": GRAPH,
        "variants": VARIANTS,
        "batch_size": 61,
        "chunk_rows": 5,
        # 3 rows of 13 floats: blocks of few chunks, pieces of few rows
        "stream_bytes": 3 * 13 * 4,
        "scratch": str(tmp_path / "scratch"),
        "out": str(tmp_path),
        **extra,
    }
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    return str(path)


@pytest.mark.parametrize("grid", ["1x1x2x2", "2x1x1x2"])
def test_streamed_evaluation_matches_whole_graph(grid, tmp_path):
    world = GridShape.parse(grid).world_size
    spawn_ranks(world, "tests.workers.streamed_eval:main", [_spec(tmp_path, grid)], tmp_path)
    for name in VARIANTS:
        for rank in range(world):
            record = torch.load(tmp_path / f"rank{rank}_{name}.pt")
            assert relative_error(record["logits"], record["batch_logits"]) < TOLERANCE, name
            # natively, each row's sum takes its terms in the in-memory order: the same bits
            assert torch.equal(record["logits"], record["in_memory"]), name
            assert record["counts"] == record["batch_counts"] == record["chunk_counts"], name
            assert record["left"] == []  # each round's files removed after it


def test_a_scratch_without_room_is_refused_on_every_rank(tmp_path):
    grid = "1x1x2x2"
    spec = _spec(tmp_path, grid, no_room=True)
    spawn_ranks(4, "tests.workers.streamed_eval:main", [spec], tmp_path)
    for rank in range(4):
        record = torch.load(tmp_path / f"rank{rank}_preset.pt")
        assert "GB free" in record["refused"]  # rank 0's: none; the others refuse too
        assert rank or "has 0.00 GB free" in record["refused"]
        assert "\n" not in record["refused"]
        assert record["left"] == []


def test_gat_and_one_tp_rank_are_not_streamed():
    """GAT aggregates its input times its weights, and one TP rank reads the features in
    place: neither has the matrices a streamed evaluation keeps in files."""
    runtime = Runtime.single_process()
    sizes = {"in_features": 5, "num_classes": 3, "runtime": runtime, "seed": 0}
    gat = ParallelScaleGNN(ModelConfig(conv="gat", layers=2, hidden=8), **sizes)
    gcn = ParallelScaleGNN(ModelConfig(layers=2, hidden=8), **sizes)
    assert not streams(gat) and not streams(gcn)
