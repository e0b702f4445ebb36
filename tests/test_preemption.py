"""Preemption: SIGTERM and SIGUSR1, as Slurm sends them, through every launcher.

Each test starts a real job that would train for hours, signals it after a few steps and
checks that the job wrote a checkpoint at the step boundary it stopped at (SIGTERM: exit
code 75) or went on (SIGUSR1), and that the job resumed from that checkpoint gives the
losses of an uninterrupted run, bit for bit (same grid, one thread a rank).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

import yaml
from dgl_scalegnn.config import config_from_mapping
from dgl_scalegnn.distributed.watchdog import ABORT_EXIT_CODE
from dgl_scalegnn.train.checkpoint import choose_checkpoint, latest_checkpoint
from dgl_scalegnn.train.metrics import read_metrics
from dgl_scalegnn.train.preemption import PREEMPTED_EXIT_CODE, Request, SignalRequests
from dgl_scalegnn.train.run import run_training
from dgl_scalegnn.train.trainer import Trainer
from tests.helpers import ROOT, launched, stand_in_slurm, step_losses, train_through_cli
from tests.ranks import reserve_port, start_ranks

GRID = "1x1x1x2"
ENDLESS = {
    "data": {"name": "synthetic", "synthetic": {"num_nodes": 1500, "num_features": 8}},
    "model": {"hidden": 16, "layers": 2},
    "sampling": {"batch_size": 150},
    "train": {"epochs": 100000, "eval_every": 100000, "progress": False},
    "parallel": {"watchdog_s": 5},
}
#: Steps after the stop that the resumed run trains and compares.
AFTER = 3


def _config(tmp_path: Path, **output) -> dict:
    return {**ENDLESS, "output": {"dir": str(tmp_path / "run"), **output}}


def _write(tmp_path: Path, config: dict, name: str = "config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config))
    return path


def _steps_logged(metrics: Path) -> int:
    if not metrics.exists():
        return 0
    return sum('"event": "step"' in line for line in metrics.read_text().splitlines())


def _wait_for_steps(metrics: Path, count: int, alive, timeout: float = 120.0) -> None:
    """Until rank 0 has logged ``count`` steps (fails early if the job ended)."""
    deadline = time.monotonic() + timeout
    while _steps_logged(metrics) < count:
        assert alive(), f"the job ended before {count} steps"
        assert time.monotonic() < deadline, f"fewer than {count} steps within {timeout} s"
        time.sleep(0.1)


def _wait_for_note(metrics: Path, text: str, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        notes = (
            [e for e in read_metrics(metrics, "note") if text in e["message"]]
            if (metrics.exists())
            else []
        )
        if notes:
            return notes[0]
        time.sleep(0.1)
    raise AssertionError(f"no note with {text!r} in {metrics} within {timeout} s")


def _finish(process: subprocess.Popen, timeout: float = 120.0) -> tuple[int, str]:
    output, _ = process.communicate(timeout=timeout)
    return process.returncode, output


def _stopped_step(tmp_path: Path) -> int:
    """The global step of the checkpoint the stopped job left as ``latest``."""
    checkpoint = latest_checkpoint(tmp_path / "run" / "checkpoints")
    assert checkpoint is not None, "no checkpoint after the signal"
    return int(checkpoint.name.split("_")[1])


def _tasks(launcher: subprocess.Popen, command: list[str]) -> list[psutil.Process]:
    """The processes the launcher started whose command line runs ``command``."""
    return [
        child
        for child in psutil.Process(launcher.pid).children(recursive=True)
        if command == child.cmdline()[1 : 1 + len(command)]
    ]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """``losses(grid, steps)``: the step losses of one uninterrupted run of ENDLESS on
    ``grid``, at least ``steps`` long (one run per grid, longer only when needed)."""
    runs: dict[str, list[float]] = {}

    def losses(grid: str, steps: int) -> list[float]:
        if len(runs.get(grid, [])) < steps:
            config = {**ENDLESS, "train": {**ENDLESS["train"], "max_steps": max(steps, 64)}}
            path = tmp_path_factory.mktemp("uninterrupted")
            runs[grid] = step_losses(train_through_cli(path, "run", grid, config))
        return runs[grid][:steps]

    return losses


def _check_resume_matches_uninterrupted(
    tmp_path: Path,
    config: dict,
    uninterrupted,
    stopped_losses: list[float],
    stopped_at: int,
    grid: str = GRID,
) -> None:
    """The signalled run trained steps 0..stopped_at-1; resumed, it trains the next
    AFTER steps. Both must match one uninterrupted run exactly."""
    assert len(stopped_losses) == stopped_at, "a step ran after the checkpoint it stopped at"
    until = {**config, "train": {**config["train"], "max_steps": stopped_at + AFTER}}
    resumed = step_losses(train_through_cli(tmp_path, "resumed", grid, until, "--resume"))
    reference = uninterrupted(grid, stopped_at + AFTER)
    assert stopped_losses == reference[:stopped_at]
    assert resumed == reference[stopped_at:]


def test_one_process_checkpoints_on_sigusr1_and_stops_on_sigterm(tmp_path, uninterrupted):
    config = _config(tmp_path)
    metrics = tmp_path / "job.jsonl"
    argv = [sys.executable, "-m", "dgl_scalegnn.cli", "train", "--config"]
    argv += [str(_write(tmp_path, config)), "--metrics", str(metrics)]
    with launched(argv) as process:
        _wait_for_steps(metrics, 8, lambda: process.poll() is None)
        process.send_signal(signal.SIGUSR1)
        note = _wait_for_note(metrics, "SIGUSR1")
        _wait_for_steps(metrics, _steps_logged(metrics) + 5, lambda: process.poll() is None)
        process.send_signal(signal.SIGTERM)
        code, output = _finish(process)
    assert code == PREEMPTED_EXIT_CODE, output
    assert "training goes on" in note["message"]
    stopped_at = _stopped_step(tmp_path)
    assert f"stopped by SIGTERM/SIGUSR2/SIGINT after global step {stopped_at}" in output
    checkpoints = sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("step_*"))
    usr1_step = int(checkpoints[0].split("_")[1])
    assert f"global step {usr1_step} " in note["message"] and usr1_step < stopped_at
    summary = read_metrics(metrics, "summary")[0]
    assert summary["preempted"]["step"] == stopped_at
    _check_resume_matches_uninterrupted(
        tmp_path,
        config,
        uninterrupted,
        step_losses(read_metrics(metrics)),
        stopped_at,
        grid="1x1x1x1",
    )


def test_mpirun_script_turns_its_sigterm_into_a_checkpoint_and_a_stop(tmp_path, uninterrupted):
    """SIGTERM to launch/mpirun.sh, as scancel or a time limit delivers it: mpirun alone
    would kill its ranks 0.2 s later, so the script hands them SIGUSR2."""
    config = _config(tmp_path)
    metrics = tmp_path / "job.jsonl"
    argv = ["bash", str(ROOT / "launch" / "mpirun.sh"), "2", GRID, str(_write(tmp_path, config))]
    with launched([*argv, "--metrics", str(metrics)]) as process:
        _wait_for_steps(metrics, 8, lambda: process.poll() is None)
        process.send_signal(signal.SIGTERM)
        code, output = _finish(process)
    assert code == PREEMPTED_EXIT_CODE, output
    stopped_at = _stopped_step(tmp_path)
    _check_resume_matches_uninterrupted(
        tmp_path, config, uninterrupted, step_losses(read_metrics(metrics)), stopped_at
    )


def test_torchrun_forwards_sigterm_and_every_worker_stops_after_its_checkpoint(
    tmp_path, uninterrupted
):
    config = _config(tmp_path)
    metrics = tmp_path / "job.jsonl"
    argv = ["bash", str(ROOT / "launch" / "torchrun.sh"), "2", GRID]
    argv += [str(_write(tmp_path, config)), "--metrics", str(metrics)]
    with launched(argv) as torchrun:  # the script execs torchrun
        _wait_for_steps(metrics, 8, lambda: torchrun.poll() is None)
        workers = _tasks(torchrun, ["-u", "-m", "dgl_scalegnn.cli", "train"])
        assert len(workers) == 2
        torchrun.send_signal(signal.SIGTERM)  # the agent forwards it to its workers
        _, still_running = psutil.wait_procs(workers, timeout=20)
        _, output = _finish(torchrun)
    # Not torchrun's own SIGKILL, 30 s after its SIGTERM: the workers ended by themselves.
    # (torchrun exits 1 after a signal, with its own SignalException.)
    assert not still_running, output
    stopped_at = _stopped_step(tmp_path)
    assert f"stopped by SIGTERM/SIGUSR2/SIGINT after global step {stopped_at}" in output
    _check_resume_matches_uninterrupted(
        tmp_path, config, uninterrupted, step_losses(read_metrics(metrics)), stopped_at
    )


def test_srun_tasks_signalled_as_slurm_does_stop_after_their_checkpoint(tmp_path, uninterrupted):
    """launch/srun.sh with a stand-in srun; Slurm signals every task of the step."""
    config = _config(tmp_path)
    metrics = tmp_path / "job.jsonl"
    with reserve_port() as port:
        env = stand_in_slurm(tmp_path, 2, port.getsockname()[1])
        argv = ["bash", str(ROOT / "launch" / "srun.sh"), GRID, str(_write(tmp_path, config))]
        with launched([*argv, "--metrics", str(metrics)], env) as process:
            _wait_for_steps(metrics, 8, lambda: process.poll() is None)
            tasks = _tasks(process, [str(ROOT / ".venv" / "bin" / "scalegnn"), "train"])
            assert len(tasks) == 2
            for task in tasks:
                task.send_signal(signal.SIGTERM)
            code, output = _finish(process)
    assert code == PREEMPTED_EXIT_CODE, output  # srun: the largest exit code of its tasks
    stopped_at = _stopped_step(tmp_path)
    _check_resume_matches_uninterrupted(
        tmp_path, config, uninterrupted, step_losses(read_metrics(metrics)), stopped_at
    )


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_signal_to_one_rank_loses_no_step_or_at_most_one_interval(
    tmp_path, uninterrupted, signum
):
    """SIGTERM to one rank stops every rank at the same checkpoint, losing nothing;
    SIGKILL loses at most the steps since the last periodic checkpoint."""
    every = 4
    config = _config(tmp_path, checkpoint_every=every)
    metrics = tmp_path / "job.jsonl"
    argv = ["train", "--config", str(_write(tmp_path, config)), "--grid", GRID]
    with start_ranks(
        2, "dgl_scalegnn.cli:main", [[*argv, "--metrics", str(metrics)]], tmp_path / "ranks"
    ) as group:
        _wait_for_steps(metrics, 10, lambda: all(p.is_alive() for p in group.processes))
        os.kill(group.processes[1].pid, signum)
        timed_out, results = group.wait(120)
    assert not timed_out
    logged = _steps_logged(metrics)
    stopped_at = _stopped_step(tmp_path)
    if signum == signal.SIGKILL:
        assert results[0][0] == ABORT_EXIT_CODE
        assert logged - stopped_at <= every
        return
    assert [code for code, _ in results] == [PREEMPTED_EXIT_CODE] * 2, results
    assert stopped_at == logged
    _check_resume_matches_uninterrupted(
        tmp_path, config, uninterrupted, step_losses(read_metrics(metrics)), stopped_at
    )


@pytest.mark.parametrize("busy", ["evaluate", "save"])
def test_a_signal_during_an_evaluation_or_a_checkpoint_is_honoured_right_after_it(
    tmp_path, monkeypatch, busy
):
    """The ranks agree once more after an evaluation or a checkpoint write, so the
    SIGTERM that came meanwhile stops the job at that boundary, not a step later."""
    train = {**ENDLESS["train"], "eval_every_steps": 3}
    config = {**_config(tmp_path, checkpoint_every=3), "train": train}
    original = getattr(Trainer, busy)

    def signalled(trainer: Trainer, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # handled: the trainer's handler records it
        return original(trainer, *args, **kwargs)

    monkeypatch.setattr(Trainer, busy, signalled)
    summary = run_training(config_from_mapping(config), str(tmp_path / "job.jsonl"))
    assert summary["preempted"]["step"] == summary["steps"] == 3


@pytest.fixture
def ctrl_c_reaches_children():
    """What this test starts takes SIGINT as a terminal's foreground job does: a test
    process run in the background ignores SIGINT, and what it starts would inherit that."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _stopped_by_ctrl_c(tmp_path, output: str) -> int:
    """The step the job stopped at, after checking that it stopped as SIGTERM stops it:
    the one-line message, a whole checkpoint of that step, no trace."""
    stopped_at = _stopped_step(tmp_path)
    assert f"stopped by SIGTERM/SIGUSR2/SIGINT after global step {stopped_at}" in output
    assert choose_checkpoint(tmp_path / "run" / "checkpoints").note() is None
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
    return stopped_at


def test_ctrl_c_on_one_process_checkpoints_and_stops_as_sigterm(tmp_path, ctrl_c_reaches_children):
    metrics = tmp_path / "job.jsonl"
    argv = [sys.executable, "-m", "dgl_scalegnn.cli", "train", "--config"]
    argv += [str(_write(tmp_path, _config(tmp_path))), "--metrics", str(metrics)]
    with launched(argv) as process:
        _wait_for_steps(metrics, 5, lambda: process.poll() is None)
        os.killpg(process.pid, signal.SIGINT)  # a terminal's Ctrl-C: its foreground group
        code, output = _finish(process)
    assert code == PREEMPTED_EXIT_CODE, output
    stopped_at = _stopped_by_ctrl_c(tmp_path, output)
    assert read_metrics(metrics, "summary")[0]["preempted"]["step"] == stopped_at


def test_ctrl_c_to_the_mpirun_script_checkpoints_and_stops(tmp_path, ctrl_c_reaches_children):
    """mpirun kills its ranks at once on a SIGINT and cannot forward one: launch/mpirun.sh
    keeps the terminal's Ctrl-C from mpirun and hands it to the ranks as SIGUSR2."""
    metrics = tmp_path / "job.jsonl"
    argv = ["bash", str(ROOT / "launch" / "mpirun.sh"), "2", GRID]
    argv += [str(_write(tmp_path, _config(tmp_path))), "--metrics", str(metrics)]
    with launched(argv) as process:
        _wait_for_steps(metrics, 5, lambda: process.poll() is None)
        os.killpg(process.pid, signal.SIGINT)  # the script's group, as a terminal sends it
        code, output = _finish(process)
    assert code == PREEMPTED_EXIT_CODE, output
    stopped_at = _stopped_by_ctrl_c(tmp_path, output)
    assert len(step_losses(read_metrics(metrics))) == stopped_at


def test_a_second_ctrl_c_stops_at_once():
    requests = SignalRequests()
    requests.record(signal.SIGINT, None)
    assert requests.take() == Request.STOP and requests.name(Request.STOP) == "SIGINT"
    with pytest.raises(KeyboardInterrupt, match="a second Ctrl-C: stopped at once"):
        requests.record(signal.SIGINT, None)
