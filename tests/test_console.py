"""What a person reads: the console's lines, from the events of real runs and of the
CLI as a user starts it."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

import yaml
from dgl_scalegnn.cli import main as cli_main
from dgl_scalegnn.train.console import Console
from dgl_scalegnn.train.metrics import read_metrics
from tests.helpers import ROOT, SHARED_DATA

TINY = {
    "data": {"name": "synthetic", "synthetic": {"num_nodes": 1200, "num_features": 8}},
    "model": {"hidden": 8, "layers": 2},
    "sampling": {"batch_size": 200},  # 6 steps an epoch
    "train": {"epochs": 2, "progress": False},
    "output": {"log_every": 4},
}


def _step(step: int, loss: float, seconds: float = 0.5) -> dict:
    return {"event": "step", "epoch": 0, "step": step, "loss": loss, "step_s": seconds}


def _eval(step: int, val: float | None, test: float | None = 0.5) -> dict:
    return {
        "event": "eval",
        "epoch": 1,
        "step": step,
        "train_acc": 0.9,
        "val_acc": val,
        "test_acc": test,
        "eval_s": 0.25,
        "elapsed_train_s": float(step),
    }


def _lines(events: list[dict], log_every: int = 2) -> list[str]:
    out = io.StringIO()
    console = Console(out, log_every=log_every)
    for event in events:
        console.show(event)
    console.close()
    return out.getvalue().splitlines()


def test_an_evaluation_line_averages_the_steps_since_the_line_before():
    lines = _lines([_step(0, 1.0), _step(1, 0.5, 1.5), _eval(2, 0.75, None)], log_every=0)
    assert lines == [
        "Epoch 001 | Step 2 | Loss 0.7500 | Train 0.900 | Val 0.750 | Test  n/a  | "
        "1.000 s/step | 2.0 s"
    ]


def test_loss_lines_come_every_log_every_steps_but_not_where_an_evaluation_is():
    events = [_step(s, 1.0 - s / 10) for s in range(4)] + [_eval(4, 0.5)] + [_step(4, 0.2)]
    events.append(_step(5, 0.4))
    lines = _lines(events, log_every=2)
    assert lines[0] == "Epoch 000 | Step 2 | Loss 0.9500 | 0.500 s/step"
    assert lines[1].startswith("Epoch 001 | Step 4 | Loss 0.8500 | ")  # no loss line at 4
    assert lines[2] == "Epoch 000 | Step 6 | Loss 0.3000 | 0.500 s/step"  # since the eval
    assert len(lines) == 3


def test_the_closing_summary_names_best_validation_target_memory_and_files():
    out = io.StringIO()
    console = Console(out, log_every=0)
    config = {
        "event": "config",
        "world_size": 8,
        "launcher": "mpi",
        "grid": "1x2x2x2",
        "backend": "gloo",
        "threads": 1,
        "versions": {"dgl_scalegnn": "0.1.0"},
        "config": {"data": {"name": "cora"}, "train": {"target_acc": 0.9}},
    }
    for event in [config, _step(0, 1.0), _eval(1, 0.6), _step(1, 0.9), _eval(2, 0.7, 0.65)]:
        console.show(event)
    console.show(
        {
            "event": "summary",
            "best_val_acc": 0.7,
            "best_val_step": 2,
            "best_val_epoch": 1,
            "test_at_best_val": 0.65,
            "time_to_target_s": None,
            "epochs": 2,
            "steps": 2,
            "train_s": 2.0,
            "max_rss_mb": [500.0, 520.0],
            "checkpoint": "run/checkpoints/step_00000002",
        }
    )
    text = out.getvalue()
    assert "scalegnn 0.1.0: 8 ranks (mpi), grid 1x2x2x2, gloo, 1 threads a rank" in text
    assert "done: 2 epochs, 2 steps, 2.0 s of training (0.5 s of evaluation besides)" in text
    assert "best     validation 0.7000 at step 2 (epoch 1); test there 0.650" in text
    assert "target   val_acc >= 0.9 not reached" in text
    assert "memory   peak per rank 520 MB at most, 500 MB at least, over 2 ranks" in text
    assert "files    checkpoint run/checkpoints/step_00000002" in text


def _cli(tmp_path, *extra: str, config: dict = TINY) -> tuple[int, str]:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run(
        [sys.executable, "-m", "dgl_scalegnn.cli", "train", "--config", str(path), *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return result.returncode, result.stdout + result.stderr


def test_cora_on_one_process_shows_the_start_up_block_and_one_line_per_evaluation(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("SCALEGNN_DATA_ROOT", str(SHARED_DATA))
    metrics = tmp_path / "cora.jsonl"
    argv = ["train", "--config", str(ROOT / "yaml" / "cora.yaml"), "--metrics", str(metrics)]
    assert cli_main([*argv, "--set", "train.epochs=3"]) == 0
    out = capsys.readouterr().out
    assert "dataset  cora: 2,708 vertices" in out and "1,433 features, 7 classes" in out
    assert "batch    2,400 vertices (89% of the graph), 2 steps an epoch, 6 steps" in out
    assert f"output   metrics {metrics}; checkpoints none" in out
    evaluations = [line for line in out.splitlines() if line.startswith("Epoch ")]
    assert [line.split(" | ")[1] for line in evaluations] == ["Step 2", "Step 4", "Step 6"]
    assert not any(line.startswith("{") for line in out.splitlines())  # JSON: --metrics
    assert "done: 3 epochs, 6 steps" in out
    # the same events, in the file
    assert len(read_metrics(metrics, "eval")) == 3
    # a rerun would mix its events into the file: refused, unless it resumes
    assert cli_main([*argv, "--set", "train.epochs=3"]) == 2
    assert "--metrics" in capsys.readouterr().err and len(read_metrics(metrics, "eval")) == 3


def test_json_puts_the_events_on_stdout_instead(tmp_path):
    code, output = _cli(tmp_path, "--json")
    assert code == 0
    events = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    assert [e["event"] for e in events][:2] == ["config", "start"]
    assert events[-1]["event"] == "summary"
    assert not any(line.startswith("Epoch ") for line in output.splitlines())


def test_a_bare_train_says_it_trains_the_built_in_synthetic_default(capsys, monkeypatch):
    monkeypatch.setattr("dgl_scalegnn.train.run.run_training", lambda *a, **k: {"steps": 0})
    note = "no --config or --data: training the built-in synthetic graph"
    assert cli_main(["train"]) == 0
    said = capsys.readouterr()
    assert note in said.out and said.err == ""
    assert cli_main(["train", "--json"]) == 0
    said = capsys.readouterr()
    assert note in said.err and note not in said.out
    assert cli_main(["train", "--set", "data.name=cora"]) == 0
    assert note not in str(capsys.readouterr())


@pytest.mark.parametrize("command", ["train", "prepare", "plan", "report", "export", "predict"])
def test_every_command_has_a_description_and_an_example(command, capsys):
    with pytest.raises(SystemExit):
        cli_main([command, "--help"])
    text = capsys.readouterr().out
    assert "example" in text and len(text.splitlines()) > 8


def test_version(capsys):
    with pytest.raises(SystemExit):
        cli_main(["--version"])
    assert capsys.readouterr().out.strip() == "scalegnn 0.1.0"


def test_after_a_resume_the_summary_names_the_best_evaluation_before_it(tmp_path, capsys):
    """The best validation of a resumed run may come from an evaluation before the
    resume, which this process never printed: the summary names its step all the same
    (the old console named the best evaluation it had seen)."""
    config = {**TINY, "output": {"dir": str(tmp_path / "run"), "checkpoint_every": 6}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    metrics = tmp_path / "run.jsonl"
    argv = ["train", "--config", str(path), "--metrics", str(metrics)]
    assert cli_main([*argv, "--set", "train.epochs=1"]) == 0
    capsys.readouterr()
    # lr 1e-30: the resumed model stays as it was, so no later evaluation beats step 6
    assert cli_main([*argv, "--resume", "--set", "optim.lr=1e-30"]) == 0
    out = capsys.readouterr().out
    [before] = [e for e in read_metrics(metrics, "eval") if e["step"] == 6]
    assert f"resumed from step 6 of {tmp_path / 'run' / 'checkpoints'}" in out
    assert [line.split(" | ")[1] for line in out.splitlines() if line.startswith("Epoch")] == [
        "Step 12"
    ]
    assert f"best     validation {before['val_acc']:.4f} at step 6 (epoch 1); " in out
