"""Fault injection: lost ranks, failing ranks, corrupt data, numerical faults, odd
graphs and bad configs either run correctly or stop quickly, saying why."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time

import numpy as np
import psutil
import pytest
import torch

import yaml
from dgl_scalegnn._dgl import dgl
from dgl_scalegnn.cli import main as cli_main
from dgl_scalegnn.distributed.watchdog import ABORT_EXIT_CODE
from dgl_scalegnn.train.checkpoint import latest_checkpoint
from dgl_scalegnn.train.metrics import read_metrics
from tests.helpers import ROOT, launched, step_losses, train_through_cli
from tests.ranks import spawn_ranks, start_ranks

LONG_RUN = {
    "data": {"name": "synthetic", "synthetic": {"num_nodes": 4000, "num_features": 16}},
    "model": {"hidden": 16, "layers": 2},
    "sampling": {"batch_size": 500},
    "train": {"epochs": 1000, "eval_every": 1000, "progress": False},
    "parallel": {"watchdog_s": 5},
}


def _write_config(tmp_path, config: dict, name: str = "config.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config))
    return path


def _with_output(tmp_path, config: dict, every: int = 2) -> dict:
    return {**config, "output": {"dir": str(tmp_path / "run"), "checkpoint_every": every}}


def _wait_for_checkpoint(directory, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (directory / "latest").exists():
            return
        time.sleep(0.2)
    raise AssertionError(f"no checkpoint appeared in {directory} within {timeout} s")


def _resume_from(tmp_path, config: dict, grid: str) -> list[dict]:
    checkpoint = latest_checkpoint(tmp_path / "run" / "checkpoints")
    assert checkpoint is not None
    done = int(checkpoint.name.split("_")[1])
    config = {**config, "train": {**config["train"], "max_steps": done + 2}}
    events = train_through_cli(tmp_path, "resume", grid, config, "--resume")
    steps = [e["step"] for e in events if e["event"] == "step"]
    assert steps == [done, done + 1]
    return steps


@pytest.mark.parametrize(
    ("lost", "message"),
    [(2, "rank 2 stopped responding"), (0, "rank 0 is gone")],
    ids=["rank 2", "rank 0, the store's host"],
)
def test_killed_rank_stops_every_rank_with_its_number(tmp_path, lost, message):
    """No launcher help: the watchdog alone must end the job and name the lost rank.

    Rank 0 hosts the rendezvous store, so its death is found by losing the store."""
    config = _with_output(tmp_path, LONG_RUN)
    argv = ["train", "--config", str(_write_config(tmp_path, config)), "--grid", "1x1x2x2"]
    with start_ranks(4, "dgl_scalegnn.cli:main", [argv], tmp_path / "ranks") as group:
        _wait_for_checkpoint(tmp_path / "run" / "checkpoints")
        os.kill(group.processes[lost].pid, signal.SIGKILL)
        killed_at = time.monotonic()
        timed_out, results = group.wait(timeout=90)
    assert not timed_out
    assert time.monotonic() - killed_at < 60
    for rank, (code, output) in enumerate(results):
        if rank == lost:
            assert code == -signal.SIGKILL
            continue
        assert code == ABORT_EXIT_CODE, (rank, code, output[-2000:])
        assert "stopping the job" in output, output[-2000:]
        if lost != 0:  # a rank that lost its connection to rank 0 may also say so
            assert message in output, output[-2000:]
    assert any(message in output for code, output in results if code == ABORT_EXIT_CODE)
    if lost != 0:  # the checkpoint a failure leaves resumes (once: the same path for both)
        _resume_from(tmp_path, config, "1x1x2x2")


def _rank_processes(launcher: subprocess.Popen, variable: str) -> dict[int, psutil.Process]:
    found = {}
    for child in psutil.Process(launcher.pid).children(recursive=True):
        try:
            environment = child.environ()
        except (psutil.AccessDenied, psutil.NoSuchProcess):
            continue
        if variable in environment and "python" in os.path.basename(child.exe()):
            found[int(environment[variable])] = child
    return found


def _wait_until_ended(processes: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait until every process has exited; returns those still running after
    ``timeout`` s. An exited rank counts as ended before its launcher reaps it (torchrun
    reaps its workers only after it has given up on the hung one, 30 s later)."""

    def running(process: psutil.Process) -> bool:
        try:
            return process.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + timeout
    while (alive := [p for p in processes if running(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive


@pytest.mark.parametrize(
    ("script", "variable"), [("mpirun.sh", "OMPI_COMM_WORLD_RANK"), ("torchrun.sh", "RANK")]
)
def test_stopped_rank_under_a_real_launcher_is_found_by_the_watchdog(tmp_path, script, variable):
    """A hung rank (SIGSTOP) looks alive to mpirun and torchrun: only the watchdog can
    end the job, and its message must name the rank. The collective timeout (300 s)
    is far beyond the time allowed, so it cannot be what stopped the job."""
    config = _with_output(tmp_path, {**LONG_RUN, "parallel": {"watchdog_s": 5, "timeout_s": 300}})
    command = [str(ROOT / "launch" / script), "4", "1x1x2x2", str(_write_config(tmp_path, config))]
    with launched(command) as launcher:
        _wait_for_checkpoint(tmp_path / "run" / "checkpoints")
        ranks = _rank_processes(launcher, variable)
        assert sorted(ranks) == [0, 1, 2, 3], ranks
        survivors = [ranks[r] for r in (0, 1, 3)]
        ranks[2].send_signal(signal.SIGSTOP)
        stopped_at = time.monotonic()
        alive = _wait_until_ended(survivors, timeout=60)
        assert not alive, f"ranks still running 60 s after rank 2 hung: {alive}"
        assert time.monotonic() - stopped_at < 60
        with contextlib.suppress(psutil.NoSuchProcess):  # the launcher may have done it
            ranks[2].kill()  # only SIGKILL reaches a stopped process; the launcher then ends
        output, _ = launcher.communicate(timeout=90)
    assert "stopping the job" in output and "rank 2 stopped responding" in output, output[-3000:]
    if script == "mpirun.sh":  # resuming is the launcher's no more than above: once
        _resume_from(tmp_path, config, "1x1x2x2")


def test_rank_that_raises_stops_all_ranks_with_its_error(tmp_path):
    config = {**LONG_RUN, "parallel": {"timeout_s": 300, "watchdog_s": 15}}
    argv = ["train", "--config", str(_write_config(tmp_path, config)), "--grid", "1x2x2x1"]
    started = time.monotonic()
    results = spawn_ranks(
        4,
        "tests.workers.fail_on_rank:main",
        [argv, 1, 3],
        tmp_path / "ranks",
        expect_failure=True,
        timeout=120,
    )
    assert time.monotonic() - started < 60  # not the 300 s collective timeout
    assert "FileNotFoundError: shard file part-1.npy is missing" in results[1][1]
    for rank in (0, 2, 3):
        code, output = results[rank]
        assert code != 0
        assert "rank 1 failed: FileNotFoundError: shard file part-1.npy is missing" in output, (
            output[-2000:]
        )


def _prepared(tmp_path):
    out = tmp_path / "prepared"
    assert (
        cli_main(
            [
                "prepare",
                "--dataset",
                "synthetic",
                "--set",
                "data.synthetic.num_nodes=1500",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    return out


@pytest.mark.parametrize("fault", ["truncated", "changed byte", "format version", "other dataset"])
def test_bad_prepared_data_is_refused_at_load(tmp_path, capsys, fault):
    directory = _prepared(tmp_path)
    name = "synthetic"
    if fault == "truncated":
        path = directory / "cols.npy"
        path.write_bytes(path.read_bytes()[:-64])
        expected = r"cols\.npy: \d+ bytes, meta.json records"
    elif fault == "changed byte":
        path = directory / "values.npy"
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x10
        path.write_bytes(bytes(data))
        expected = r"values\.npy: bytes \d+-\d+ differ from their checksum"
    elif fault == "format version":
        meta = directory / "meta.json"
        meta.write_text(meta.read_text().replace('"format_version": 2', '"format_version": 0'))
        expected = r"meta\.json: format version 0"
    else:
        name = "cora"
        expected = r"holds 'synthetic' but data\.name is 'cora'"
    code = cli_main(
        [
            "train",
            "--set",
            f"data.name={name}",
            "--set",
            f"data.prepared={directory}",
            "--set",
            "train.max_steps=1",
            "--set",
            "sampling.batch_size=500",
        ]
    )
    error = capsys.readouterr().err
    assert code == 2
    assert re.search(expected, error), error


def _graph_file(tmp_path, graph: dgl.DGLGraph, name: str = "graph.bin"):
    path = tmp_path / name
    dgl.save_graphs(str(path), [graph], {"num_classes": torch.tensor([4])})
    return path


def _odd_graph(huge_feature: bool = False, empty_train: bool = False) -> dgl.DGLGraph:
    """Isolated vertices, self loops, duplicate and one-way edges, one huge-degree vertex."""
    rng = np.random.default_rng(0)
    n = 300
    src = np.concatenate([rng.integers(1, 250, 600), np.zeros(240, int), [5, 5, 6, 7, 7]])
    dst = np.concatenate([rng.integers(1, 250, 600), np.arange(10, 250), [5, 9, 6, 8, 8]])
    graph = dgl.graph(
        (torch.from_numpy(src), torch.from_numpy(dst)), num_nodes=n
    )  # 250..299 isolated
    features = torch.from_numpy(rng.standard_normal((n, 8))).float()
    if huge_feature:  # finite, so the dataset is taken; a step that samples it overflows
        features[17] = 3e38
    graph.ndata["feat"] = features
    graph.ndata["label"] = torch.from_numpy(rng.integers(0, 4, n))
    split = torch.from_numpy(rng.random(n))
    graph.ndata["train_mask"] = (split < 0.5) & (not empty_train)
    graph.ndata["val_mask"] = (split >= 0.5) & (split < 0.75)
    graph.ndata["test_mask"] = split >= 0.75
    return graph


@pytest.mark.parametrize("batch_size", [2, 299, 300])
def test_odd_graph_trains_the_same_on_one_and_four_ranks(tmp_path, batch_size):
    path = _graph_file(tmp_path, _odd_graph())
    config = {
        "data": {"name": "dgl", "path": str(path)},
        "model": {"hidden": 8, "layers": 3},
        "sampling": {"batch_size": batch_size},
        "train": {"epochs": 3, "max_steps": 3, "progress": False},
    }
    losses = {
        grid: step_losses(train_through_cli(tmp_path, grid, grid, config))
        for grid in ("1x1x1x1", "1x2x1x2")
    }
    assert len(losses["1x1x1x1"]) == 3 and np.isfinite(losses["1x1x1x1"]).all()
    assert losses["1x2x1x2"] == pytest.approx(losses["1x1x1x1"], rel=1e-4)


def test_empty_train_mask_and_impossible_batch_are_refused(tmp_path, capsys):
    path = _graph_file(tmp_path, _odd_graph(empty_train=True))
    assert cli_main(["train", "--set", "data.name=dgl", "--set", f"data.path={path}"]) == 2
    assert "train_mask selects no vertex" in capsys.readouterr().err
    path = _graph_file(tmp_path, _odd_graph(), "ok.bin")
    assert (
        cli_main(
            [
                "train",
                "--set",
                "data.name=dgl",
                "--set",
                f"data.path={path}",
                "--set",
                "sampling.batch_size=301",
            ]
        )
        == 2
    )
    assert (
        "sampling.batch_size: got 301, but 'dgl' has only 300 vertices" in capsys.readouterr().err
    )


@pytest.mark.parametrize("policy", ["stop", "skip"])
def test_nan_loss_stops_at_its_step_or_is_skipped(tmp_path, policy):
    path = _graph_file(tmp_path, _odd_graph(huge_feature=True))
    config = {  # raw features, or the row scaling of a dgl file would tame the huge one
        "data": {"name": "dgl", "path": str(path), "feature_norm": "none"},
        "model": {"hidden": 8, "layers": 2},
        "sampling": {"batch_size": 40},
        "train": {"epochs": 2, "progress": False, "on_nonfinite": policy},
        "output": {"dir": str(tmp_path / "run"), "checkpoint_every": 1},
    }
    metrics = tmp_path / "m.jsonl"
    argv = ["train", "--config", str(_write_config(tmp_path, config)), "--metrics", str(metrics)]
    results = spawn_ranks(
        1, "dgl_scalegnn.cli:main", [argv], tmp_path / "ranks", expect_failure=True
    )
    code, output = results[0]
    if policy == "stop":
        assert code != 0
        found = re.search(
            r"non-finite loss or gradient at epoch \d+ step \d+ \(global step (\d+)\)", output
        )
        assert found, output[-2000:]
        bad = int(found.group(1))
        assert [e["step"] for e in read_metrics(metrics, "step")] == list(range(bad))
        # The checkpoint of step `bad` would replay the failing step: set aside, and the
        # one before it is latest (intact and loadable), named in the message.
        checkpoints = tmp_path / "run" / "checkpoints"
        checkpoint = latest_checkpoint(checkpoints)
        assert checkpoint.name == f"step_{bad - 1:08d}"
        assert (checkpoints / f"step_{bad:08d}.nonfinite").is_dir()
        assert f"The last good checkpoint is {checkpoint} (global step {bad - 1})" in output
        state = torch.load(checkpoint / "rank00000.pt", weights_only=True)
        assert all(torch.isfinite(p).all() for p in state["params"].values())
    else:
        assert code == 0
        skipped = read_metrics(metrics, "nonfinite")
        assert skipped and all(e["action"] == "skipped" for e in skipped)
        assert read_metrics(metrics, "summary")[0]["epochs"] == 2


def test_same_seed_and_grid_give_bit_identical_losses(tmp_path):
    config = {
        **LONG_RUN,
        "train": {"epochs": 1, "max_steps": 6, "progress": False},
        "model": {"hidden": 16, "layers": 3, "dropout": 0.3},
    }
    runs = [
        train_through_cli(
            tmp_path, f"run{attempt}", "1x2x1x1", config, env={"OMP_NUM_THREADS": "2"}
        )
        for attempt in range(2)
    ]
    # the ranks really ran multi-threaded (reductions whose order could vary)
    assert [next(e["threads"] for e in run if e["event"] == "config") for run in runs] == [2, 2]
    assert step_losses(runs[0]) == step_losses(runs[1])
