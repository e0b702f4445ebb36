"""scalegnn report: the table's figures are the runs' events, and the PNG is drawn."""

from __future__ import annotations

import os
import signal
import statistics
from pathlib import Path

import matplotlib.image
import pytest

from dgl_scalegnn.cli import main
from dgl_scalegnn.config import config_from_mapping
from dgl_scalegnn.train.metrics import read_metrics
from dgl_scalegnn.train.run import run_training
from dgl_scalegnn.train.trainer import Trainer

TINY = {
    "data": {"synthetic": {"num_nodes": 600, "num_features": 8}},
    "model": {"hidden": 8, "layers": 2},
    "sampling": {"batch_size": 200},  # 3 steps an epoch
    "train": {"progress": False, "epochs": 3},
}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """The metrics of a real run that reaches its target (1%: at its first evaluation)."""
    path = tmp_path_factory.mktemp("runs") / "target.jsonl"
    train = {**TINY["train"], "target_acc": 0.01}
    run_training(config_from_mapping({**TINY, "train": train}), str(path))
    return path


def _table(output: str) -> dict[str, list[str]]:
    """The printed table: figure name -> a cell per run (cells are 2+ spaces apart)."""
    rows = {}
    for line in output.splitlines()[:-1]:  # the last line says where the PNG went
        name, *cells = [cell.strip() for cell in line.split("  ") if cell.strip()]
        rows[name] = cells
    return rows


def test_table_figures_are_the_events_and_the_png_is_drawn(run, tmp_path, capsys):
    png = tmp_path / "out" / "report.png"
    again = tmp_path / "again.jsonl"  # a second run to overlay, under another name
    again.write_text(run.read_text())
    assert main(["report", str(run), str(again), "--out", str(png)]) == 0
    output = capsys.readouterr().out
    assert output.splitlines()[-1] == f"wrote {png}"
    table = _table(output)
    assert table["run"] == ["target", "again"]
    events = read_metrics(run)
    summary = next(e for e in events if e["event"] == "summary")
    evals = [e for e in events if e["event"] == "eval"]
    steps = [e for e in events if e["event"] == "step"]
    best = max(evals, key=lambda e: e["val_acc"])
    expected = {
        "grid": "1x1x1x1 (1 rank)",
        "steps": str(summary["steps"]),
        "epochs": str(summary["epochs"]),
        "best validation": f"{summary['best_val_acc']:.4f} (step {best['step']})",
        "test at best val": f"{summary['test_at_best_val']:.4f}",
        "time to target": f"{summary['time_to_target_s']:.2f} s (val_acc >= 0.01)",
        "s/step (median)": f"{statistics.median(e['step_s'] for e in steps):.4f}",
        "evaluation": f"{sum(e['eval_s'] for e in evals):.2f} s in {len(evals)}",
        "training time": f"{summary['train_s']:.2f} s",
        "peak memory/rank": f"{summary['max_rss_mb'][0]:.0f} MB",
    }
    assert {key: cells[0] for key, cells in table.items() if key in expected} == expected
    assert all(len(set(cells)) == 1 for cells in table.values() if cells != table["run"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert matplotlib.image.imread(png).shape == (800, 1200, 4)
    assert png.stat().st_size > 30_000  # four panels of lines, not an empty canvas


def test_runs_appended_to_one_file_are_told_apart(run, tmp_path, capsys):
    both = tmp_path / "both.jsonl"
    both.write_text(run.read_text() * 2)
    assert main(["report", str(both), "--out", str(tmp_path / "both.png")]) == 0
    table = _table(capsys.readouterr().out)
    assert table["run"] == ["both #1", "both #2"]
    assert table["steps"] == [str(read_metrics(run, "summary")[0]["steps"])] * 2


def test_a_missing_or_foreign_file_is_one_line(tmp_path, capsys):
    missing = tmp_path / "absent.jsonl"
    assert main(["report", str(missing)]) == 2
    assert capsys.readouterr().err == (
        f"scalegnn: error: {missing}: no such metrics file; give a file written by "
        "scalegnn train --metrics\n"
    )
    foreign = tmp_path / "config.yaml"
    foreign.write_text("model:\n  hidden: 8\n")
    assert main(["report", str(foreign)]) == 2
    assert capsys.readouterr().err == (
        f"scalegnn: error: {foreign}, line 1: not a metrics event (a JSON object with an "
        "'event' key); give a file written by scalegnn train --metrics\n"
    )
    assert not (tmp_path / "report.png").exists()


def test_a_torn_last_line_is_left_out_and_said(run, tmp_path, capsys):
    """A run stopped while writing an event leaves a torn last line: the rest is read."""
    torn = tmp_path / "torn.jsonl"
    torn.write_text(run.read_text() + '{"event": "step", "epoch": 2, "step": 6, "lo')
    assert read_metrics(torn) == read_metrics(run)
    assert main(["report", str(run), "--out", str(tmp_path / "whole.png")]) == 0
    whole = _table(capsys.readouterr().out)
    assert main(["report", str(torn), "--out", str(tmp_path / "torn.png")]) == 0
    said = capsys.readouterr()
    lines = run.read_text().count("\n")
    assert said.err == (
        f"scalegnn: {torn}, line {lines + 1}: torn (the run stopped while writing it); "
        "reporting the events before it\n"
    )
    assert {**_table(said.out), "run": ["target"]} == whole


def test_a_preempted_run_is_marked(tmp_path, capsys, monkeypatch):
    sample = Trainer.sample

    def signalled(trainer: Trainer, global_step: int):
        if global_step == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # the trainer's handler records it
        return sample(trainer, global_step)

    monkeypatch.setattr(Trainer, "sample", signalled)
    metrics = tmp_path / "preempted.jsonl"
    summary = run_training(config_from_mapping(TINY), str(metrics))
    assert summary["preempted"]["step"] == summary["steps"] == 3
    capsys.readouterr()
    assert main(["report", str(metrics), "--out", str(tmp_path / "preempted.png")]) == 0
    assert _table(capsys.readouterr().out)["steps"] == ["3 (preempted by a signal)"]
