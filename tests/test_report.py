"""scalegnn report: the table's figures are the runs' events, and the PNG is drawn."""

from __future__ import annotations

import statistics
from pathlib import Path

import matplotlib.image
import pytest

from dgl_scalegnn.cli import main
from dgl_scalegnn.config import config_from_mapping
from dgl_scalegnn.train.metrics import read_metrics
from dgl_scalegnn.train.run import run_training

TINY = {
    "data": {"synthetic": {"num_nodes": 600, "num_features": 8}},
    "model": {"hidden": 8, "layers": 2},
    "sampling": {"batch_size": 200},  # 3 steps an epoch
    "train": {"progress": False, "epochs": 3},
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Two real runs: one reaching its target (1%: at the first evaluation), one with none set."""
    directory = tmp_path_factory.mktemp("runs")
    paths = {"target": directory / "target.jsonl", "plain": directory / "plain.jsonl"}
    run_training(
        config_from_mapping({**TINY, "train": {**TINY["train"], "target_acc": 0.01}}),
        str(paths["target"]),
    )
    run_training(config_from_mapping({**TINY, "model": {"hidden": 16}}), str(paths["plain"]))
    return paths


def _table(output: str) -> dict[str, list[str]]:
    """The printed table: figure name -> a cell per run (cells are 2+ spaces apart)."""
    rows = {}
    for line in output.splitlines()[:-1]:  # the last line says where the PNG went
        name, *cells = [cell.strip() for cell in line.split("  ") if cell.strip()]
        rows[name] = cells
    return rows


def test_table_figures_are_the_events_and_the_png_is_drawn(runs, tmp_path, capsys):
    png = tmp_path / "out" / "report.png"
    assert main(["report", str(runs["target"]), str(runs["plain"]), "--out", str(png)]) == 0
    output = capsys.readouterr().out
    assert output.splitlines()[-1] == f"wrote {png}"
    table = _table(output)
    assert table["run"] == ["target", "plain"]
    for column, name in enumerate(("target", "plain")):
        events = read_metrics(runs[name])
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
            "s/step (median)": f"{statistics.median(e['step_s'] for e in steps):.4f}",
            "evaluation": f"{sum(e['eval_s'] for e in evals):.2f} s in {len(evals)}",
            "training time": f"{summary['train_s']:.2f} s",
            "peak memory/rank": f"{summary['max_rss_mb'][0]:.0f} MB",
        }
        assert {key: table[key][column] for key in expected} == expected
    reached = read_metrics(runs["target"], "summary")[0]["time_to_target_s"]
    assert table["time to target"] == [
        f"{reached:.2f} s (val_acc >= 0.01)",
        "no target (train.target_acc unset)",
    ]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert matplotlib.image.imread(png).shape == (800, 1200, 4)
    assert png.stat().st_size > 30_000  # four panels of lines, not an empty canvas


def test_runs_appended_to_one_file_are_told_apart(runs, tmp_path, capsys):
    both = tmp_path / "both.jsonl"
    both.write_text(runs["target"].read_text() + runs["plain"].read_text())
    assert main(["report", str(both), "--out", str(tmp_path / "both.png")]) == 0
    table = _table(capsys.readouterr().out)
    assert table["run"] == ["both #1", "both #2"]
    summaries = [read_metrics(runs[name], "summary")[0] for name in ("target", "plain")]
    assert table["steps"] == [str(s["steps"]) for s in summaries]


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
