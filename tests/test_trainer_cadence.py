"""Evaluation cadence in steps and the peak-memory field of the summary."""

from __future__ import annotations

from dgl_scalegnn.config import config_from_mapping
from dgl_scalegnn.train.metrics import read_metrics
from dgl_scalegnn.train.run import run_training


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


def test_eval_every_epochs_is_the_default_cadence(tmp_path):
    summary, evals = _train(tmp_path, {"eval_every": 1})
    assert [(e["step"], e["epoch"]) for e in evals] == [(6, 1), (12, 2)]
    peaks = summary["max_rss_mb"]
    # one process: one peak, at least the interpreter with torch and DGL imported
    assert len(peaks) == 1 and 200 < peaks[0] < 24 * 1024
