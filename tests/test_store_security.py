"""Nothing outside the job can steer it through the rendezvous store, and bad input is
said once.

An outside client on the same machine that knows the store's port connects to it,
sets the keys it can guess (``watchdog/abort`` first) and forges an abort record under
every prefix the store lists; the job must run to the end with the losses of an
undisturbed run, its store listening on loopback only. A job whose input is bad on
every rank prints one line, from the failing rank."""

from __future__ import annotations

import datetime
import json
import os
import secrets
import subprocess
import threading

import psutil
import pytest
import torch.distributed as dist

import yaml
from dgl_scalegnn.cli import main as cli_main
from dgl_scalegnn.config import ConfigError
from dgl_scalegnn.distributed.launch import LaunchInfo
from dgl_scalegnn.distributed.rendezvous import SECRET_VARIABLE, JobStore, init_distributed
from dgl_scalegnn.distributed.watchdog import ABORT_EXIT_CODE, Watchdog, stopped_the_job
from dgl_scalegnn.errors import BAD_INPUT_EXIT_CODE
from dgl_scalegnn.train.metrics import read_metrics
from tests.helpers import ROOT, launched
from tests.ranks import reserve_port, spawn_ranks, start_ranks

CONFIG = {
    "data": {"name": "synthetic", "synthetic": {"num_nodes": 2000, "num_features": 16}},
    "model": {"hidden": 16, "layers": 2},
    "sampling": {"batch_size": 250},
    # 24 steps and three evaluations: the store lives 2-3 s, 7-8 s on a busy machine
    "train": {"epochs": 3, "max_steps": 24, "progress": False},
    "parallel": {"watchdog_s": 5},
}
INJECTED = "rank 0: injected by an outside client"


class OutsideClient:
    """Connects to ``port`` on loopback as a ``TCPStore`` client, again and again while
    the job runs, and sets every key it can guess or list; notes where the store
    listens."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.listening: set[str] = set()  # addresses a socket on the port listens on
        self.prefixes: set[str] = set()  # prefixes under which it forged an abort record
        self.guessed = 0  # rounds in which it set the guessed keys
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> OutsideClient:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        store = None
        while not self._stop.wait(0.1):
            listening = {
                c.laddr.ip
                for c in psutil.net_connections("inet")
                if c.status == psutil.CONN_LISTEN and c.laddr.port == self.port
            }
            self.listening |= listening
            if not listening:
                # a client started before the store retries for seconds, long enough on
                # a busy machine to miss a job that lives a few: connect once it listens
                store = None
                continue
            try:
                store = store or dist.TCPStore(
                    "127.0.0.1", self.port, is_master=False, timeout=datetime.timedelta(seconds=2)
                )
                self._attack(store)
            except Exception:  # not listening yet, or gone: the job ended
                store = None

    def _attack(self, store: dist.Store) -> None:
        store.set("watchdog/abort", INJECTED)
        for rank in range(4):
            store.set(f"watchdog/done/{rank}", "1")
        self.guessed += 1
        for key in store.list_keys():
            if "watchdog/" in key:
                prefix = key[: key.index("watchdog/")]
                forged = json.dumps([1, "error", INJECTED])
                store.set(f"{prefix}watchdog/abort", f"{'0' * 64} {forged}")
                self.prefixes.add(prefix)


def _config_file(tmp_path, config: dict) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


@pytest.fixture(scope="module")
def undisturbed_losses(tmp_path_factory) -> list[float]:
    """The losses of the same job on one process, with no client around."""
    tmp_path = tmp_path_factory.mktemp("undisturbed")
    metrics = tmp_path / "undisturbed.jsonl"
    argv = ["train", "--config", _config_file(tmp_path, CONFIG), "--metrics", str(metrics)]
    assert cli_main(argv) == 0
    return [e["loss"] for e in read_metrics(metrics, "step")]


def _check_unsteered(client: OutsideClient, metrics, undisturbed: list[float]) -> None:
    assert client.guessed > 0 and client.prefixes, "the client never reached the store"
    assert client.listening == {"127.0.0.1"}
    losses = [e["loss"] for e in read_metrics(metrics, "step")]
    assert len(losses) == CONFIG["train"]["max_steps"]
    assert losses == pytest.approx(undisturbed, rel=1e-4)


def test_outside_client_cannot_steer_an_mpirun_job(tmp_path, undisturbed_losses):
    """The probe's path: rank 0 hosts the store (on MASTER_PORT, so that the client knows
    the port) and both ranks share this node, so it must listen on loopback only."""
    metrics = tmp_path / "job.jsonl"
    with reserve_port() as reserved:  # the port the client knows: held until the end
        port = reserved.getsockname()[1]
        command = [str(ROOT / "launch" / "mpirun.sh"), "2", "1x1x1x2"]
        command += [_config_file(tmp_path, CONFIG), "--metrics", str(metrics)]
        with (
            OutsideClient(port) as client,
            launched(command, {"MASTER_PORT": str(port)}) as launcher,
        ):
            output, _ = launcher.communicate(timeout=120)
    assert launcher.returncode == 0, output[-3000:]
    assert INJECTED not in output
    assert read_metrics(metrics)[0]["launcher"] == "mpi"
    _check_unsteered(client, metrics, undisturbed_losses)


def test_outside_client_cannot_steer_a_torchrun_job(tmp_path, undisturbed_losses):
    """torchrun's environment (tests/ranks.py): rank 0 hosts the store on MASTER_ADDR.
    The secret appears in no output and no metrics."""
    metrics = tmp_path / "job.jsonl"
    argv = ["train", "--config", _config_file(tmp_path, CONFIG), "--grid", "1x1x1x2"]
    argv += ["--metrics", str(metrics)]
    secret = secrets.token_hex(32)
    env = {SECRET_VARIABLE: secret}
    with (
        start_ranks(2, "dgl_scalegnn.cli:main", [argv], tmp_path / "ranks", env=env) as group,
        OutsideClient(group.port.getsockname()[1]) as client,
    ):
        timed_out, results = group.wait(timeout=120)
    assert not timed_out
    assert [code for code, _ in results] == [0, 0], results
    assert not any(INJECTED in output or secret in output for _, output in results)
    assert secret not in metrics.read_text()
    _check_unsteered(client, metrics, undisturbed_losses)


@pytest.mark.parametrize(("secret", "found"), [("", "is not set"), ("x" * 31, "has 31 characters")])
def test_a_launch_without_a_job_secret_is_refused(monkeypatch, secret, found):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "1")  # never reached: refused before connecting
    monkeypatch.setenv(SECRET_VARIABLE, secret)
    info = LaunchInfo(rank=1, world_size=2, local_rank=1, launcher="torchrun")
    with pytest.raises(ConfigError, match=f"{SECRET_VARIABLE} {found} .*launch/torchrun.sh"):
        init_distributed(info, "gloo", 5)


def test_bad_input_on_every_rank_is_one_line_from_one_rank(tmp_path):
    """A dgl data file that is not a graph: the failing rank (rank 0, which prepares the
    node's copy) says it once and exits 2; the rank it stops exits 2 without a word."""
    path = tmp_path / "graph.bin"
    path.write_bytes(os.urandom(4096))
    config = {**CONFIG, "data": {"name": "dgl", "path": str(path)}}
    argv = ["train", "--config", _config_file(tmp_path, config), "--grid", "1x1x1x2"]
    results = spawn_ranks(
        2, "dgl_scalegnn.cli:main", [argv], tmp_path / "ranks", expect_failure=True, timeout=60
    )
    assert [code for code, _ in results] == [BAD_INPUT_EXIT_CODE] * 2, results
    said = [line for _, output in results for line in output.splitlines() if line.strip()]
    # the start-up's lines are not about the error: whatever says it, or a rank stopping
    errors = [line for line in said if "error" in line.lower() or "stopping" in line]
    assert len(errors) == 1 and errors[0].startswith("scalegnn: error: "), said


def test_bad_input_under_mpirun_is_said_before_the_launcher_ends_the_job(tmp_path):
    """The same bad input under launch/mpirun.sh: the rank it stops exits 2 at once, and
    mpirun then ends every other process, the failing rank 0 too while it lingers for the
    watchdogs (it hosts their store): it must have said its line before lingering."""
    path = tmp_path / "graph.bin"
    path.write_bytes(os.urandom(4096))
    config = {**CONFIG, "data": {"name": "dgl", "path": str(path)}}
    result = subprocess.run(
        [str(ROOT / "launch" / "mpirun.sh"), "2", "1x1x1x2", _config_file(tmp_path, config)],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("scalegnn: error:")]
    assert len(errors) == 1 and str(path) in errors[0], result.stdout + result.stderr


class _Exited(Exception):
    """Raised by the watchdogs' ``exit`` below instead of ending the test's process."""


def _exit(code: int) -> None:
    raise _Exited(code)


def _watchdogs(store: dist.Store, key: bytes = b"k" * 32) -> list[Watchdog]:
    job = JobStore(dist.PrefixStore("job", store), hosts_store=False, record_key=key)
    return [Watchdog(job, rank, 2, interval=0.05, timeout=0.1, exit=_exit) for rank in range(2)]


@pytest.mark.parametrize("bad_input", [True, False], ids=["bad input", "other error"])
def test_a_rank_stopped_by_another_says_why_unless_it_was_bad_input(capsys, bad_input):
    first, second = _watchdogs(dist.HashStore())
    error = ValueError("data.path: not a graph")
    first.report_failure(error, bad_input=bad_input)  # its record stands: it returns
    assert stopped_the_job(error)
    # bad input is said by the failing rank at once (before it lingers); anything else is
    # left to its caller (a trace) and said by every rank it stops
    reported = capsys.readouterr().err
    assert reported == ("scalegnn: error: data.path: not a graph\n" if bad_input else "")
    with pytest.raises(_Exited, match=str(BAD_INPUT_EXIT_CODE if bad_input else ABORT_EXIT_CODE)):
        second.report_failure(RuntimeError("a collective broke"), bad_input=bad_input)
    said = capsys.readouterr().err
    if bad_input:
        assert said == ""
    else:
        assert "[rank 1] stopping the job: rank 0 failed: ValueError: data.path" in said


def test_an_abort_record_no_rank_signed_is_ignored_then_replaced(capsys):
    store = dist.HashStore()
    store.set("job/watchdog/abort", f"{'0' * 64} {json.dumps([1, 'error', INJECTED])}")
    first, second = _watchdogs(store)
    second.await_verdict()  # returns: no record of the job stands
    error = RuntimeError("shard file missing")
    first.report_failure(error)
    assert stopped_the_job(error)
    with pytest.raises(_Exited):
        second.await_verdict()
    assert "rank 0 failed: RuntimeError: shard file missing" in capsys.readouterr().err
    other_job = _watchdogs(store, key=b"x" * 32)[1]  # another secret signs nothing here
    other_job.await_verdict()
