"""One job per run directory: ``output.dir`` is checked before anything is loaded, a
second job there is refused on every rank naming the first, the first completes and
resumes, and the lock of a job that died is taken over saying whose it was."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import psutil
import pytest

import yaml
from dgl_scalegnn.cli import main as cli_main
from dgl_scalegnn.data import locks
from dgl_scalegnn.data.locks import FileLock, Holder, LockHeld
from dgl_scalegnn.train.metrics import read_metrics
from dgl_scalegnn.train.run_lock import LOCK_NAME
from tests.helpers import step_losses
from tests.ranks import RankGroup, spawn_ranks, start_ranks

SMALL = {
    "data": {"name": "synthetic", "synthetic": {"num_nodes": 1500, "num_features": 8}},
    "model": {"hidden": 16, "layers": 2},
    "sampling": {"batch_size": 150},
    "train": {"eval_every": 100000, "progress": False},
    "parallel": {"watchdog_s": 5},
}


def _config(tmp_path: Path, name: str, output_dir: Path, max_steps: int, **model) -> Path:
    config = {
        **SMALL,
        "model": {**SMALL["model"], **model},
        "train": {**SMALL["train"], "max_steps": max_steps},
        "output": {"dir": str(output_dir), "checkpoint_every": 2},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _train(config: Path, metrics: Path, *extra: str) -> list[str]:
    return ["train", "--config", str(config), "--metrics", str(metrics), *extra]


def _error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if "error" in line.lower()]


def _wait_for_steps(metrics: Path, count: int, job: RankGroup) -> None:
    deadline = time.monotonic() + 120
    while not metrics.exists() or len(step_losses(read_metrics(metrics))) < count:
        assert job.processes[0].is_alive(), f"the job ended before {count} steps: {job.output(0)}"
        assert time.monotonic() < deadline, f"fewer than {count} steps within 120 s"
        time.sleep(0.1)


def _holder_pid(lock: Path) -> int | None:
    try:
        return json.loads(lock.read_text())["pid"]
    except (FileNotFoundError, ValueError, KeyError):  # not there, or being written
        return None


def _wait_for_lock(lock: Path, pid: int, job: RankGroup) -> None:
    """Until ``lock`` records ``pid`` as its holder: the job holds its directory (it
    takes the lock before it loads anything, so stopped there it cannot finish)."""
    deadline = time.monotonic() + 120
    while _holder_pid(lock) != pid:
        assert job.processes[0].is_alive(), f"the job ended before its lock: {job.output(0)}"
        assert time.monotonic() < deadline, "no lock within 120 s"
        time.sleep(0.01)


def test_an_output_dir_that_is_a_file_is_refused_before_training(tmp_path, capsys):
    """Probe 12: before, the run trained and then died in a ``NotADirectoryError`` trace
    at its first checkpoint."""
    taken = tmp_path / "results"
    taken.write_text("mine\n")
    metrics = tmp_path / "run.jsonl"
    for output_dir in (taken, taken / "run"):
        config = _config(tmp_path, "run", output_dir, max_steps=4)
        assert cli_main(_train(config, metrics)) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert err.startswith("scalegnn: error: output.dir: ") and str(output_dir) in err, err
        assert not metrics.exists()  # refused before the run's first event
    assert taken.read_text() == "mine\n"


def test_a_second_job_on_a_run_directory_is_refused_on_every_rank(tmp_path, capsys):
    """Probe 2: a second job (another ``model.hidden``, two ranks) on the directory of a
    running one is refused by every rank, in one line naming the first job; the first
    completes, its checkpoints all its own, and resumes."""
    run = tmp_path / "run"
    first_config = _config(tmp_path, "first", run, max_steps=4)
    first_metrics = tmp_path / "first.jsonl"
    second_config = _config(tmp_path, "second", run, max_steps=4, hidden=32)
    second_metrics = tmp_path / "second.jsonl"
    first_argv = [_train(first_config, first_metrics)]
    with start_ranks(1, "dgl_scalegnn.cli:main", first_argv, tmp_path / "first") as first:
        first_pid = first.processes[0].pid
        _wait_for_lock(run / LOCK_NAME, first_pid, first)
        os.kill(first_pid, signal.SIGSTOP)  # it cannot end while the second one starts
        try:
            second = spawn_ranks(
                2,
                "dgl_scalegnn.cli:main",
                [_train(second_config, second_metrics, "--grid", "1x1x1x2")],
                tmp_path / "second",
                timeout=120,
                expect_failure=True,
            )
        finally:
            os.kill(first_pid, signal.SIGCONT)
        _, [(first_code, first_output)] = first.wait(120)
    assert first_code == 0, first_output
    assert [code for code, _ in second] == [2, 2], second
    said = _error_lines(second[0][1])
    holder = f"pid {first_pid} on host {socket.gethostname()} since "
    assert len(said) == 1 and holder in said[0] and str(run) in said[0], second[0][1]
    assert _error_lines(second[1][1]) == [] and "Traceback" not in second[1][1], second[1][1]
    assert not second_metrics.exists()

    checkpoints = sorted((run / "checkpoints").glob("step_*"))
    assert [p.name for p in checkpoints] == ["step_00000002", "step_00000004"]
    for checkpoint in checkpoints:
        assert json.loads((checkpoint / "meta.json").read_text())["config"]["model"]["hidden"] == 16
    resumed = _train(first_config, first_metrics, "--resume", "--set", "train.max_steps=5")
    assert cli_main(resumed) == 0, capsys.readouterr().err
    assert read_metrics(first_metrics, "resume")[-1]["step"] == 4
    assert len(step_losses(read_metrics(first_metrics))) == 5


def test_the_lock_of_a_killed_job_is_taken_over_saying_whose(tmp_path, capsys):
    """A job killed by ``SIGKILL`` cannot let go of its lock: the next job in its
    directory takes it over, says whose it was, and resumes."""
    run = tmp_path / "run"
    config = _config(tmp_path, "run", run, max_steps=100000)
    metrics = tmp_path / "run.jsonl"
    with start_ranks(1, "dgl_scalegnn.cli:main", [_train(config, metrics)], tmp_path / "a") as job:
        killed = job.processes[0]
        _wait_for_steps(metrics, 3, job)  # a checkpoint at step 2
        killed.kill()
        killed.join()
    resumed = _train(config, metrics, "--resume", "--set", "train.max_steps=4")
    assert cli_main(resumed) == 0, capsys.readouterr().err
    notes = [note["message"] for note in read_metrics(metrics, "note")]
    assert any(f"pid {killed.pid} on host {socket.gethostname()}" in note for note in notes), notes
    assert read_metrics(metrics, "resume")[-1]["step"] >= 2


def _holder_record(path: Path, holder: Holder) -> None:
    path.write_text(json.dumps(asdict(holder)))


def test_without_flock_a_lock_is_held_while_its_holder_may_run(tmp_path, monkeypatch):
    """On a file system without ``flock`` the record alone decides: a holder that ended
    on this host (no process with its pid and start time) is taken over; a running one,
    or one on another host, keeps it."""

    def no_flock(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(locks.fcntl, "flock", no_flock)
    path = tmp_path / "scalegnn.lock"
    host = socket.gethostname()
    ended = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    dead = Holder(host, int(ended.stdout), started=0.0, since=time.time() - 60)
    _holder_record(path, dead)
    lock = FileLock(path).acquire(wait=False)
    assert lock.left_by == dead
    assert FileLock.holder_of(path).pid == psutil.Process().pid
    lock.release()
    assert not path.exists()

    with subprocess.Popen(["sleep", "60"]) as sleeper:
        try:
            running = Holder(
                host, sleeper.pid, psutil.Process(sleeper.pid).create_time(), time.time()
            )
            elsewhere = Holder(f"not-{host}", int(ended.stdout), 0.0, time.time())
            for holder in (running, elsewhere):
                _holder_record(path, holder)
                with pytest.raises(LockHeld) as held:
                    FileLock(path).acquire(wait=False)
                assert held.value.holder == holder
                assert f"pid {holder.pid} on host {holder.host}" in str(held.value)
        finally:
            sleeper.kill()
