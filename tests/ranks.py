"""Start a group of real rank processes quickly.

Ranks are forked from a forkserver that has already imported torch (with the
compiler front end its optimizers import), DGL and dgl_scalegnn (importing them costs
~3 s of CPU per process; 8 ranks on 2 cores would spend most of a test importing).
Each rank gets the environment torchrun gives (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT), the job secret launch/torchrun.sh hands
(SCALEGNN_JOB_SECRET, drawn per group), one thread (or the ``OMP_NUM_THREADS`` the
test passes in ``env``), and its own stdout/stderr files; a failing rank fails the test
with every rank's output.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import secrets
import socket
import sys
import time
import traceback
from multiprocessing import forkserver
from pathlib import Path
from typing import Any

_PRELOAD = [
    "torch",
    "torch._dynamo",  # imported by the first torch.optim optimizer a rank builds (~1 s)
    "dgl_scalegnn.sampling.dgl_loader",  # imports DGL itself (the package defers it)
    "dgl_scalegnn.train.run",
    "dgl_scalegnn.cli",
    "tests.helpers",
]
_context: Any = None
#: The environment before any test ran (this module is imported while tests are
#: collected): the forkserver, one per process, keeps the environment it starts in and
#: hands it to every rank, so a test's temporary cache directory must not reach it.
_SESSION_ENVIRONMENT = dict(os.environ)


def _forkserver():
    global _context
    if _context is None:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(_PRELOAD)
        current = dict(os.environ)
        os.environ.clear()
        os.environ.update({"OMP_NUM_THREADS": "1", **_SESSION_ENVIRONMENT})
        try:
            forkserver.ensure_running()
        finally:
            os.environ.clear()
            os.environ.update(current)
    return _context


def reserve_port() -> socket.socket:
    """A socket bound (not listening) to a free loopback port, with SO_REUSEADDR.

    While it stays open the kernel gives that port to no other bind or outgoing
    connection, yet rank 0's TCPStore (which sets SO_REUSEADDR too) can still listen
    on it: no window in which another process takes the port. Close it when the ranks
    are done.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


def _rank_main(target: str, args: list[Any], env: dict[str, str], log_dir: str, rank: int) -> None:
    out = open(Path(log_dir) / f"rank{rank}.out", "w")  # noqa: SIM115 - lives as long as the rank
    os.dup2(out.fileno(), 1)
    os.dup2(out.fileno(), 2)
    sys.stdout = sys.stderr = out
    os.environ.update(env)
    import torch

    # one thread unless the test asked for more (the forkserver itself runs with one)
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    module_name, function = target.split(":")
    try:
        result = getattr(importlib.import_module(module_name), function)(*args)
    except SystemExit as stop:
        out.flush()
        os._exit(stop.code if isinstance(stop.code, int) else 1)
    except BaseException:
        traceback.print_exc()
        out.flush()
        os._exit(1)
    out.flush()
    os._exit(result if isinstance(result, int) else 0)


class RankGroup:
    """Rank processes that were started together; :meth:`wait` collects their results.

    Use it as a context manager: leaving the block kills every rank still alive, also
    when the test fails midway.
    """

    def __init__(self, processes: list, log_dir: Path, port: socket.socket) -> None:
        self.processes, self.log_dir, self.port = processes, log_dir, port

    def __enter__(self) -> RankGroup:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.kill()

    def kill(self) -> None:
        """SIGKILL every rank still alive (stopped ones too), reap it, free the port."""
        for process in self.processes:
            if process.is_alive():
                process.kill()
                process.join()
        self.port.close()

    def output(self, rank: int) -> str:
        path = self.log_dir / f"rank{rank}.out"
        return path.read_text() if path.exists() else ""

    def wait(self, timeout: float) -> tuple[list[int], list[tuple[int | None, str]]]:
        """Join every rank; kill those still alive after ``timeout`` seconds in all.

        Returns the ranks that timed out and ``(exit code, output)`` per rank.
        """
        deadline = time.monotonic() + timeout
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
        timed_out = [rank for rank, p in enumerate(self.processes) if p.is_alive()]
        self.kill()
        return timed_out, [(p.exitcode, self.output(r)) for r, p in enumerate(self.processes)]


def start_ranks(
    world_size: int,
    target: str,
    args: list[Any],
    log_dir: str | os.PathLike[str],
    *,
    env: dict[str, str] | None = None,
) -> RankGroup:
    """Start ``module:function(*args)`` on ``world_size`` ranks (torchrun's environment)."""
    context = _forkserver()
    reserved = reserve_port()
    port = str(reserved.getsockname()[1])
    log_path = Path(log_dir)
    secret = secrets.token_hex(32)
    processes: list = []
    group = RankGroup(processes, log_path, reserved)
    try:
        log_path.mkdir(parents=True, exist_ok=True)
        for rank in range(world_size):
            rank_env = {
                "RANK": str(rank),
                "WORLD_SIZE": str(world_size),
                "LOCAL_RANK": str(rank),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": port,
                "SCALEGNN_JOB_SECRET": secret,
                "OMP_NUM_THREADS": "1",
                **(env or {}),
            }
            process = context.Process(
                target=_rank_main, args=(target, args, rank_env, str(log_path), rank)
            )
            process.start()
            processes.append(process)
    except BaseException:
        group.kill()  # a start failing midway leaves no rank and no reserved port behind
        raise
    return group


def spawn_ranks(
    world_size: int,
    target: str,
    args: list[Any],
    log_dir: str | os.PathLike[str],
    *,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    expect_failure: bool = False,
) -> list[tuple[int | None, str]]:
    """Run ``module:function(*args)`` on ``world_size`` ranks; returns (exit code, output).

    Unless ``expect_failure``, any non-zero exit raises AssertionError with all outputs;
    a rank still running after ``timeout`` seconds always does.
    """
    with start_ranks(world_size, target, args, log_dir, env=env) as group:
        timed_out, results = group.wait(timeout)
    failed = timed_out or any(code != 0 for code, _ in results)
    if timed_out or (failed and not expect_failure):
        report = "\n".join(
            f"--- rank {rank} exit {code}\n{output[-4000:]}"
            for rank, (code, output) in enumerate(results)
        )
        what = f"ranks {timed_out} timed out after {timeout} s" if timed_out else "ranks failed"
        raise AssertionError(f"{what}:\n{report}")
    return results
