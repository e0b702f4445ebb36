"""DistDGL (DGL 2.1.0's distributed training) on this host, over loopback only.

DGL's distributed runtime runs in the project's virtualenv (torch 2.13, through
:mod:`dgl_scalegnn._dgl` plus the small in-process adjustments of
:func:`benchmarks.baselines.distdgl_worker.patch_dgl`); no second environment is
needed (``make distdgl-env`` only checks this).

What runs
    The graph is partitioned by ``dgl.distributed.partition_graph`` (METIS, balancing
    training vertices and edges) into ``num_parts`` parts written to disk. Every
    DistDGL process is ``python -m benchmarks.baselines.distdgl_worker SPEC.json``: one
    DistGraph server per machine and the trainers, all bound to 127.0.0.1 (the servers
    on the ports of the ip_config, the trainers' RPC receivers on free ports, gloo on
    ``lo``; the trainers meet through a ``FileStore``). Training is GraphSAGE
    (:mod:`.graphsage` settings; ``batch_size`` is global by default, split over the
    trainers, see :class:`LaunchConfig`) with DistDGL's
    ``DistNodeDataLoader`` + ``NeighborSampler`` under ``DistributedDataParallel``.
Topologies
    ``machines`` (``P`` processes = ``P`` machines): ``P`` partitions, ip_config lines
    ``127.0.0.1 <port>``, each machine one server and one trainer. DGL keeps a
    machine's partition and features in POSIX shared memory under names that do not
    include the partition, so two servers on one host would overwrite each other's
    (observed: both trainers saw partition 1, then a failed range check); each machine
    therefore runs in its own mount namespace with a private ``/dev/shm``
    (``unshare --mount`` for the server, ``nsenter`` for its trainer; root needed). The
    network namespace is shared, so the machines talk over loopback.
    ``single`` (one machine, ``P`` trainers): one partition, one server, ``P``
    trainers; no isolation needed. ``auto`` picks ``machines`` when ``unshare`` works.
Processes
    Every process starts in its own session; at the end, on failure, on timeout or on
    an exception in the launcher, every process still alive gets SIGTERM, then SIGKILL
    after a grace period; nothing is left behind. A failing process stops the run at
    once with the tail of its log.

Run ``python -m benchmarks.baselines.distdgl --procs 1 2 4 --num-nodes 50000`` (or
``make distdgl``); ``--graph GRAPH.bin`` (``make distdgl DISTDGL_GRAPH=GRAPH.bin``) runs
on a ``dgl.save_graphs`` file instead, read as ``scalegnn train --data`` reads it (same
features, labels, split and feature scaling), so the two compare on one graph.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from benchmarks.baselines.distdgl_worker import MACHINE_ENV, RANK_ENV, WORLD_ENV
from benchmarks.baselines.graphsage import DEFAULTS as GRAPHSAGE_DEFAULTS
from benchmarks.baselines.training import machine_cores, mean_std
from dgl_scalegnn._dgl import dgl, graphbolt_stubbed
from dgl_scalegnn.config import DataConfig, SyntheticConfig
from dgl_scalegnn.data.datasets import load_dataset
from dgl_scalegnn.data.graph import NodeDataset
from dgl_scalegnn.data.synthetic import generate

__all__ = [
    "TOPOLOGIES",
    "LaunchConfig",
    "DistDGLError",
    "check_runtime",
    "isolation_available",
    "partition",
    "launch",
    "run",
    "smoke_run",
    "bench_dataset",
    "main",
]

ROOT = Path(__file__).resolve().parents[2]
#: GraphSAGE settings of ``bench``: the best of the synthetic sweep (``run_peers``).
BENCH_SETTINGS = {"batch_size": 512, "lr": 0.01}
TOPOLOGIES = ("auto", "machines", "single")
GRAPH_NAME = "graph"
_NDATA = ("feat", "label", "train_mask", "val_mask", "test_mask")
_WORKER = "benchmarks.baselines.distdgl_worker"
_LOG_TAIL = 4000


class DistDGLError(RuntimeError):
    """A DistDGL launch that failed or timed out; the message has the logs' tails."""


@dataclass(frozen=True)
class LaunchConfig:
    """How to run DistDGL.

    Attributes
    ----------
    settings : dict
        GraphSAGE settings (:data:`benchmarks.baselines.graphsage.DEFAULTS`).
    global_batch : bool
        ``settings["batch_size"]`` is the batch of all trainers together, each trainer
        taking ``ceil(batch_size / P)`` vertices per step (the same optimisation for
        every ``P``: strong scaling); ``False``: per trainer, as DGL's examples do.
    seed : int
        Trainer ``r`` seeds with ``seed + r``.
    target_acc : float or None
        Validation accuracy defining ``time_to_target_s``.
    max_epochs, eval_every : int
        Epochs and evaluation period.
    stop_at_target : bool
        Stop at the first evaluation reaching ``target_acc``.
    budget_s : float or None
        Train for this many seconds instead of ``max_epochs`` epochs, evaluating as
        the training times ``eval_at_s`` are passed
        (:func:`benchmarks.baselines.training.run_for_seconds`).
    eval_at_s : tuple of float
        The evaluation times of a ``budget_s`` run.
    timeout_s : float
        Bound on the whole launch (start-up, training and shut-down).
    start_timeout_s : float
        Bound on each server's start (mount namespace ready).
    grace_s : float
        Time between SIGTERM and SIGKILL, and for servers to exit after the trainers.
    """

    settings: Mapping[str, Any] = field(default_factory=dict)
    global_batch: bool = True
    seed: int = 0
    target_acc: float | None = None
    max_epochs: int = 20
    eval_every: int = 1
    stop_at_target: bool = False
    budget_s: float | None = None
    eval_at_s: tuple[float, ...] = ()
    timeout_s: float = 1800.0
    start_timeout_s: float = 60.0
    grace_s: float = 10.0


def check_runtime() -> dict[str, Any]:
    """Versions, and whether DGL's distributed runtime imports in this environment."""
    return {
        "python": sys.executable,
        "torch": torch.__version__,
        "dgl": dgl.__version__,
        "graphbolt_stubbed": graphbolt_stubbed(),
        "distributed_importable": hasattr(dgl.distributed, "DistGraph"),
        "namespace_isolation": isolation_available(),
    }


def isolation_available() -> bool:
    """Whether ``unshare --mount`` works here (root with util-linux)."""
    if shutil.which("unshare") is None or shutil.which("nsenter") is None:
        return False
    try:
        probe = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "true"],
            capture_output=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def _resolve_topology(topology: str) -> str:
    if topology not in TOPOLOGIES:
        raise ValueError(f"topology {topology!r}; choose one of {', '.join(TOPOLOGIES)}")
    if topology == "auto":
        return "machines" if isolation_available() else "single"
    if topology == "machines" and not isolation_available():
        raise DistDGLError(
            "topology 'machines' needs `unshare --mount` (root): each machine's server "
            "needs a private /dev/shm; use topology 'single'"
        )
    return topology


def partition(
    dataset: NodeDataset, out_dir: str | os.PathLike[str], num_parts: int, method: str = "metis"
) -> Path:
    """Partition ``dataset`` for DistDGL; return the partition config (JSON) path.

    Parameters
    ----------
    dataset : NodeDataset
        The graph; only its required node data are kept.
    out_dir : path
        Written by ``dgl.distributed.partition_graph``.
    num_parts : int
        Number of machines.
    method : str
        ``"metis"`` or ``"random"``.
    """
    graph = dgl.graph(dataset.graph.edges(), num_nodes=dataset.num_nodes)
    for key in _NDATA:
        graph.ndata[key] = dataset.graph.ndata[key]
    dgl.distributed.partition_graph(
        graph,
        GRAPH_NAME,
        num_parts,
        str(out_dir),
        part_method=method,
        balance_ntypes=graph.ndata["train_mask"].long(),
        balance_edges=True,
    )
    return Path(out_dir) / f"{GRAPH_NAME}.json"


_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _free_ports(count: int) -> list[int]:
    """``count`` distinct ports that bind now, below the kernel's ephemeral range: a
    server binds its port only after the earlier servers and trainers have connected,
    and a port from the ephemeral range can meanwhile become the source port of one of
    their connections ("Address already in use", seen at 8 machines)."""
    low = int(_EPHEMERAL_RANGE.read_text().split()[0]) if _EPHEMERAL_RANGE.exists() else 32768
    candidates = list(range(max(1024, low - 12000), low))
    random.shuffle(candidates)
    ports: list[int] = []
    for port in candidates:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
        if len(ports) == count:
            return ports
    raise DistDGLError(f"no {count} free ports below the ephemeral range (from {low})")


@dataclass
class _Proc:
    name: str
    popen: subprocess.Popen
    log: Path


class _Processes:
    """The launched processes; :meth:`stop_all` ends every one of them (by session)."""

    def __init__(self, log_dir: Path, grace_s: float) -> None:
        self.log_dir = log_dir
        self.grace_s = grace_s
        self.procs: list[_Proc] = []

    def start(self, name: str, argv: list[str], env: Mapping[str, str]) -> _Proc:
        log = self.log_dir / f"{name}.log"
        with open(log, "wb") as out:
            popen = subprocess.Popen(
                argv,
                cwd=ROOT,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        proc = _Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def failed(self) -> list[_Proc]:
        return [p for p in self.procs if p.popen.poll() not in (None, 0)]

    def report(self, procs: Sequence[_Proc] | None = None) -> str:
        parts = []
        for proc in procs if procs is not None else self.procs:
            text = proc.log.read_text(errors="replace")[-_LOG_TAIL:]
            parts.append(f"--- {proc.name} (exit {proc.popen.poll()}):\n{text}")
        return "\n".join(parts)

    def wait(self, procs: Sequence[_Proc], deadline: float) -> bool:
        """Wait until ``procs`` all exit (True) or ``deadline``; raise if any process fails."""
        while time.monotonic() < deadline:
            failed = self.failed()
            if failed:
                raise DistDGLError(f"DistDGL process failed:\n{self.report(failed)}")
            if all(p.popen.poll() is not None for p in procs):
                return True
            time.sleep(0.2)
        return False

    def _signal(self, sig: int) -> None:
        for proc in self.procs:
            if proc.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.popen.pid, sig)

    def stop_all(self) -> None:
        """SIGTERM every live process group, SIGKILL what is left after the grace time."""
        self._signal(signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        while time.monotonic() < deadline and any(p.popen.poll() is None for p in self.procs):
            time.sleep(0.1)
        self._signal(signal.SIGKILL)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=self.grace_s)


@contextlib.contextmanager
def _processes(log_dir: Path, grace_s: float) -> Iterator[_Processes]:
    procs = _Processes(log_dir, grace_s)
    try:
        yield procs
    finally:
        procs.stop_all()


def _base_env(threads: int) -> dict[str, str]:
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("DGL_")}
    pythonpath = [str(ROOT), *filter(None, [env.get("PYTHONPATH")])]
    env.update(
        PYTHONPATH=os.pathsep.join(pythonpath),
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "passive"),
        GLOO_SOCKET_IFNAME="lo",
        TP_SOCKET_IFNAME="lo",
        DGL_DIST_MODE="distributed",
        DGL_NUM_SERVER="1",
        DGL_GRAPH_FORMAT="csc",
    )
    return env


@dataclass(frozen=True)
class _Layout:
    topology: str
    num_machines: int
    num_trainers: int
    work: Path
    spec: Path


def _trainer_settings(cfg: LaunchConfig, num_trainers: int) -> dict[str, Any]:
    """The GraphSAGE settings of one trainer (its share of a global batch)."""
    settings = dict(cfg.settings)
    if cfg.global_batch:
        batch = int(settings.get("batch_size", GRAPHSAGE_DEFAULTS["batch_size"]))
        settings["batch_size"] = math.ceil(batch / num_trainers)
    return settings


def _write_spec(
    work: Path,
    part_config: Path,
    num_classes: int,
    settings: Mapping[str, Any],
    cfg: LaunchConfig,
    threads: int,
) -> tuple[Path, Path]:
    """Write the worker spec; return its path and the path of the result it names."""
    spec = {
        "graph_name": json.loads(part_config.read_text())["graph_name"],
        "ip_config": str(work / "ip_config.txt"),
        "store_path": str(work / "gloo_store"),
        "result_path": str(work / "result.json"),
        "num_classes": num_classes,
        "settings": dict(settings),
        "seed": cfg.seed,
        "target_acc": cfg.target_acc,
        "max_epochs": cfg.max_epochs,
        "eval_every": cfg.eval_every,
        "stop_at_target": cfg.stop_at_target,
        "budget_s": cfg.budget_s,
        "eval_at_s": list(cfg.eval_at_s),
        "threads": threads,
    }
    path = work / "spec.json"
    path.write_text(json.dumps(spec, indent=2) + "\n")
    return path, Path(spec["result_path"])


def _server_argv(layout: _Layout, machine: int) -> list[str]:
    worker = [sys.executable, "-m", _WORKER, str(layout.spec)]
    if layout.topology == "single":
        return worker
    ready = layout.work / f"shm_ready_{machine}"
    script = 'mount -t tmpfs tmpfs /dev/shm && touch "$0" && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script,
            str(ready), *worker]  # fmt: skip


def _trainer_argv(layout: _Layout, server: _Proc | None) -> list[str]:
    worker = [sys.executable, "-m", _WORKER, str(layout.spec)]
    if server is None:
        return worker
    return ["nsenter", "--target", str(server.popen.pid), "--mount", f"--wd={ROOT}", "--",
            *worker]  # fmt: skip


def _start_servers(
    procs: _Processes, layout: _Layout, env: Mapping[str, str], part_config: Path, deadline: float
) -> list[_Proc]:
    servers = []
    for machine in range(layout.num_machines):
        server_env = {
            **env,
            "DGL_ROLE": "server",
            "DGL_SERVER_ID": str(machine),
            "DGL_NUM_CLIENT": str(layout.num_trainers),
            "DGL_CONF_PATH": str(part_config),
            "DGL_IP_CONFIG": str(layout.work / "ip_config.txt"),
            "OMP_NUM_THREADS": "1",
        }
        servers.append(procs.start(f"server{machine}", _server_argv(layout, machine), server_env))
    if layout.topology == "machines":
        _wait_for_files(
            procs, [layout.work / f"shm_ready_{m}" for m in range(layout.num_machines)], deadline
        )
    return servers


def _wait_for_files(procs: _Processes, paths: list[Path], deadline: float) -> None:
    while not all(path.exists() for path in paths):
        if procs.failed():
            raise DistDGLError(f"DistDGL server failed to start:\n{procs.report(procs.failed())}")
        if time.monotonic() > deadline:
            raise DistDGLError(f"servers not ready in time:\n{procs.report()}")
        time.sleep(0.1)


def _start_trainers(
    procs: _Processes, layout: _Layout, env: Mapping[str, str], servers: list[_Proc]
) -> list[_Proc]:
    trainers = []
    per_machine = layout.num_trainers // layout.num_machines
    for rank in range(layout.num_trainers):
        machine = rank // per_machine
        trainer_env = {
            **env,
            "DGL_ROLE": "client",
            "DGL_NUM_SAMPLER": "0",
            "DGL_GROUP_ID": "0",
            "DGL_NUM_CLIENT": str(layout.num_trainers),
            "DGL_IP_CONFIG": str(layout.work / "ip_config.txt"),
            RANK_ENV: str(rank),
            WORLD_ENV: str(layout.num_trainers),
        }
        server = None
        if layout.topology == "machines":
            trainer_env[MACHINE_ENV] = str(machine)
            server = servers[machine]
        trainers.append(procs.start(f"trainer{rank}", _trainer_argv(layout, server), trainer_env))
    return trainers


def launch(
    part_config: str | os.PathLike[str],
    num_trainers: int,
    num_classes: int,
    cfg: LaunchConfig,
    topology: str = "auto",
    work_dir: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """Run DistDGL servers and trainers on the partitions of ``part_config``.

    Parameters
    ----------
    part_config : path
        Written by :func:`partition`; ``num_parts`` must be ``num_trainers`` for
        topology ``machines`` and 1 for ``single``.
    num_trainers : int
        Trainer processes.
    num_classes : int
        Output width of the model.
    cfg : LaunchConfig
        Training and time bounds.
    topology : str
        ``"machines"``, ``"single"`` or ``"auto"`` (see the module docstring).
    work_dir : path, optional
        For the ip_config, spec, logs and result (a temporary directory by default,
        removed afterwards).

    Returns
    -------
    dict
        Trainer 0's result (the :mod:`.training` format; ``train_s`` is trainer 0's
        training time with a barrier after each epoch) plus ``num_trainers``,
        ``num_machines``, ``topology`` and ``wall_s`` (the whole launch).

    Raises
    ------
    DistDGLError
        If a process fails or the launch exceeds ``cfg.timeout_s``.
    """
    topology = _resolve_topology(topology)
    part_config = Path(part_config).resolve()
    num_parts = int(json.loads(part_config.read_text())["num_parts"])
    num_machines = num_parts
    expected = num_trainers if topology == "machines" else 1
    if num_parts != expected:
        raise ValueError(
            f"topology {topology!r} with {num_trainers} trainers needs {expected} partitions, "
            f"{part_config} has {num_parts}"
        )
    with contextlib.ExitStack() as stack:
        if work_dir is None:
            work_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="distdgl-"))
        work = Path(work_dir).resolve()
        work.mkdir(parents=True, exist_ok=True)
        for stale in (
            "result.json",
            "gloo_store",
            *(f"shm_ready_{m}" for m in range(num_machines)),
        ):
            (work / stale).unlink(missing_ok=True)
        threads = max(1, machine_cores() // num_trainers)
        settings = _trainer_settings(cfg, num_trainers)
        spec, result_path = _write_spec(work, part_config, num_classes, settings, cfg, threads)
        lines = [f"127.0.0.1 {port}\n" for port in _free_ports(num_machines)]
        (work / "ip_config.txt").write_text("".join(lines))
        layout = _Layout(topology, num_machines, num_trainers, work, spec)
        env = _base_env(threads)
        start = time.monotonic()
        deadline = start + cfg.timeout_s
        procs = stack.enter_context(_processes(work, cfg.grace_s))
        servers = _start_servers(
            procs, layout, env, part_config, min(deadline, start + cfg.start_timeout_s)
        )
        trainers = _start_trainers(procs, layout, env, servers)
        if not procs.wait(trainers, deadline):
            raise DistDGLError(f"DistDGL run exceeded {cfg.timeout_s} s:\n{procs.report()}")
        procs.wait(servers, min(deadline, time.monotonic() + cfg.grace_s))
        wall_s = time.monotonic() - start
        result = json.loads(result_path.read_text())
    result.update(
        num_trainers=num_trainers,
        num_machines=num_machines,
        topology=topology,
        wall_s=wall_s,
        global_batch=cfg.global_batch,
    )
    return result


def run(
    dataset: NodeDataset,
    num_trainers: int,
    cfg: LaunchConfig,
    topology: str = "auto",
    work_dir: str | os.PathLike[str] | None = None,
    part_method: str = "metis",
) -> dict[str, Any]:
    """Partition ``dataset`` for ``num_trainers`` and :func:`launch` DistDGL on it.

    Returns
    -------
    dict
        :func:`launch`'s result plus ``partition_s``.
    """
    topology = _resolve_topology(topology)
    num_parts = num_trainers if topology == "machines" else 1
    with contextlib.ExitStack() as stack:
        if work_dir is None:
            work_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="distdgl-"))
        work = Path(work_dir)
        start = time.perf_counter()
        part_config = partition(dataset, work / f"parts{num_parts}", num_parts, part_method)
        partition_s = time.perf_counter() - start
        result = launch(
            part_config,
            num_trainers,
            dataset.num_classes,
            cfg,
            topology,
            work / f"run{num_trainers}",
        )
    return {**result, "partition_s": partition_s, "part_method": part_method}


def _summary_line(result: Mapping[str, Any]) -> str:
    best = result["best_val_acc"], result["test_at_best_val"]
    last = result["history"][-1]
    return (
        f"P={result['num_trainers']} ({result['topology']}) seed {result['seed']}: "
        f"time to target {_seconds(result['time_to_target_s'])}, "
        f"{last['train_s'] / last['epoch']:.2f} s/epoch, "
        f"eval {result['eval_s_per_round']:.2f} s/round, "
        f"best val {best[0]:.4f} (test {best[1]:.4f}), wall {result['wall_s']:.1f} s"
    )


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.2f} s"


def _aggregate(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Mean and spread over the seeds of one process count."""
    reached = [r["time_to_target_s"] for r in runs if r["time_to_target_s"] is not None]
    per_epoch = [r["history"][-1]["train_s"] / r["history"][-1]["epoch"] for r in runs]
    return {
        "num_trainers": runs[0]["num_trainers"],
        "reached": f"{len(reached)}/{len(runs)}",
        "time_to_target_s": mean_std(reached),
        "train_s_per_epoch": mean_std(per_epoch),
        "eval_s_per_round": mean_std([r["eval_s_per_round"] for r in runs]),
        "test_at_best_val": mean_std([r["test_at_best_val"] for r in runs]),
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command", nargs="?", default="bench", choices=("bench", "check"))
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--num-nodes", type=int, default=50_000)
    parser.add_argument(
        "--graph", default=None, help="a dgl.save_graphs file instead of the synthetic graph"
    )
    parser.add_argument("--topology", default="auto", choices=TOPOLOGIES)
    parser.add_argument("--part-method", default="metis", choices=("metis", "random"))
    parser.add_argument("--target", type=float, default=0.87)
    parser.add_argument("--max-epochs", type=int, default=15)
    parser.add_argument("--eval-every", type=int, default=1)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument(
        "--settings",
        default=json.dumps(BENCH_SETTINGS),
        help="GraphSAGE settings as JSON (default: the synthetic sweep's best)",
    )
    parser.add_argument(
        "--per-trainer-batch", action="store_true", help="batch_size per trainer, not global"
    )
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--work-dir", default=None)
    parser.add_argument("--out", default=None, help="write all results to this JSON file")
    parser.add_argument("--no-launch", action="store_true", help="check: imports only")
    return parser


def smoke_run(
    work_dir: str | os.PathLike[str] | None = None, topology: str = "auto"
) -> dict[str, Any]:
    """Two trainers, three epochs on a 2,000-vertex, 4-class graph (about 20-30 s).

    One process reaches a test accuracy of 0.54-0.59 with these settings.
    """
    dataset = generate(SyntheticConfig(num_nodes=2000, num_features=16, num_classes=4, seed=2))
    settings = {"batch_size": 64, "fanouts": [5, 5], "hidden": 16, "lr": 0.02}
    cfg = LaunchConfig(settings=settings, target_acc=0.4, max_epochs=3, timeout_s=180)
    return run(dataset, 2, cfg, topology, work_dir)


def main(argv: list[str] | None = None) -> int:
    """Command line: ``check`` the runtime, or ``bench`` the process counts."""
    args = _parser().parse_args(argv)
    if args.command == "check":
        print(json.dumps(check_runtime(), indent=2))
        if not args.no_launch:
            print(_summary_line(smoke_run()), flush=True)
        return 0
    dataset = bench_dataset(args.graph, args.num_nodes)
    runs, failures = [], []
    for procs in args.procs:
        for seed in args.seeds:
            cfg = _bench_config(args, seed)
            work = None if args.work_dir is None else Path(args.work_dir) / f"p{procs}s{seed}"
            try:
                result = run(dataset, procs, cfg, args.topology, work, args.part_method)
            except DistDGLError as error:
                failures.append({"num_trainers": procs, "seed": seed, "error": str(error)})
                print(f"P={procs} seed {seed}: FAILED\n{error}", flush=True)
                continue
            print(_summary_line(result), flush=True)
            runs.append(result)
            _write_bench(args, runs, failures)
    for row in _write_bench(args, runs, failures):
        ttt, epoch = row["time_to_target_s"], row["train_s_per_epoch"]
        time_text = "never" if ttt["mean"] is None else f"{ttt['mean']:.2f} ± {ttt['std']:.2f} s"
        print(
            f"P={row['num_trainers']}: time to target {time_text} ({row['reached']}), "
            f"{epoch['mean']:.2f} s/epoch, eval {row['eval_s_per_round']['mean']:.2f} s/round"
        )
    return 1 if failures else 0


def bench_dataset(graph: str | None, num_nodes: int) -> NodeDataset:
    """The graph of ``bench``: the file ``graph`` read as ``scalegnn train --data graph``
    reads it (``data.name: dgl``, its features scaled as training scales them), or the
    synthetic generator's default graph of ``num_nodes`` vertices."""
    if graph is None:
        return generate(SyntheticConfig(num_nodes=num_nodes))
    return load_dataset(DataConfig(name="dgl", path=graph))


def _bench_config(args: argparse.Namespace, seed: int) -> LaunchConfig:
    return LaunchConfig(
        settings=json.loads(args.settings),
        global_batch=not args.per_trainer_batch,
        seed=seed,
        target_acc=args.target,
        max_epochs=args.max_epochs,
        eval_every=args.eval_every,
        stop_at_target=True,
        timeout_s=args.timeout,
    )


def _write_bench(
    args: argparse.Namespace, runs: list[dict[str, Any]], failures: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The per-process-count summary; everything is written to ``--out`` if given."""
    summary = [
        _aggregate([r for r in runs if r["num_trainers"] == procs])
        for procs in args.procs
        if any(r["num_trainers"] == procs for r in runs)
    ]
    if not args.out:
        return summary
    payload = {
        "graph": args.graph or "synthetic",
        "num_nodes": args.num_nodes if args.graph is None else None,
        "target_acc": args.target,
        "runtime": check_runtime(),
        "summary": summary,
        "runs": runs,
        "failures": failures,
    }
    Path(args.out).write_text(json.dumps(payload, indent=2) + "\n")
    return summary


if __name__ == "__main__":
    sys.exit(main())
