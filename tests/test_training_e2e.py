"""End-to-end training through the CLI: grid invariance, checkpoints, resume on any grid."""

from __future__ import annotations

import json
import multiprocessing
import shutil
from concurrent.futures import ProcessPoolExecutor

import pytest
import torch

import yaml
from dgl_scalegnn.cli import main as cli_main
from dgl_scalegnn.config import load_config
from dgl_scalegnn.train.checkpoint import latest_checkpoint
from dgl_scalegnn.train.run import run_training
from tests.helpers import ROOT, SHARED_DATA, train_through_cli
from tests.ranks import spawn_ranks

CONFIG = {
    "data": {"name": "synthetic", "synthetic": {"num_nodes": 2000, "num_features": 24, "seed": 1}},
    "model": {"hidden": 24, "layers": 3, "dropout": 0.2},
    "sampling": {"batch_size": 400, "seed": 3},
    "train": {"epochs": 1, "eval_every": 1, "progress": False},
    "optim": {"lr": 0.01},
}


def _losses(events) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in events if e["event"] == "step"}


def _eval(events) -> dict:
    return [e for e in events if e["event"] == "eval"][-1]


def test_grid_invariance_end_to_end(tmp_path):
    runs = {
        grid: train_through_cli(tmp_path, grid, grid, CONFIG, "--set", "train.max_steps=5")
        for grid in ("1x1x1x1", "1x2x2x2", "1x1x3x2")
    }
    reference = _losses(runs["1x1x1x1"])
    assert sorted(reference) == [0, 1, 2, 3, 4]
    for grid, events in runs.items():
        config_event = events[0]
        assert config_event["event"] == "config" and config_event["grid"] == grid
        losses = _losses(events)
        for step, loss in reference.items():
            assert losses[step] == pytest.approx(loss, rel=1e-4), (grid, step)
        accuracy = _eval(events)
        for split in ("train_acc", "val_acc", "test_acc"):
            assert accuracy[split] == pytest.approx(_eval(runs["1x1x1x1"])[split], abs=1e-3)
        summary = events[-1]
        assert summary["event"] == "summary" and summary["steps"] == 5


def test_cora_on_four_ranks_reaches_80_percent(tmp_path):
    """yaml/cora.yaml on a 1x2x1x2 grid reaches 80% test accuracy on the public split;
    the run stops there (the paper's time-to-target protocol)."""
    events = train_through_cli(
        tmp_path,
        "cora",
        "1x2x1x2",
        "yaml/cora.yaml",
        "--set",
        "train.target_metric=test_acc",
        "--set",
        "train.target_acc=0.8",
        "--set",
        "train.epochs=100",
        "--set",
        "train.progress=false",
    )
    assert events[0]["grid"] == "1x2x1x2" and events[0]["config"]["data"]["name"] == "cora"
    assert _eval(events)["test_acc"] >= 0.80
    summary = events[-1]
    assert summary["time_to_target_s"] is not None
    assert summary["epochs"] < 100


def _train_cora_seed(config: str, seed: int, metrics: str) -> dict:
    """``yaml/<config>.yaml`` as shipped, one process and one thread, seed ``seed``."""
    torch.set_num_threads(1)
    cfg = load_config(
        ROOT / "yaml" / f"{config}.yaml",
        [f"train.seed={seed}", f"sampling.seed={seed}", "train.progress=false"],
    )
    return run_training(cfg, metrics)


def _cora_runs(configs: tuple[str, ...], tmp_path) -> dict[str, dict]:
    """The summary of each config on seed 0, two runs at a time (one thread each: Cora's
    products are too small for a second thread to pay). One seed: the seeds are fixed and
    the runs deterministic; the 10-seed figures are ``make bench``'s."""
    pool = ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("spawn"))
    try:
        futures = {
            config: pool.submit(_train_cora_seed, config, 0, str(tmp_path / f"{config}.jsonl"))
            for config in configs
        }
        return {config: future.result() for config, future in futures.items()}
    finally:  # a failed run cancels the runs not started
        pool.shutdown(cancel_futures=True)


def test_cora_configs_reach_kipf_and_wellings_accuracy_and_the_paper_model_the_gcns(
    tmp_path, monkeypatch
):
    """yaml/cora.yaml (the GCN) and yaml/cora-paper.yaml (the paper's model), one process,
    seed 0, accuracy at the best validation epoch. The GCN's test accuracy is at least
    Kipf & Welling's 81.5% (seeds 0-9: 82.1 +- 0.4%). The paper's model leads it on
    validation, what chose both (seeds 0-9: 81.7 +- 0.5% against 80.6 +- 0.1%; every seed
    leads, so seed 0 must), and stays within a point on test (seeds 0-9: 82.1 +- 0.9%; at the GCN's
    regularisation 80.1% validation)."""
    monkeypatch.setenv("SCALEGNN_DATA_ROOT", str(SHARED_DATA))
    runs = _cora_runs(("cora", "cora-paper"), tmp_path)
    gcn, paper = runs["cora"], runs["cora-paper"]
    assert gcn["test_at_best_val"] >= 0.815, gcn
    assert paper["best_val_acc"] > gcn["best_val_acc"], (paper, gcn)  # seed 0: 81.0 to 80.6
    assert paper["test_at_best_val"] >= gcn["test_at_best_val"] - 0.01, paper


def _with_checkpoints(tmp_path, name: str) -> dict:
    config = json.loads(json.dumps(CONFIG))
    config["train"]["epochs"] = 3
    config["output"] = {"dir": str(tmp_path / name), "checkpoint_every": 2}
    return config


def test_resume_continues_with_the_same_losses_on_any_grid(tmp_path):
    uninterrupted = _losses(
        train_through_cli(tmp_path, "full", "1x2x2x1", _with_checkpoints(tmp_path, "full"))
    )
    assert len(uninterrupted) == 15
    stopped = _with_checkpoints(tmp_path, "stopped")
    first = _losses(
        train_through_cli(tmp_path, "first", "1x2x2x1", stopped, "--set", "train.max_steps=7")
    )
    assert sorted(first) == list(range(7))
    checkpoint = latest_checkpoint(tmp_path / "stopped" / "checkpoints")
    assert checkpoint is not None and checkpoint.name == "step_00000007"
    saved = tmp_path / "saved" / checkpoint.name
    shutil.copytree(checkpoint, saved)  # the resumed run prunes old checkpoints
    resumed = _losses(train_through_cli(tmp_path, "resumed", "1x2x2x1", stopped, "--resume"))
    assert sorted(resumed) == list(range(7, 15))
    for step, loss in resumed.items():
        assert loss == uninterrupted[step], step  # same grid: bit-identical
    for grid in ("1x1x2x2", "1x1x1x1"):
        other = _with_checkpoints(tmp_path, f"other-{grid}")
        target = tmp_path / f"other-{grid}" / "checkpoints"
        shutil.copytree(saved, target / saved.name)
        (target / "latest").write_text(saved.name)
        moved = _losses(train_through_cli(tmp_path, f"moved-{grid}", grid, other, "--resume"))
        assert sorted(moved) == list(range(7, 15))
        for step, loss in moved.items():
            assert loss == pytest.approx(uninterrupted[step], rel=1e-4), (grid, step)


def test_checkpoint_killed_midway_leaves_the_previous_one_loadable(tmp_path):
    config = _with_checkpoints(tmp_path, "crash")
    config_path = tmp_path / "crash.yaml"
    config_path.write_text(yaml.safe_dump(config))
    argv = ["train", "--config", str(config_path), "--metrics", str(tmp_path / "crash.jsonl")]
    results = spawn_ranks(
        1,
        "tests.workers.crash_during_checkpoint:main",
        [argv, 4],
        tmp_path / "logs",
        expect_failure=True,
    )
    assert results[0][0] == -9  # killed by SIGKILL while writing step 4
    checkpoints = tmp_path / "crash" / "checkpoints"
    assert latest_checkpoint(checkpoints).name == "step_00000002"
    assert (checkpoints / "step_00000004.partial").exists()
    resumed = _losses(train_through_cli(tmp_path, "after-crash", "1x1x1x1", config, "--resume"))
    assert min(resumed) == 2 and max(resumed) == 14


def test_a_checkpoint_resumes_into_its_own_model_only(tmp_path, capsys):
    """A checkpoint written before ``model.input_projection`` and ``model.head`` existed
    resumes (they were on); a checkpoint of another model form is refused by key."""
    config = _with_checkpoints(tmp_path, "run")
    first = train_through_cli(tmp_path, "first", "1x1x1x1", config, "--set", "train.max_steps=3")
    assert sorted(_losses(first)) == [0, 1, 2]
    checkpoint = latest_checkpoint(tmp_path / "run" / "checkpoints")
    meta = json.loads((checkpoint / "meta.json").read_text())
    for key in ("input_projection", "head"):
        del meta["config"]["model"][key]
    (checkpoint / "meta.json").write_text(json.dumps(meta))
    resumed = train_through_cli(
        tmp_path, "resumed", "1x1x1x1", config, "--resume", "--set", "train.max_steps=5"
    )
    assert sorted(_losses(resumed)) == [3, 4]

    config_path = tmp_path / "headless.yaml"
    config_path.write_text(yaml.safe_dump(config))
    argv = ["train", "--config", str(config_path), "--resume", "--set", "model.head=false"]
    assert cli_main(argv) != 0
    assert "model.head: True in the checkpoint, False in this run" in capsys.readouterr().err


@pytest.mark.parametrize("conv", ["sage", "gin", "gat"])
def test_each_layer_type_trains_evaluates_and_resumes_on_another_grid(tmp_path, conv):
    """``--set model.conv=sage`` (or another type) trains from the CLI on a grid with two TP
    ranks, evaluates, and its checkpoint resumes on another grid with the same losses
    (GIN with its learnt epsilon: a replicated scalar in the checkpoint)."""
    own = {"gin_learn_eps": True} if conv == "gin" else {}
    config = _with_checkpoints(tmp_path, "run")
    config["model"].update(own)
    first = train_through_cli(
        tmp_path,
        "first",
        "1x1x2x1",
        config,
        "--set",
        f"model.conv={conv}",
        "--set",
        "train.max_steps=6",
    )
    assert first[0]["config"]["model"]["conv"] == conv
    losses = _losses(first)
    assert sorted(losses) == list(range(6))
    accuracy = _eval(first)
    assert accuracy["val_acc"] > 1 / 8  # eight classes: above chance after six steps
    saved = latest_checkpoint(tmp_path / "run" / "checkpoints").parent / "step_00000004"
    moved = _with_checkpoints(tmp_path, "moved")
    moved["model"].update(own)
    target = tmp_path / "moved" / "checkpoints"
    shutil.copytree(saved, target / saved.name)
    (target / "latest").write_text(saved.name)
    resumed_events = train_through_cli(
        tmp_path,
        "resumed",
        "1x2x1x1",
        moved,
        "--resume",
        "--set",
        f"model.conv={conv}",
        "--set",
        "train.max_steps=6",
    )
    resumed = _losses(resumed_events)
    assert sorted(resumed) == [4, 5]
    for step, loss in resumed.items():
        assert loss == pytest.approx(losses[step], rel=1e-4), (conv, step)
    for split in ("train_acc", "val_acc", "test_acc"):  # the same model on another grid
        assert _eval(resumed_events)[split] == pytest.approx(accuracy[split], abs=1e-3)
