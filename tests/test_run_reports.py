"""What a run says about itself when its input is odd: an empty validation or test mask,
skipped non-finite steps, a run cut short by ``max_steps``."""

from __future__ import annotations

import pytest
import torch

from dgl_scalegnn._dgl import dgl
from dgl_scalegnn.config import ConfigError, config_from_mapping
from dgl_scalegnn.train.metrics import read_metrics
from dgl_scalegnn.train.run import run_training
from tests.helpers import random_dataset

SMALL = {
    "data": {"synthetic": {"num_nodes": 1200, "num_features": 8}},
    "model": {"hidden": 8, "layers": 2},
    "sampling": {"batch_size": 200},  # 6 steps per epoch
    "train": {"progress": False},
}


def _run(tmp_path, **sections) -> tuple[dict, list[dict]]:
    mapping = {**SMALL, **sections, "train": {**SMALL["train"], **sections.get("train", {})}}
    path = tmp_path / "metrics.jsonl"
    summary = run_training(config_from_mapping(mapping), str(path))
    return summary, read_metrics(path)


def _notes(events: list[dict]) -> list[str]:
    return [e["message"] for e in events if e["event"] == "note"]


def test_max_steps_with_epoch_evaluation_evaluates_the_last_step(tmp_path):
    summary, events = _run(tmp_path, train={"epochs": 5, "eval_every": 1, "max_steps": 3})
    assert [e["step"] for e in events if e["event"] == "eval"] == [3]
    assert summary["steps"] == 3 and 0.0 <= summary["best_val_acc"] <= 1.0


def test_skipped_nonfinite_steps_are_counted_and_said(tmp_path, capsys):
    # lr 1e20: the first step's update leaves weights of ~1e20, whose products overflow
    # in every later step; skipping leaves them as they are.
    summary, events = _run(
        tmp_path, train={"epochs": 2, "on_nonfinite": "skip"}, optim={"lr": 1e20}
    )
    skipped = [e["step"] for e in events if e["event"] == "nonfinite"]
    assert skipped == list(range(1, 12)) and summary["skipped_steps"] == 11
    err = capsys.readouterr().err
    assert err.count("step skipped (train.on_nonfinite: skip)") == 1  # said once
    assert "skipped 11 of 12 steps for a non-finite loss or gradient" in err
    assert any("skipped 11 of 12" in note for note in _notes(events))


def _graph_without(tmp_path, split: str):
    graph = random_dataset(num_nodes=300, num_edges=1500, num_classes=4).graph
    graph.ndata[f"{split}_mask"] = torch.zeros(graph.num_nodes(), dtype=torch.bool)
    path = tmp_path / f"no_{split}.bin"
    dgl.save_graphs(str(path), [graph], {"num_classes": torch.tensor([4])})
    return {"name": "dgl", "path": str(path)}


def test_an_empty_validation_mask_is_said_once_and_no_model_is_selected_on_it(tmp_path, capsys):
    summary, events = _run(
        tmp_path, data=_graph_without(tmp_path, "val"), train={"epochs": 3, "eval_every": 1}
    )
    evals = [e for e in events if e["event"] == "eval"]
    assert len(evals) == 3 and all(e["val_acc"] is None for e in evals)
    assert summary["best_val_acc"] is None
    assert summary["test_at_best_val"] == evals[-1]["test_acc"]  # the last evaluation's
    err = capsys.readouterr().err
    assert err.count("val_mask selects no vertex") == 1
    assert "no model is selected on validation" in err


def test_an_empty_test_mask_reports_no_test_accuracy(tmp_path, capsys):
    summary, events = _run(tmp_path, data=_graph_without(tmp_path, "test"), train={"epochs": 1})
    assert [e["test_acc"] for e in events if e["event"] == "eval"] == [None]
    assert summary["test_at_best_val"] is None and summary["best_val_acc"] is not None
    assert capsys.readouterr().err.count("test_mask selects no vertex") == 1


def test_a_target_on_an_empty_split_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"train\.target_metric: 'val_acc', but the val_mask"):
        _run(
            tmp_path,
            data=_graph_without(tmp_path, "val"),
            train={"epochs": 1, "target_acc": 0.5},
        )
