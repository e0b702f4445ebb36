"""The real launchers: Open MPI's mpirun (through launch/mpirun.sh) and torchrun."""

from __future__ import annotations

import datetime
import os
import signal
import socket
import subprocess

import pytest
import torch.distributed as dist

import yaml
from dgl_scalegnn.train.metrics import read_metrics
from tests import ranks
from tests.helpers import ROOT
from tests.ranks import reserve_port, spawn_ranks, start_ranks

CONFIG = {
    "data": {"name": "synthetic", "synthetic": {"num_nodes": 1500, "num_features": 16}},
    "model": {"hidden": 16, "layers": 2},
    "sampling": {"batch_size": 300},
    "train": {"epochs": 1, "max_steps": 3, "progress": False},
}


def _launch(script: str, np_: int, grid: str, tmp_path, name: str) -> tuple[list[dict], str]:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    metrics = tmp_path / f"{name}.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [str(ROOT / "launch" / script), str(np_), grid, str(config), "--metrics", str(metrics)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return read_metrics(metrics), result.stdout + result.stderr


def _single_process_losses(tmp_path) -> list[float]:
    config = tmp_path / "single.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    metrics = tmp_path / "single.jsonl"
    argv = ["train", "--config", str(config), "--metrics", str(metrics)]
    spawn_ranks(1, "dgl_scalegnn.cli:main", [argv], tmp_path / "single")
    return [e["loss"] for e in read_metrics(metrics, "step")]


@pytest.mark.parametrize(
    ("script", "np_", "grid", "launcher"),
    [
        ("mpirun.sh", 4, "1x1x2x2", "mpi"),
        ("torchrun.sh", 2, "1x2x1x1", "torchrun"),
    ],
)
def test_launcher_runs_the_grid_and_matches_one_process(tmp_path, script, np_, grid, launcher):
    events, output = _launch(script, np_, grid, tmp_path, launcher)
    config_event = events[0]
    assert config_event["launcher"] == launcher
    assert config_event["world_size"] == np_ and config_event["grid"] == grid
    losses = [e["loss"] for e in events if e["event"] == "step"]
    assert losses == pytest.approx(_single_process_losses(tmp_path), rel=1e-4)
    assert events[-1]["event"] == "summary"
    # What a person reads: rank 0 alone, no JSON, no launcher warning (make run's path)
    lines = output.splitlines()
    assert sum(line.startswith("scalegnn 0.1.0: ") for line in lines) == 1, output
    evaluations = [line for line in lines if line.startswith("Epoch ")]
    assert len(evaluations) == sum(e["event"] == "eval" for e in events), output
    assert sum(line.startswith("done: ") for line in lines) == 1, output
    assert not any(line.startswith("{") for line in lines) and "Warning" not in output


def test_a_reserved_port_is_given_to_nobody_else_yet_the_store_can_listen_on_it():
    """The ranks' rendezvous port is held from choice to use (no free-port race)."""
    with reserve_port() as held:
        port = held.getsockname()[1]
        with socket.socket() as other, pytest.raises(OSError, match="in use"):
            other.bind(("127.0.0.1", port))  # what a process picking "free" ports would do
        store = dist.TCPStore("127.0.0.1", port, 1, is_master=True, timeout=datetime.timedelta(5))
        store.set("rendezvous", "open")
        assert store.get("rendezvous") == b"open"


def test_ranks_left_running_are_killed_when_the_test_fails_midway(tmp_path):
    """A failing test leaves no rank behind (stopped ones included), nor its port."""
    with (
        pytest.raises(RuntimeError, match="midway"),
        start_ranks(2, "time:sleep", [600], tmp_path) as group,
    ):
        os.kill(group.processes[1].pid, signal.SIGSTOP)
        raise RuntimeError("the test failed midway")
    assert not any(process.is_alive() for process in group.processes)
    assert group.port.fileno() == -1  # closed


def test_a_rank_failing_to_start_leaves_no_rank_and_no_port_behind(tmp_path, monkeypatch):
    """``start_ranks`` kills the ranks already started and frees the port when a later
    start fails (fork refused, out of memory)."""
    context, started, reserved = ranks._forkserver(), [], []
    real_reserve = ranks.reserve_port

    def refuse_to_fork() -> None:
        raise OSError("fork refused")

    class SecondStartFails:
        def Process(self, **kwargs):  # multiprocessing's name
            process = context.Process(**kwargs)
            if started:
                process.start = refuse_to_fork
            started.append(process)
            return process

    def reserve_and_keep() -> socket.socket:
        reserved.append(real_reserve())
        return reserved[-1]

    monkeypatch.setattr(ranks, "_forkserver", SecondStartFails)
    monkeypatch.setattr(ranks, "reserve_port", reserve_and_keep)
    with pytest.raises(OSError, match="fork refused"):
        ranks.start_ranks(3, "time:sleep", [600], tmp_path)
    assert len(started) == 2 and started[0].exitcode is not None  # the first one was killed
    assert reserved[0].fileno() == -1  # closed
