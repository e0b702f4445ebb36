"""A silent rank whose process is alive on this host is stalled, not gone.

In a 70-minute benchmark on 8 ranks of 2 cores, a healthy job was stopped while loading:
"rank 0 stopped responding (no heartbeat for 15 s)", though rank 0's process was alive
(its store still answered). The watchdog now asks, before declaring a rank gone, whether
its process runs on this kernel, alive and not stopped (a signed record each rank
publishes); a stopped, dead or unseen process is still declared gone within the timeout.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest
import torch.distributed as dist

from dgl_scalegnn.distributed.rendezvous import JobStore
from dgl_scalegnn.distributed.watchdog import (
    ABORT_EXIT_CODE,
    Watchdog,
    location,
    signed,
)

KEY = b"k" * 32
TIMEOUT_S = 0.3


@pytest.fixture
def child() -> Iterator[subprocess.Popen]:
    """A process that stands for the silent rank; killed (also when stopped) at the end."""
    process = subprocess.Popen(["sleep", "60"])
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def _where(pid: int, **changed: object) -> bytes:
    """The :func:`location` of ``pid``, with its ``kernel`` or ``started`` replaced."""
    kernel, pid, started = json.loads(location(pid))
    fields = {"kernel": kernel, "pid": pid, "started": started, **changed}
    return json.dumps(list(fields.values())).encode()


def _watch_silent_rank(where: bytes, key: bytes = KEY) -> tuple[Watchdog, list[int]]:
    """Rank 0's watchdog, watching rank 1, which beat once and published ``where`` signed
    with ``key``; returns the watchdog and the exit codes it asked for."""
    store = dist.HashStore()
    exits: list[int] = []
    watcher = Watchdog(
        JobStore(dist.PrefixStore("job", store), hosts_store=False, record_key=KEY),
        0,
        2,
        interval=0.05,
        timeout=TIMEOUT_S,
        exit=exits.append,
    )
    silent = JobStore(dist.PrefixStore("job", store), hosts_store=False, record_key=key)
    silent.store.set("watchdog/beat/1", "1")
    silent.store.set("watchdog/where/1", signed(key, where))
    return watcher.start(), exits


def _wait_for_exit(exits: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not exits and time.monotonic() < deadline:
        time.sleep(0.02)
    return bool(exits)


def test_a_silent_rank_alive_on_this_host_is_waited_for_until_it_is_stopped(child, capsys):
    watcher, exits = _watch_silent_rank(_where(child.pid))
    assert not _wait_for_exit(exits, 4 * TIMEOUT_S)  # alive: stalled, not gone
    said = capsys.readouterr().err
    assert said.count("rank 1 has not beaten") == 1 and "runs on this host: waiting" in said
    child.send_signal(signal.SIGSTOP)  # a stopped process is as good as gone
    assert _wait_for_exit(exits, 4 * TIMEOUT_S) and exits == [ABORT_EXIT_CODE]
    assert "rank 1 stopped responding (no heartbeat for" in capsys.readouterr().err
    watcher.close()


def test_a_silent_rank_whose_process_died_is_gone(child):
    where = _where(child.pid)
    child.kill()
    child.wait()  # reaped: its pid names no process (or, later, another one)
    watcher, exits = _watch_silent_rank(where)
    assert _wait_for_exit(exits, 4 * TIMEOUT_S) and exits == [ABORT_EXIT_CODE]
    watcher.close()


@pytest.mark.parametrize("case", ["another kernel", "unsigned", "pid taken by another"])
def test_a_silent_rank_that_cannot_be_seen_alive_here_is_gone(child, case):
    """A process on another kernel cannot be seen; a record the job did not sign (an
    outsider's, which could otherwise keep a dead rank "alive") is not read; a pid whose
    start time differs is another process."""
    where = {
        "another kernel": _where(child.pid, kernel="another-boot:1"),
        "unsigned": _where(child.pid),
        "pid taken by another": _where(child.pid, started=1.0),
    }[case]
    watcher, exits = _watch_silent_rank(where, key=b"x" * 32 if case == "unsigned" else KEY)
    assert _wait_for_exit(exits, 4 * TIMEOUT_S) and exits == [ABORT_EXIT_CODE]
    watcher.close()
