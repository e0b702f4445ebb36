"""Outputs never overwrite inputs or foreign files; metrics files survive a full disk.

``predict``, ``report`` and ``export`` refuse an output path that is one of their
inputs (by identity, through a symlink too), a file inside a checkpoint directory, or a
directory, in one line (exit code 2), leaving every input byte for byte as it was. A
missing parent directory is created; a path that cannot be written is one line (exit
code 74). ``train --resume --metrics FILE`` appends only to the metrics of the run it
continues. A metrics file on a full disk ends the run in one line (exit code 74) and
keeps every whole event, which ``read_metrics`` and ``report`` read; a metrics file
deleted during a run is not claimed in the summary. (``report`` on a torn last line and
on a preempted run: tests/test_report.py.)

Oracles: the files' bytes before and after, the events written by the run itself, and
the exit codes and messages the CLI documents.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch

from dgl_scalegnn._dgl import dgl
from dgl_scalegnn.cli import main
from dgl_scalegnn.errors import RESOURCE_EXIT_CODE
from dgl_scalegnn.train.metrics import read_metrics
from dgl_scalegnn.train.trainer import Trainer
from tests.helpers import random_dataset
from tests.ranks import spawn_ranks
from tests.workers.full_disk import FullDisk

SETTINGS = [
    "model.hidden=8",
    "sampling.batch_size=40",  # 3 steps an epoch on 97 vertices
    "train.epochs=2",
    "train.progress=false",
    "output.checkpoint_every=3",
]


def _train(graph: Path, run_dir: Path, *extra: str) -> list[str]:
    """``scalegnn train`` arguments: ``graph`` with ``run_dir`` as output.dir."""
    settings = [f"--set={setting}" for setting in [*SETTINGS, f"output.dir={run_dir}"]]
    return ["train", "--data", str(graph), *settings, *extra]


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> dict[str, Path]:
    """A graph file, the run directory and metrics of 6 steps on it, and the model
    exported from its checkpoint."""
    root = tmp_path_factory.mktemp("job")
    graph = root / "graph.bin"
    dgl.save_graphs(str(graph), [random_dataset().graph])
    run_dir, metrics, model = root / "run", root / "run.jsonl", root / "model.pt"
    assert main(_train(graph, run_dir, "--metrics", str(metrics))) == 0
    assert main(["export", "--checkpoint", str(run_dir), "--out", str(model)]) == 0
    return {"graph": graph, "run": run_dir, "metrics": metrics, "model": model}


def _contents(*roots: Path) -> dict[Path, bytes]:
    """Every file under ``roots`` (or the file itself) and its bytes."""
    files = [p for r in roots for p in ([r] if r.is_file() else sorted(r.rglob("*")))]
    return {path: path.read_bytes() for path in files if path.is_file()}


def _one_line(argv: list[str], capsys, code: int = 2) -> str:
    """The one line ``scalegnn`` says for ``argv``, which exits with ``code``."""
    assert main(argv) == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("scalegnn: error: "), err
    return err.removeprefix("scalegnn: error: ").rstrip("\n")


# ---------------------------------------------------------------- probe 3 and 14


def test_predict_refuses_to_write_over_its_graph_or_model(job, tmp_path, capsys):
    graph, model = job["graph"], job["model"]
    before = _contents(graph, model)
    predict = ["predict", "--model", str(model), "--graph", str(graph), "--out"]
    assert _one_line([*predict, str(graph)], capsys) == (
        f"--out {graph}: is the --graph file this command reads; writing there would "
        "destroy it; give another path"
    )
    assert _one_line([*predict, str(model)], capsys) == (
        f"--out {model}: is the --model file this command reads; writing there would "
        "destroy it; give another path"
    )
    link = tmp_path / "link.bin"  # the same file by another name
    link.symlink_to(graph)
    assert _one_line([*predict, str(link)], capsys).startswith(f"--out {link}: is the --graph")
    hard = tmp_path / "hard.pt"
    os.link(model, hard)
    assert _one_line([*predict, str(hard)], capsys).startswith(f"--out {hard}: is the --model")
    assert _contents(graph, model) == before


def test_report_refuses_to_draw_over_a_metrics_file(job, tmp_path, capsys):
    metrics = job["metrics"]
    other = tmp_path / "other.jsonl"
    other.write_bytes(metrics.read_bytes())
    before = _contents(metrics, other)
    assert _one_line(["report", str(other), str(metrics), "--out", str(metrics)], capsys) == (
        f"--out {metrics}: is the metrics file this command reads; writing there would "
        "destroy it; give another path"
    )
    # a file it does not read, but that is not a PNG (not something report writes)
    notes = tmp_path / "notes.txt"
    notes.write_text("keep\n")
    assert _one_line(["report", str(other), "--out", str(notes)], capsys) == (
        f"--out {notes}: exists and is not a PNG image (report writes one); give a new "
        "path, or remove the file first"
    )
    assert _contents(metrics, other) == before and notes.read_text() == "keep\n"


def test_export_refuses_to_write_into_a_checkpoint_or_over_the_training_graph(
    job, tmp_path, capsys
):
    checkpoints = job["run"] / "checkpoints"
    step = checkpoints / (checkpoints / "latest").read_text().strip()
    before = _contents(job["run"], job["graph"])
    export = ["export", "--checkpoint", str(checkpoints), "--out"]
    for target in (step / "rank00000.pt", step / "meta.json"):
        assert _one_line([*export, str(target)], capsys) == (
            f"--out {target}: is inside the checkpoint {step} this command reads; give a "
            "path outside it"
        )
    # a new file inside a checkpoint directory (not the one exported): training prunes it
    older = checkpoints / "step_00000003"
    assert older.is_dir()
    stray = older / "model.pt"
    assert _one_line(["export", "--checkpoint", str(step), "--out", str(stray)], capsys) == (
        f"--out {stray}: is inside the checkpoint directory {older}, which training "
        "writes and prunes; give a path outside it"
    )
    assert not stray.exists()
    assert _one_line([*export, str(job["graph"])], capsys) == (
        f"--out {job['graph']}: is the training graph file this command reads; writing "
        "there would destroy it; give another path"
    )
    assert _contents(job["run"], job["graph"]) == before


def test_a_directory_is_refused_as_an_output_of_every_command(job, tmp_path, capsys):
    directory = tmp_path / "out"
    directory.mkdir()
    graph, model, metrics = str(job["graph"]), str(job["model"]), str(job["metrics"])
    for argv in (
        ["predict", "--model", model, "--graph", graph, "--out", str(directory)],
        ["export", "--checkpoint", str(job["run"]), "--out", str(directory)],
        ["report", metrics, "--out", str(directory)],
    ):
        assert _one_line(argv, capsys) == (
            f"--out {directory}: is a directory; give the path of a file (in it, if you like)"
        )
    assert list(directory.iterdir()) == []


def test_predict_creates_a_missing_directory_and_an_unwritable_path_is_one_line(
    job, tmp_path, capsys
):
    out = tmp_path / "missing" / "x.pt"
    predict = ["predict", "--model", str(job["model"]), "--graph", str(job["graph"]), "--out"]
    assert main([*predict, str(out)]) == 0
    assert capsys.readouterr().out.endswith(f" -> {out}\n")
    predicted = torch.load(out, weights_only=True)
    assert predicted["logits"].shape == (97, 5)
    assert [p.name for p in out.parent.iterdir()] == ["x.pt"]  # no temporary left
    assert _one_line([*predict, "/proc/x.pt"], capsys, code=RESOURCE_EXIT_CODE) == (
        "--out /proc/x.pt: cannot be written (No such file or directory); give a path in "
        "a writable directory with free space"
    )


def test_metrics_that_cannot_be_written_is_one_line(job, tmp_path, capsys):
    argv = _train(job["graph"], tmp_path / "run", "--metrics", "/proc/x")
    assert _one_line(argv, capsys, code=RESOURCE_EXIT_CODE) == (
        "--metrics /proc/x: cannot be written (No such file or directory); give a path in "
        "a writable directory with free space"
    )
    directory = tmp_path / "metrics"
    directory.mkdir()
    argv = _train(job["graph"], tmp_path / "run", "--metrics", str(directory))
    assert _one_line(argv, capsys) == (
        f"--metrics {directory}: is a directory; give the path of a file (in it, if you like)"
    )


# ------------------------------------------------------------------------ probe 4


def test_resume_appends_only_to_the_metrics_of_its_own_run(job, tmp_path, capsys):
    graph = job["graph"]
    run_dir, metrics = tmp_path / "run", tmp_path / "run.jsonl"
    assert main(_train(graph, run_dir, "--metrics", str(metrics))) == 0
    (config,) = read_metrics(metrics, "config")
    assert config["run_dir"] == str(run_dir.resolve())  # whose run the file holds
    capsys.readouterr()
    binary = tmp_path / "graph-copy.bin"  # a DGL binary given as --metrics
    binary.write_bytes(graph.read_bytes())
    before = _contents(binary, job["metrics"], metrics)

    resume = [*_train(graph, run_dir, "--resume", "--set", "train.epochs=3"), "--metrics"]
    assert _one_line([*resume, str(binary)], capsys) == (
        f"--metrics {binary}: not a metrics file of scalegnn train (its first line is not "
        "a config event); --resume appends only to the metrics of the run it continues: "
        "give a new file"
    )
    assert _one_line([*resume, str(job["metrics"])], capsys) == (
        f"--metrics {job['metrics']}: holds the metrics of the run in "
        f"{job['run'].resolve()}, not of this one ({run_dir.resolve()}); give a new file, "
        "or the one this run wrote"
    )
    assert _contents(binary, job["metrics"], metrics) == before

    # its own file is continued: a second config event of the same run, then its steps;
    # the torn line a run that stopped while writing it left is dropped first
    cut = b'{"event": "step", "epoch": 2, "st'
    metrics.write_bytes(before[metrics] + cut)
    assert main([*resume, str(metrics)]) == 0
    assert capsys.readouterr().err == (
        f"scalegnn: --metrics {metrics}: dropped its torn last line ({len(cut)} bytes, "
        "written as the run before stopped)\n"
    )
    events = [json.loads(line) for line in metrics.read_text().splitlines()]  # all whole
    assert metrics.read_bytes().startswith(before[metrics] + b'{"event": "config"')
    configs = [e for e in events if e["event"] == "config"]
    assert [c["run_dir"] for c in configs] == [str(run_dir.resolve())] * 2
    assert [e["step"] for e in events if e["event"] == "step"] == list(range(9))


# ----------------------------------------------------------------------- probe 10


def test_a_full_disk_ends_the_run_in_one_line_and_keeps_every_whole_event(
    job, tmp_path, capsys, monkeypatch
):
    metrics = tmp_path / "full.jsonl"
    disk = FullDisk(metrics, free=9000)  # the config and start events, and some steps
    monkeypatch.setattr(os, "write", disk)
    argv = _train(job["graph"], tmp_path / "run", "--metrics", str(metrics))
    argv += ["--set", "train.epochs=100"]  # 300 steps: far more than 9,000 bytes
    message = _one_line(argv, capsys, code=RESOURCE_EXIT_CODE)
    monkeypatch.undo()
    events = read_metrics(metrics)
    assert disk.failed == 1 and events[0]["event"] == "config"
    steps = [e["step"] for e in events if e["event"] == "step"]
    assert steps == list(range(len(steps))) and 0 < len(steps) < 300
    assert re.fullmatch(
        f"--metrics {re.escape(str(metrics))}: cannot be written \\(No space left on device\\); "
        "the file keeps every event before this (step|eval) event; free space there, then "
        "continue with scalegnn train --resume",
        message,
    )
    text = metrics.read_text()
    assert text.endswith("\n") and len(text.encode()) < 9000  # the torn event taken back
    assert main(["report", str(metrics), "--out", str(tmp_path / "full.png")]) == 0
    table = capsys.readouterr().out
    assert f"steps             {len(steps)} (stopped before its summary)" in table


@pytest.mark.slow  # two ranks
def test_a_full_disk_on_rank_0_of_two_ends_both(job, tmp_path):
    metrics = tmp_path / "full.jsonl"
    argv = _train(job["graph"], tmp_path / "run", "--metrics", str(metrics), "--grid", "1x1x1x2")
    argv += ["--set", "train.epochs=100", "--set", "parallel.watchdog_s=5"]
    results = spawn_ranks(
        2,
        "tests.workers.full_disk:main",
        [argv, str(metrics), 9000],
        tmp_path / "logs",
        timeout=120,
        expect_failure=True,
    )
    (code0, said0), (code1, said1) = results
    events = read_metrics(metrics)
    assert code0 == RESOURCE_EXIT_CODE and said0.count("scalegnn: error: ") == 1, said0
    assert f"--metrics {metrics}: cannot be written (No space left on device)" in said0
    assert "Traceback" not in said0 + said1
    assert code1 == RESOURCE_EXIT_CODE and "rank 0 failed: ResourceError" in said1, said1
    assert events[0]["event"] == "config" and any(e["event"] == "step" for e in events)


# ----------------------------------------------------------------------- probe 18


def test_a_metrics_file_deleted_during_the_run_is_not_claimed(job, tmp_path, capsys, monkeypatch):
    metrics = tmp_path / "gone.jsonl"
    sample = Trainer.sample

    def deleting(trainer: Trainer, global_step: int):
        if global_step == 2:
            metrics.unlink()
        return sample(trainer, global_step)

    monkeypatch.setattr(Trainer, "sample", deleting)
    argv = _train(job["graph"], tmp_path / "run", "--metrics", str(metrics))
    assert main(argv) == 0
    said = capsys.readouterr()
    files = [line for line in said.out.splitlines() if line.startswith("  files")]
    assert files == [
        f"  files    metrics lost ({metrics} was deleted during the run); checkpoint "
        f"{tmp_path / 'run' / 'checkpoints' / 'step_00000006'}"
    ]
    assert said.err == (
        f"scalegnn: --metrics {metrics} was deleted during the run: the events from there "
        "on are not kept\n"
    )
    assert not metrics.exists()


def test_the_config_event_says_whose_run_it_is(job):
    (config,) = read_metrics(job["metrics"], "config")
    assert config["run_dir"] == str(job["run"].resolve())
    assert json.loads(job["metrics"].read_text().splitlines()[0]) == config
