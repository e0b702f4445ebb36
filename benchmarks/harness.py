"""What every benchmark shares: time to target, child processes and their peak memory,
work directories and the bench settings' command line.

Time to target
    The training seconds (evaluation excluded) at the first evaluation whose
    :data:`TARGET_METRIC` reaches the target: the trainer's own definition
    (``time_to_target_s`` with ``train.target_metric`` at its default, the validation
    accuracy), read from a run's evaluation records by :func:`first_at_target` for
    every method alike, peers included.
Processes
    :func:`run_process` runs a command in its own session, killed with everything it
    started on a timeout; :func:`mpirun` starts ranks; :func:`measured` adds the
    process's own peak resident memory (:mod:`benchmarks.peak_memory`);
    :func:`run_child` runs a benchmark's child command on a spec file and reads its
    result; :class:`ThrashGuard` stops a run that starves the host of memory.
Settings
    Each benchmark holds its settings in one frozen dataclass filled from its command
    line by :func:`parse_args` (``make bench-growth BENCH_ARGS="--budget 12"``), which
    refuses the ``SCALEGNN_BENCH_*`` variables that set them before.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.peak_memory import vm_hwm_mb
from dgl_scalegnn.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
#: The accuracy a target is read on: the trainer's default ``train.target_metric``.
TARGET_METRIC = TrainConfig.target_metric


def first_at_target(history: Sequence[Mapping[str, Any]], target: float | None) -> dict | None:
    """The first evaluation record of ``history`` whose :data:`TARGET_METRIC` is at least
    ``target`` (``None``: no target, or never reached); its ``train_s`` is the time to
    target, its ``step`` and ``epoch`` the steps and epochs to it.

    >>> history = [{"val_acc": 0.5, "train_s": 1.0}, {"val_acc": 0.8, "train_s": 2.0}]
    >>> first_at_target(history, 0.8)["train_s"], first_at_target(history, 0.9)
    (2.0, None)
    """
    if target is None:
        return None
    return next((dict(record) for record in history if record[TARGET_METRIC] >= target), None)


class BenchError(RuntimeError):
    """A benchmark's run failed; the message names the command and its log
    (``metrics``: the metrics file of a dgl_scalegnn run, where it had one;
    ``peak_rss_mb``: the peak its process reached, where it was watched)."""

    metrics: Path | None = None
    peak_rss_mb: float | None = None


def budget_timeout_s(budget_s: float) -> float:
    """How long a run of ``budget_s`` training seconds may take, start-up and every
    evaluation included, before it is killed."""
    return 20 * budget_s + 1800


def _env(threads: int) -> dict[str, str]:
    pythonpath = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(pythonpath),
        "OMP_NUM_THREADS": str(threads),
        "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "passive"),
    }


def run_process(
    argv: Sequence[str],
    log: Path,
    threads: int,
    timeout_s: float,
    watch: Callable[[int], None] | None = None,
) -> float:
    """Run ``argv`` to completion (its own session, killed on timeout); return wall seconds.
    ``watch(pid)``, if given, is called about twice a second while it runs.

    Raises
    ------
    BenchError
        If it exits with a code other than 0 or runs past ``timeout_s``.
    """
    start = time.perf_counter()
    deadline = start + timeout_s
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            list(argv),
            cwd=ROOT,
            env=_env(threads),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        code = None
        try:
            while code is None and time.perf_counter() < deadline:
                if watch is not None:
                    watch(proc.pid)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    code = proc.wait(timeout=min(0.5, max(0.0, deadline - time.perf_counter())))
        finally:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, 9)
                proc.wait()
    if code != 0:
        tail = log.read_text(errors="replace")[-3000:]
        why = f"timed out after {timeout_s:.0f} s" if code is None else f"exited with {code}"
        raise BenchError(f"{' '.join(argv[:6])} ... {why}; log {log}:\n{tail}")
    return time.perf_counter() - start


def mpirun(processes: int) -> list[str]:
    """The ``mpirun`` command line of ``processes`` ranks on this host, oversubscribed,
    with the environment :func:`run_process` sets."""
    command = os.environ.get("MPIRUN") or str(Path(sys.executable).parent / "mpirun")
    if not Path(command).exists():
        command = shutil.which("mpirun") or command
    argv = [command, "-np", str(processes), "--oversubscribe"]
    if os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    for name in ("PYTHONPATH", "OMP_NUM_THREADS", "OMP_WAIT_POLICY"):
        argv += ["-x", name]
    return argv


def measured(module_argv: list[str], log: Path, threads: int, timeout_s: float) -> dict:
    """Run ``python -m MODULE ARGS`` under :mod:`benchmarks.peak_memory`: its seconds and
    peak MB. The peak is also read from ``/proc`` while it runs, so that a process killed
    for memory still leaves the peak it reached (in the error's ``peak_rss_mb``)."""
    peak = log.with_suffix(".peak.json")
    argv = [sys.executable, "-m", "benchmarks.peak_memory", str(peak), *module_argv]
    seen = {"peak_rss_mb": 0.0}

    def watch(pid: int) -> None:
        with contextlib.suppress(OSError):  # gone between two checks
            seen["peak_rss_mb"] = max(seen["peak_rss_mb"], vm_hwm_mb(pid))

    try:
        seconds = run_process(argv, log, threads, timeout_s, watch)
    except BenchError as error:
        error.peak_rss_mb = seen["peak_rss_mb"]
        raise
    return {"seconds": seconds, "peak_rss_mb": json.loads(peak.read_text())["peak_rss_mb"]}


def run_child(
    module: str,
    command: str,
    tag: str,
    spec: Mapping[str, Any],
    log_dir: Path,
    threads: int,
    timeout_s: float = 3600,
) -> dict[str, Any]:
    """``python -m module command SPEC`` on ``threads`` threads, ``spec`` written to
    ``log_dir/tag.json`` with the ``result_path`` where the child writes its result;
    returns that result with the child's ``wall_s``."""
    spec_path = log_dir / f"{tag}.json"
    result_path = log_dir / f"{tag}.result.json"
    spec_path.write_text(json.dumps({**spec, "result_path": str(result_path)}))
    argv = [sys.executable, "-m", module, command, str(spec_path)]
    wall = run_process(argv, log_dir / f"{tag}.log", threads, timeout_s)
    return {**json.loads(result_path.read_text()), "wall_s": wall}


class ThrashGuard:
    """A :func:`run_process` watch that stops a run which has left the host under
    ``floor_mb`` of available memory for ``patience`` checks in a row (about half a
    second apart): without swap, a run that does not fit is not always killed at once,
    it can evict the mapped graph and re-read it for many minutes instead.

    ``available_mb`` reads the host's available memory (``MemAvailable``).
    """

    def __init__(
        self,
        floor_mb: float = 500.0,
        patience: int = 30,
        available_mb: Callable[[], float] | None = None,
    ) -> None:
        self.floor_mb, self.patience = floor_mb, patience
        self.available_mb = available_mb or host_available_mb
        self.low = 0
        self.stopped = False

    def __call__(self, pid: int) -> None:
        self.low = self.low + 1 if self.available_mb() < self.floor_mb else 0
        if self.low >= self.patience and not self.stopped:
            self.stopped = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, 9)  # the run's own session: mpirun and every rank


def host_available_mb() -> float:
    """The host's available memory (``MemAvailable``), in MB."""
    from dgl_scalegnn.train.defaults import available_bytes

    return available_bytes("cpu") / 2**20


def one_core_pool(workers: int) -> ProcessPoolExecutor:
    """``workers`` spawned processes, each on a core of its own (from the last one down)
    with one torch thread: small runs that go two at a time on 2 cores."""
    context = multiprocessing.get_context("spawn")
    return ProcessPoolExecutor(workers, mp_context=context, initializer=_on_one_core)


def _on_one_core() -> None:
    import torch

    cores = sorted(os.sched_getaffinity(0), reverse=True)
    identity = multiprocessing.current_process()._identity
    os.sched_setaffinity(0, {cores[((identity[0] - 1) if identity else 0) % len(cores)]})
    torch.set_num_threads(1)


@contextlib.contextmanager
def work_dir(given: Path | None) -> Iterator[Path]:
    """``given`` (kept: a later run reuses what is there), or a temporary directory."""
    if given is not None:
        given.mkdir(parents=True, exist_ok=True)
        yield given
        return
    with tempfile.TemporaryDirectory() as scratch:
        yield Path(scratch)


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """``parser``'s reading of ``argv``. A ``SCALEGNN_BENCH_*`` variable, which set the
    benchmarks before their command lines did, stops it with one line naming the fix
    (exit code 2) rather than letting it run with other settings than the ones asked for."""
    if retired := sorted(name for name in os.environ if name.startswith("SCALEGNN_BENCH_")):
        print(
            f"{parser.prog}: error: {retired[0]} is no longer read; unset it and give the "
            f'setting as a flag ({parser.prog} --help; make: BENCH_ARGS="--flag value")',
            file=sys.stderr,
        )
        raise SystemExit(2)
    return parser.parse_args(argv)


def argument(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """``parse`` as an argparse ``type`` whose ``ValueError`` reaches the user as its own
    message (argparse would say only "invalid value")."""

    def parsed(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    parsed.__name__ = parse.__name__
    return parsed


def full_mode(description: str, argv: Sequence[str] | None = None) -> bool:
    """Whether the command line asks for the full sizes (``--full``) rather than quick
    mode, the default of ``make bench``."""
    parser = argparse.ArgumentParser(description=description.split("\n")[0])
    parser.add_argument("--full", action="store_true", help="the full sizes, not quick mode")
    return parse_args(parser, argv).full
