"""Evaluation cadence, and the metrics events field by field."""

from __future__ import annotations

import math

import pytest

from dgl_scalegnn.config import ConfigError, config_from_mapping, load_config
from dgl_scalegnn.profiling import COMPONENTS
from dgl_scalegnn.train.metrics import read_metrics
from dgl_scalegnn.train.run import run_training
from tests.helpers import train_through_cli


def _train(tmp_path, train: dict) -> tuple[dict, list[dict]]:
    cfg = config_from_mapping(
        {
            "data": {"synthetic": {"num_nodes": 3000}},
            "model": {"hidden": 16, "layers": 2},
            "sampling": {"batch_size": 500},  # 6 steps per epoch
            "train": {"epochs": 2, "progress": False, **train},
        }
    )
    path = tmp_path / "metrics.jsonl"
    summary = run_training(cfg, str(path))
    return summary, read_metrics(path, "eval")


def test_eval_every_steps_evaluates_mid_epoch_and_after_the_last_step(tmp_path):
    summary, evals = _train(tmp_path, {"eval_every_steps": 5})
    assert [(e["step"], e["epoch"]) for e in evals] == [(5, 0), (10, 1), (12, 2)]
    # training time only grows between evaluations, and excludes them
    times = [e["elapsed_train_s"] for e in evals]
    assert times == sorted(times) and times[-1] == summary["train_s"]


def test_eval_at_steps_evaluates_after_the_listed_steps_and_the_last(tmp_path):
    _, evals = _train(tmp_path, {"eval_at_steps": [9, 2, 3, 40]})
    assert [e["step"] for e in evals] == [2, 3, 9, 12]  # 40 is past the last step
    _, evals = _train(tmp_path / "both", {"eval_at_steps": [2, 9], "eval_every_steps": 5})
    assert [e["step"] for e in evals] == [2, 5, 9, 10, 12]


def test_eval_at_steps_is_a_list_of_positive_step_counts(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("train:\n  eval_at_steps: [15, 30]\n")
    assert load_config(path).train.eval_at_steps == (15, 30)
    assert load_config(None, ["train.eval_at_steps=[4,8]"]).train.eval_at_steps == (4, 8)
    with pytest.raises(ConfigError, match=r"train\.eval_at_steps: expected a list, got int"):
        config_from_mapping({"train": {"eval_at_steps": 5}})
    with pytest.raises(ConfigError, match=r"train\.eval_at_steps\[1\]: expected int, got str"):
        config_from_mapping({"train": {"eval_at_steps": [5, "x"]}})
    with pytest.raises(ConfigError, match=r"train\.eval_at_steps\[1\]: got 0; it must be at least"):
        config_from_mapping({"train": {"eval_at_steps": [5, 0]}})


def test_eval_every_epochs_is_the_default_cadence(tmp_path):
    summary, evals = _train(tmp_path, {"eval_every": 1})
    assert [(e["step"], e["epoch"]) for e in evals] == [(6, 1), (12, 2)]
    peaks = summary["max_rss_mb"]
    # one process: one peak, at least the interpreter with torch and DGL imported
    assert len(peaks) == 1 and 200 < peaks[0] < 24 * 1024


def test_metrics_events_field_by_field_with_two_replicas(tmp_path):
    """Gd = 2: 3000 vertices at B = 500 are 6 batches, 3 steps per epoch per replica."""
    config = {
        "data": {"name": "synthetic", "synthetic": {"num_nodes": 3000, "num_features": 16}},
        "model": {"hidden": 16, "layers": 2},
        "sampling": {"batch_size": 500},
        "train": {"epochs": 2, "eval_every": 1, "progress": False},
    }
    events = train_through_cli(tmp_path, "metrics", "2x1x1x1", config)
    kinds = [e["event"] for e in events]
    assert kinds == ["config", "start"] + ["step"] * 3 + ["eval"] + ["step"] * 3 + [
        "eval",
        "summary",
    ]

    header = events[0]
    assert (header["grid"], header["world_size"], header["backend"]) == ("2x1x1x1", 2, "gloo")
    assert header["config"]["sampling"]["batch_size"] == 500
    assert {"dgl_scalegnn", "torch", "dgl", "python"} <= set(header["versions"])

    steps = [e for e in events if e["event"] == "step"]
    expected_steps = [(0, 0), (0, 1), (0, 2), (1, 3), (1, 4), (1, 5)]
    assert [(e["epoch"], e["step"]) for e in steps] == expected_steps
    for step in steps:
        assert math.isfinite(step["loss"]) and step["loss"] > 0
        assert 0 <= step["sample_s"] <= step["step_s"]
        assert set(step["seconds"]) <= set(COMPONENTS)
        assert {"gemm", "spmm", "elementwise", "dp_allreduce"} <= set(step["seconds"])
        assert all(0 <= seconds <= step["step_s"] for seconds in step["seconds"].values())
        # one process per replica: the only communication is the DP gradient average
        assert set(step["bytes"]) == {"dp"} and step["bytes"]["dp"] > 0
    assert len({s["bytes"]["dp"] for s in steps}) == 1  # the same parameters every step

    evals = [e for e in events if e["event"] == "eval"]
    assert [(e["epoch"], e["step"]) for e in evals] == [(1, 3), (2, 6)]
    for evaluation in evals:
        for split in ("train_acc", "val_acc", "test_acc"):
            assert 0.0 <= evaluation[split] <= 1.0
        assert evaluation["eval_s"] > 0
    # training time is the sum of the steps' times: evaluation is not in it
    step_time = [sum(s["step_s"] for s in steps[:3]), sum(s["step_s"] for s in steps)]
    assert [e["elapsed_train_s"] for e in evals] == [pytest.approx(t, rel=1e-9) for t in step_time]

    summary = events[-1]
    assert summary["steps"] == 6 and summary["epochs"] == 2
    assert summary["train_s"] == evals[-1]["elapsed_train_s"]
    best = max(evals, key=lambda e: e["val_acc"])
    assert summary["best_val_acc"] == best["val_acc"]
    assert summary["test_at_best_val"] == best["test_acc"]
    assert summary["time_to_target_s"] is None  # no target set
    assert len(summary["max_rss_mb"]) == 2 and all(
        200 < m < 24 * 1024 for m in summary["max_rss_mb"]
    )
