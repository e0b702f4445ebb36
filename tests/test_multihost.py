"""Several hosts for real: network namespaces with their own addresses and hostnames
(tests/multihost.py), nothing shared through loopback between them.

Each launcher trains a few steps of 1x2x2x2 across the hosts to the losses of one
process: launch/mpirun.sh (Open MPI with a hostfile, reaching the other hosts through
an rsh agent, on hosts whose own name resolves to 127.0.1.1), launch/srun.sh (stand-in
srun and scontrol, four hosts) and launch/torchrun.sh (one per host, c10d rendezvous).
The watchdog ends the job when one host's ranks are all killed. Rank 0 refuses, in one
line, an address that the other hosts cannot reach. Each launch costs about 10 s of
imports on 2 cores; the one-process reference is computed once.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

import yaml
from dgl_scalegnn.config import ConfigError
from dgl_scalegnn.distributed import rendezvous
from dgl_scalegnn.distributed.watchdog import ABORT_EXIT_CODE
from dgl_scalegnn.train.metrics import read_metrics
from tests.helpers import ROOT, launched, step_losses
from tests.multihost import PREFIX, SUBNET, Cluster, cluster, namespaces
from tests.ranks import spawn_ranks

WATCHDOG_S = 5
CONFIG = {
    "data": {"name": "synthetic", "synthetic": {"num_nodes": 600, "num_features": 8}},
    "model": {"hidden": 8, "layers": 2},
    "sampling": {"batch_size": 200},
    "train": {"epochs": 1, "max_steps": 3, "progress": False},
    # a rank that cannot reach the store fails in 30 s, not the default 300 s
    "parallel": {"watchdog_s": WATCHDOG_S, "timeout_s": 30},
}
LAUNCH_TIMEOUT_S = 180
_GRACE_S = 10  # after the watchdog's timeout: its polls, the survivors' exit
_RENDEZVOUS_PORT = 29400  # any: each host has a network of its own


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> dict:
    """The config file and the losses of one process (the prepared graph lands in the
    session's cache, which every launch reads)."""
    directory = tmp_path_factory.mktemp("multihost")
    config = directory / "config.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    metrics = directory / "single.jsonl"
    argv = ["train", "--config", str(config), "--metrics", str(metrics)]
    spawn_ranks(1, "dgl_scalegnn.cli:main", [argv], directory / "single")
    return {"config": config, "losses": step_losses(read_metrics(metrics))}


def _finish(process, what: str) -> str:
    output, _ = process.communicate(timeout=LAUNCH_TIMEOUT_S)
    assert process.returncode == 0, f"{what} exited {process.returncode}:\n{output[-4000:]}"
    return output


def _check(events: list[dict], launcher: str, job: dict) -> None:
    assert events[0]["launcher"] == launcher and events[0]["world_size"] == 8
    assert step_losses(events) == pytest.approx(job["losses"], rel=1e-4)
    assert events[-1]["event"] == "summary"


def _wait_for_a_step(metrics: Path, launcher) -> None:
    deadline = time.monotonic() + LAUNCH_TIMEOUT_S
    while not (metrics.exists() and read_metrics(metrics, "step")):
        assert launcher.poll() is None, launcher.communicate()[0][-4000:]
        assert time.monotonic() < deadline, "no training step within the launch timeout"
        time.sleep(0.2)


def _mpirun_args(hosts: Cluster, slots: int) -> str:
    """``MPIRUN_ARGS`` for a job on every host, ``slots`` ranks each."""
    return f"--hostfile {hosts.hostfile(slots)} --mca plm_rsh_agent {hosts.rsh_agent}"


def test_mpirun_sh_across_hosts_whose_names_resolve_to_127_0_1_1(tmp_path, job):
    """Rank 0 must host the store on an address the other host reaches (its name gives
    127.0.1.1 there, the other host's own loopback elsewhere), and gloo must listen
    there too."""
    metrics = tmp_path / "metrics.jsonl"
    with cluster(tmp_path, 2, own_name_loopback=True) as hosts:
        command = [str(ROOT / "launch" / "mpirun.sh"), "8", "1x2x2x2", str(job["config"])]
        argv = hosts.on("node0", [*command, "--metrics", str(metrics)])
        env = {"MPIRUN_ARGS": f"{_mpirun_args(hosts, 4)} --display map"}
        with launched(argv, env) as process:
            output = _finish(process, "mpirun.sh")
    for host in hosts.hosts:  # mpirun's map: four ranks on each host
        assert re.search(rf"Data for node: {host.name}\s.*?Num procs: 4\s", output, re.S), output
    _check(read_metrics(metrics), "mpi", job)


# Stands in for scalegnn: says what a rank was given.
_SHOW_RANK = """#!/bin/sh
echo "rank $OMPI_COMM_WORLD_RANK on $(hostname): OMP_NUM_THREADS=$OMP_NUM_THREADS \
MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT NCCL_DEBUG=$NCCL_DEBUG \
CUDA_DEVICE_ORDER=$CUDA_DEVICE_ORDER LD_LIBRARY_PATH=$LD_LIBRARY_PATH \
SCALEGNN_CACHE_DIR=$SCALEGNN_CACHE_DIR"
"""


def test_mpirun_sh_hands_every_host_its_variables_and_threads_per_node(tmp_path, monkeypatch):
    """Ranks on another host see only what mpirun forwards (the rsh agent starts them in
    a login's environment, as ssh does). Threads: a node's cores over its own ranks
    (8 cores / 4), not over all 8 ranks; an unset variable is not named to mpirun."""
    monkeypatch.delenv("SCALEGNN_DATA_ROOT", raising=False)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("nproc", "#!/bin/sh\necho 8\n"), ("show-rank", _SHOW_RANK)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    given = {
        "MASTER_ADDR": f"{SUBNET}.1",
        "MASTER_PORT": "29555",
        "NCCL_DEBUG": "INFO",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "LD_LIBRARY_PATH": "/opt/site/lib",
        "SCALEGNN_CACHE_DIR": str(tmp_path / "cache"),
    }
    command = [str(ROOT / "launch" / "mpirun.sh"), "8", "1x2x2x2", "config.yaml"]
    with cluster(tmp_path, 2) as hosts:
        env = {
            **given,
            "MPIRUN_ARGS": _mpirun_args(hosts, 4),
            "OMP_NUM_THREADS": "",  # not given: mpirun.sh chooses
            "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "SCALEGNN": str(bin_dir / "show-rank"),
        }
        with launched(hosts.on("node0", command), env) as process:
            output = _finish(process, "mpirun.sh")
    assert "Could not find the environment variable" not in output, output
    seen = {}  # rank: what it was given
    for line in output.splitlines():
        if line.startswith("rank "):
            words = line.split()
            assert words[3] == f"node{int(words[1]) // 4}:", line  # 4 ranks a host
            seen[int(words[1])] = dict(word.split("=", 1) for word in words[4:])
    assert sorted(seen) == list(range(8)), output
    libraries = given.pop("LD_LIBRARY_PATH")
    for variables in seen.values():
        # after mpirun's own libraries, on the other host
        assert variables.pop("LD_LIBRARY_PATH").split(":")[-1] == libraries
        assert variables == {**given, "OMP_NUM_THREADS": "2"}


def test_mpirun_sh_refuses_a_master_addr_that_resolves_to_loopback_on_rank_0(tmp_path, job):
    """Bound on 127.0.1.1, the store would be out of the other host's reach: rank 0 says
    so in one line (naming the host and the address) instead of a 300 s timeout."""
    command = [str(ROOT / "launch" / "mpirun.sh"), "2", "1x1x1x2", str(job["config"])]
    with cluster(tmp_path, 2, own_name_loopback=True) as hosts:
        env = {"MPIRUN_ARGS": _mpirun_args(hosts, 1), "MASTER_ADDR": "node0"}
        with launched(hosts.on("node0", command), env) as process:
            output, _ = process.communicate(timeout=LAUNCH_TIMEOUT_S)
    assert process.returncode == 2, output[-4000:]
    errors = [line for line in output.splitlines() if line.startswith("scalegnn: error:")]
    assert errors == [
        "scalegnn: error: MASTER_ADDR=node0 resolves on node0 (rank 0) to 127.0.1.1, which "
        "the ranks on the other hosts cannot reach: set MASTER_ADDR to node0's address on "
        "the network the hosts share, or unset it to let rank 0 choose one"
    ], output[-4000:]


def test_srun_sh_across_four_hosts(tmp_path, job):
    """launch/srun.sh on four hosts, two tasks each, through a stand-in srun that starts
    each host's tasks there with their SLURM_* variables. Each host's own name resolves
    to 127.0.1.1 there (Debian's /etc/hosts): srun.sh gives rank 0 the address it sends
    from towards the next host, and every rank pins gloo to its own such address."""
    metrics = tmp_path / "metrics.jsonl"
    command = ["bash", str(ROOT / "launch" / "srun.sh"), "1x2x2x2", str(job["config"])]
    with cluster(tmp_path, 4, own_name_loopback=True) as hosts:
        env = hosts.slurm(tmp_path, tasks=8)
        argv = hosts.on("node0", [*command, "--metrics", str(metrics)])
        with launched(argv, env) as process:
            _finish(process, "srun.sh")
    _check(read_metrics(metrics), "slurm", job)


def test_torchrun_sh_on_each_of_two_hosts_meets_at_a_c10d_rendezvous(tmp_path, job):
    """One launch/torchrun.sh a host, four ranks each, the same secret on both."""
    metrics = tmp_path / "metrics.jsonl"
    command = [str(ROOT / "launch" / "torchrun.sh"), "4", "1x2x2x2", str(job["config"])]
    secret = secrets.token_hex(32)  # one for the job, the same on every host
    with cluster(tmp_path, 2) as hosts, contextlib.ExitStack() as stack:
        launchers = []
        for rank, host in enumerate(hosts.hosts):
            rendezvous = f"--rdzv-backend=c10d --rdzv-endpoint=node0:{_RENDEZVOUS_PORT}"
            env = {
                "SCALEGNN_JOB_SECRET": secret,
                "TORCHRUN_ARGS": f"--nnodes=2 --node-rank={rank} {rendezvous}",
            }
            argv = hosts.on(host.name, [*command, "--metrics", str(metrics)])
            launchers.append(stack.enter_context(launched(argv, env)))
        for rank, process in enumerate(launchers):
            _finish(process, f"torchrun.sh on node{rank}")
    _check(read_metrics(metrics), "torchrun", job)


def test_watchdog_stops_the_job_when_every_rank_of_a_host_is_killed(tmp_path, job):
    """Host 1's ranks (2 and 3) all die at once; the ranks of host 0 must stop, saying
    which rank was lost, within the watchdog's timeout and a few seconds."""
    config = tmp_path / "long.yaml"
    endless = {**CONFIG["train"], "epochs": 1000, "max_steps": None}
    config.write_text(yaml.safe_dump({**CONFIG, "train": endless}))
    metrics = tmp_path / "metrics.jsonl"
    command = ["bash", str(ROOT / "launch" / "srun.sh"), "1x1x2x2", str(config)]
    with cluster(tmp_path, 2) as hosts:
        env = hosts.slurm(tmp_path, tasks=4)
        argv = hosts.on("node0", [*command, "--metrics", str(metrics)])
        with launched(argv, env) as process:
            _wait_for_a_step(metrics, process)
            assert len(hosts.kill("node1")) == 2
            killed_at = time.monotonic()
            output, _ = process.communicate(timeout=LAUNCH_TIMEOUT_S)
            stopped_after = time.monotonic() - killed_at
    for task in (0, 1):
        assert f"srun: error: node0: task {task}: exit {ABORT_EXIT_CODE}" in output, output
    assert re.search(r"stopping the job: .*rank [23] stopped responding", output), output
    assert stopped_after < WATCHDOG_S + _GRACE_S, (stopped_after, output[-3000:])


def test_a_host_without_a_reachable_address_is_refused_naming_what_was_tried(monkeypatch):
    """Only loopback addresses towards the other hosts and for the host's own name: rank
    0 refuses, naming the host and every address it tried, and says what to set."""
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.setattr(socket, "gethostname", lambda: "localhost")
    expected = (
        r"no address of host localhost that the ranks on the other hosts can reach "
        r"\(towards 127\.0\.0\.2: 127\.0\.0\.1; its own name: 127\.0\.0\.1.*\): "
        r"set MASTER_ADDR to localhost's address on the network the hosts share"
    )
    with pytest.raises(ConfigError, match=expected):
        rendezvous._reachable_address(["127.0.0.2"])


def test_hosts_are_torn_down_after_a_failure_and_a_killed_runs_leftovers_removed(tmp_path):
    """A test failing midway leaves no namespace and no process behind; namespaces left
    by a test process that was killed (its pid is gone) are removed by the next."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    leftover = f"{PREFIX}{gone.pid}-1-node0"
    subprocess.run(["ip", "netns", "add", leftover], check=True)
    with pytest.raises(RuntimeError, match="midway"), cluster(tmp_path, 2) as hosts:
        assert leftover not in namespaces()
        stem = hosts.host("node0").namespace.removesuffix("node0")  # the bridge's too
        sleeper = subprocess.Popen(hosts.on("node1", ["sleep", "600"]))
        while hosts.pids("node1") != [sleeper.pid]:
            assert sleeper.poll() is None
            time.sleep(0.05)
        raise RuntimeError("the test failed midway")
    assert sleeper.wait(timeout=10) == -signal.SIGKILL
    assert not [name for name in namespaces() if name.startswith(stem)]
