"""A run whose layer-wise evaluation cannot fit evaluates in neighbourhoods
(``train.evaluation: auto``), or is refused before its first step where
``layerwise`` is asked for.

Oracle: the cost model's count of what an evaluation adds on a rank
(:func:`~dgl_scalegnn.perfmodel.eval_memory_bytes`: its whole-graph matrices and one
chunk's temporaries, derived from the layouts alone). The shortage is injected by giving
the ranks that much available memory, a byte less, or (on one rank of four) almost none.
The neighbourhood evaluation that ``auto`` falls back to reports what the layer-wise
evaluation of the same run reports.
"""

from __future__ import annotations

import math
import time

import pytest

import yaml
from dgl_scalegnn.config import ConfigError, config_from_mapping
from dgl_scalegnn.core.grid_shape import GridShape
from dgl_scalegnn.data.datasets import load_dataset
from dgl_scalegnn.data.prepared import prepare_in_memory
from dgl_scalegnn.errors import BAD_INPUT_EXIT_CODE
from dgl_scalegnn.perfmodel import Workload, eval_memory_bytes
from dgl_scalegnn.train import defaults
from dgl_scalegnn.train.metrics import read_metrics
from dgl_scalegnn.train.run import run_training
from tests.ranks import spawn_ranks

CONFIG = {
    "data": {"name": "synthetic", "synthetic": {"num_nodes": 3000, "num_features": 16}},
    "model": {"hidden": 32, "layers": 2},
    "sampling": {"batch_size": 300},
    "train": {"epochs": 1, "max_steps": 2, "progress": False},
}
LAYERWISE = {**CONFIG, "train": {**CONFIG["train"], "evaluation": "layerwise"}}


def _oracle(grid: str) -> float:
    cfg = config_from_mapping(CONFIG)
    meta = prepare_in_memory(load_dataset(cfg.data), cfg.data.permutation_seed).meta
    work = Workload(
        num_nodes=meta.num_nodes,
        nnz=meta.nnz,
        batch_size=cfg.sampling.batch_size,
        in_features=meta.num_features,
        num_classes=meta.num_classes,
        model=cfg.model,
    )
    shape = GridShape.parse(grid)
    return max(eval_memory_bytes(work, shape, rank) for rank in range(shape.world_size))


def _give(monkeypatch, available: int) -> None:
    monkeypatch.setattr(defaults, "available_bytes", lambda device="cpu", local_ranks=1: available)


def _accuracies(path) -> list[float]:
    (evaluation,) = [e for e in read_metrics(path) if e["event"] == "eval"]
    return [evaluation[f"{split}_acc"] for split in ("train", "val", "test")]


def test_one_process_runs_with_just_enough_and_a_byte_short_is_refused_or_switched(
    monkeypatch, tmp_path
):
    need = _oracle("1x1x1x1")
    _give(monkeypatch, math.ceil(need))
    summary = run_training(config_from_mapping(CONFIG), str(tmp_path / "enough.jsonl"))
    assert summary["steps"] == 2
    start = next(e for e in read_metrics(tmp_path / "enough.jsonl") if e["event"] == "start")
    assert start["evaluation"].startswith("layerwise")

    _give(monkeypatch, math.floor(need) - 1)
    path = tmp_path / "short.jsonl"
    with pytest.raises(ConfigError) as refused:
        run_training(config_from_mapping(LAYERWISE), str(path))
    message = str(refused.value)
    assert "a layer-wise evaluation needs" in message
    assert f"{need / 1e9:.2f} GB a rank" in message and "killed for memory" in message
    assert "train.evaluation to neighbourhood" in message
    assert not [e for e in read_metrics(path) if e["event"] == "step"]  # before any step

    # auto (the default) evaluates in neighbourhoods instead, and says so with the figures
    summary = run_training(config_from_mapping(CONFIG), str(tmp_path / "switched.jsonl"))
    events = read_metrics(tmp_path / "switched.jsonl")
    assert summary["steps"] == 2
    assert next(e for e in events if e["event"] == "start")["evaluation"].startswith(
        "neighbourhood"
    )
    notes = [e["message"] for e in events if e["event"] == "note"]
    assert any(f"{need / 1e9:.2f} GB a rank" in n and "in neighbourhoods" in n for n in notes)
    assert _accuracies(tmp_path / "switched.jsonl") == _accuracies(tmp_path / "enough.jsonl")


def test_every_rank_stops_when_one_rank_is_short(tmp_path):
    """Rank 2's host has 1 MB available: all four ranks are refused at once, none hangs in
    a collective, none trains. As for any bad input in a running job, the rank whose
    refusal stopped the job says it and exits 2; the others follow with the same code,
    silently."""
    grid = "1x2x2x1"
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(LAYERWISE))
    metrics = tmp_path / "metrics.jsonl"
    argv = ["train", "--config", str(config), "--grid", grid, "--metrics", str(metrics)]
    started = time.monotonic()
    results = spawn_ranks(
        4,
        "tests.workers.short_of_memory:main",
        [argv, 2, 2**20],
        tmp_path / "ranks",
        expect_failure=True,
        timeout=120,
    )
    assert time.monotonic() - started < 60
    assert [code for code, _ in results] == [BAD_INPUT_EXIT_CODE] * 4, results
    (said,) = [line for _, out in results for line in out.splitlines() if "error" in line]
    assert said.startswith(f"scalegnn: error: parallel.grid {grid}: a layer-wise evaluation needs")
    assert f"{_oracle(grid) / 1e9:.2f} GB a rank" in said
    assert not [e for e in read_metrics(metrics) if e["event"] == "step"]


def test_every_rank_evaluates_in_neighbourhoods_when_one_rank_is_short(tmp_path):
    """With ``auto`` the same shortage on rank 2 makes all four ranks evaluate in
    neighbourhoods (each its quarter of the vertices, with the gathered parameters):
    the accuracies of the same run evaluated layer-wise on one process."""
    grid = "1x2x2x1"
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    metrics = tmp_path / "metrics.jsonl"
    argv = ["train", "--config", str(config), "--grid", grid, "--metrics", str(metrics)]
    spawn_ranks(4, "tests.workers.short_of_memory:main", [argv, 2, 2**20], tmp_path / "ranks")
    events = read_metrics(metrics)
    assert next(e for e in events if e["event"] == "start")["evaluation"].startswith(
        "neighbourhood"
    )
    run_training(config_from_mapping(LAYERWISE), str(tmp_path / "one.jsonl"))
    assert _accuracies(metrics) == _accuracies(tmp_path / "one.jsonl")


def test_training_without_evaluation_then_evaluating_its_checkpoint_matches_a_run(
    monkeypatch, tmp_path
):
    """``train.evaluate: false`` runs no evaluation and no memory check (the host has 1 kB
    here); resuming its checkpoint with ``max_steps`` at its step trains nothing and
    evaluates it: the accuracies of the run that evaluated its last step itself."""
    steps = {"train": {**CONFIG["train"], "max_steps": 4}}
    evaluated = run_training(config_from_mapping({**CONFIG, **steps}), str(tmp_path / "a.jsonl"))
    expected = [e for e in read_metrics(tmp_path / "a.jsonl") if e["event"] == "eval"]
    assert [e["step"] for e in expected] == [4]

    _give(monkeypatch, 1024)
    output = {"dir": str(tmp_path / "run"), "checkpoint_every": 4}
    silent = {**CONFIG, "output": output, "train": {**steps["train"], "evaluate": False}}
    summary = run_training(config_from_mapping(silent), str(tmp_path / "b.jsonl"))
    events = read_metrics(tmp_path / "b.jsonl")
    assert not [e for e in events if e["event"] == "eval"]
    assert summary["steps"] == 4 and summary["best_val_acc"] is None
    assert summary["checkpoint"] is not None
    assert next(e for e in events if e["event"] == "start")["evaluation"].startswith("off")

    monkeypatch.undo()
    resumed = {**CONFIG, **steps, "output": {**output, "resume": True}}
    summary = run_training(config_from_mapping(resumed), str(tmp_path / "c.jsonl"))
    events = read_metrics(tmp_path / "c.jsonl")
    assert not [e for e in events if e["event"] == "step"]
    (evaluation,) = [e for e in events if e["event"] == "eval"]
    for key in ("train_acc", "val_acc", "test_acc"):
        assert evaluation[key] == expected[0][key], key
    assert summary["best_val_acc"] == evaluated["best_val_acc"]


def test_a_target_without_evaluation_is_refused():
    with pytest.raises(ConfigError, match=r"train\.evaluate: false runs none"):
        config_from_mapping({"train": {"evaluate": False, "target_acc": 0.8}})
