"""The evaluation's chunks on several ranks: agreed by every rank, and never larger than
a rank's rows.

- Each rank sizes its chunks from its own device's free memory, which differs between
  the GPUs of a job (NCCL's buffers, the allocator's cache, uneven shares). Stubbed per
  rank here so that each alone would run a different number of chunks: every rank runs
  the same chunks (the fewest rows any rank has room for), on a tensor-parallel grid
  (else the ranks' collectives would not match: a hang or an error) and on a
  data-parallel one (else the replicas would count some rows twice and others never);
  the accuracies are those of one process.
- A chunk holds at most the rows a rank has of a layer's matrix: a 6,000-vertex,
  5,000-class graph on 2 ranks, whose chunk the CPU rule sizes at 65,536 rows
  (10.5 GB of temporaries a rank), evaluates layer-wise in about 1 GB a rank, and
  ``auto`` keeps the layer-wise evaluation.
"""

from __future__ import annotations

import json

import pytest

import yaml
from dgl_scalegnn.config import config_from_mapping
from dgl_scalegnn.data.prepared import prepare_in_memory
from dgl_scalegnn.data.synthetic import generate
from dgl_scalegnn.distributed.comm import Runtime
from dgl_scalegnn.train.metrics import MetricsWriter, read_metrics
from dgl_scalegnn.train.trainer import Trainer
from tests.ranks import spawn_ranks

CONFIG = {
    "data": {"name": "synthetic", "synthetic": {"num_nodes": 5000, "num_features": 16}},
    "model": {"hidden": 16, "layers": 2},
    "sampling": {"batch_size": 500},
    "train": {"progress": False},
    # a collective that does not match fails in seconds, not the default 300
    "parallel": {"timeout_s": 20, "watchdog_s": 20},
}
#: What each rank's device has room for: rank 0 fewer rows a chunk than rank 1.
ROOM = [1100, 2600]


@pytest.fixture(scope="module")
def one_process() -> dict[str, float]:
    """The accuracies of the same model on one process, in one chunk a layer."""
    cfg = config_from_mapping(CONFIG)
    graph = prepare_in_memory(generate(cfg.data.synthetic), cfg.data.permutation_seed)
    trainer = Trainer(cfg, graph, Runtime.single_process(), MetricsWriter(None, enabled=False))
    return trainer.evaluate()


@pytest.mark.parametrize("grid", ["1x1x1x2", "2x1x1x1"])
def test_ranks_with_room_for_different_chunks_run_the_same_chunks(tmp_path, grid, one_process):
    base = {**CONFIG, "parallel": {**CONFIG["parallel"], "grid": grid}}
    spawn_ranks(
        2, "tests.workers.chunk_agreement:main", [base, ROOM, str(tmp_path)], tmp_path, timeout=120
    )
    records = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    layers = records[0]["layers"]
    assert records[1]["layers"] == layers
    assert {rows for rows, _ in layers} == {min(ROOM)}
    assert all(count >= 2 for _, count in layers), layers  # several chunks every layer
    for record in records:
        assert record["accuracy"] == pytest.approx(one_process, abs=1e-12), grid


PROBE = {
    "data": {
        "name": "synthetic",
        "synthetic": {"num_nodes": 6000, "num_features": 64, "num_classes": 5000},
    },
    "sampling": {"batch_size": 600},
    "train": {"epochs": 1, "max_steps": 1, "progress": False},
}
#: What rank 0's host has available: far less than 65,536 rows of 5,000 classes need.
AVAILABLE = 4 * 10**9


def test_a_many_class_graph_on_two_ranks_evaluates_layerwise(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(PROBE))
    metrics = tmp_path / "metrics.jsonl"
    argv = ["train", "--config", str(config), "--grid", "1x1x1x2", "--metrics", str(metrics)]
    spawn_ranks(2, "tests.workers.short_of_memory:main", [argv, 0, AVAILABLE], tmp_path / "ranks")
    events = read_metrics(metrics)
    start = next(e for e in events if e["event"] == "start")
    assert start["evaluation"].startswith("layerwise"), start["evaluation"]
    assert not [e for e in events if e["event"] == "note" and "neighbourhood" in e["message"]]
    (evaluation,) = [e for e in events if e["event"] == "eval"]
    assert evaluation["val_acc"] is not None
    assert max(evaluation["max_rss_mb"]) < AVAILABLE / 1e6
