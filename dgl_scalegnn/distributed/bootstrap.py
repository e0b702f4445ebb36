"""Process bootstrap: who launched us, which rank we are, and torch.distributed start-up.

Ranks come from MPI (mpi4py) when launched by ``mpirun``, from Slurm's variables under
``srun``, from torchrun's environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``...), or
the process is alone. Under MPI (and under ``srun`` without ``MASTER_ADDR``), rank 0
hosts the rendezvous store on a port the kernel picks and broadcasts its address with
mpi4py; torch.distributed then carries all the data. The backend is NCCL on CUDA and
gloo on CPU, from one code path.

Nothing outside the job can steer it through the store: the store rank 0 hosts listens
only on the address the ranks use (loopback when every rank is on one node), and every
key of the job lives under a prefix derived from a per-job secret (drawn by rank 0 and
sent over MPI, or handed by the launcher in ``SCALEGNN_JOB_SECRET``). The secret also
signs the watchdog's abort records, so that a client that learns the prefix (a
``TCPStore`` lists its keys to anyone connected) still cannot forge one.

Order of start-up on GPUs: the rank's device is chosen and made current first, then the
process group is started bound to it (``device_id``), so NCCL initialises its
communicators eagerly at start-up instead of lazily inside the first training step.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import os
import secrets
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist

from dgl_scalegnn.config import ConfigError

__all__ = [
    "LaunchInfo",
    "JobStore",
    "SECRET_VARIABLE",
    "detect_launch",
    "init_distributed",
    "resolve_backend",
    "device_for",
]

_MPI_SIZE_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MV2_COMM_WORLD_SIZE")

#: The per-job secret that torchrun and srun launches hand to every rank.
SECRET_VARIABLE = "SCALEGNN_JOB_SECRET"
_MIN_SECRET_CHARS = 32
_LISTEN_BACKLOG = 4096  # every rank connects at once at start-up (the kernel caps it)


@dataclass(frozen=True)
class LaunchInfo:
    """This process's rank, the world size, its rank on the node, and the launcher."""

    rank: int
    world_size: int
    local_rank: int
    launcher: str  # "mpi", "slurm", "torchrun" or "single"


def _launched_by_mpi() -> bool:
    return any(int(os.environ.get(name, "1")) > 1 for name in _MPI_SIZE_VARIABLES)


def _launched_by_srun() -> bool:
    return int(os.environ.get("SLURM_NTASKS", "1")) > 1 and "SLURM_PROCID" in os.environ


def detect_launch() -> LaunchInfo:
    """Work out how this process was started, without starting any communication."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return LaunchInfo(
            rank=int(os.environ["RANK"]),
            world_size=int(os.environ["WORLD_SIZE"]),
            local_rank=int(os.environ.get("LOCAL_RANK", "0")),
            launcher="torchrun",
        )
    if _launched_by_mpi():
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        local = comm.Split_type(MPI.COMM_TYPE_SHARED)
        info = LaunchInfo(comm.Get_rank(), comm.Get_size(), local.Get_rank(), "mpi")
        local.Free()
        return info
    if _launched_by_srun():
        return LaunchInfo(
            rank=int(os.environ["SLURM_PROCID"]),
            world_size=int(os.environ["SLURM_NTASKS"]),
            local_rank=int(os.environ.get("SLURM_LOCALID", "0")),
            launcher="slurm",
        )
    return LaunchInfo(rank=0, world_size=1, local_rank=0, launcher="single")


def resolve_backend(requested: str) -> str:
    """``auto`` gives NCCL when CUDA is available and gloo otherwise."""
    if requested == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    if requested == "nccl" and not torch.cuda.is_available():
        raise RuntimeError("parallel.backend is 'nccl' but CUDA is not available; use gloo or auto")
    return requested


def device_for(info: LaunchInfo, backend: str) -> torch.device:
    """One GPU per rank (by node-local rank) with NCCL, made current; the CPU with gloo.

    A rank that sees one GPU (e.g. bound by ``srun --gpus-per-task=1`` or
    ``CUDA_VISIBLE_DEVICES``) uses it; otherwise node-local rank ``i`` takes GPU ``i``.
    """
    if backend != "nccl":
        return torch.device("cpu")
    count = torch.cuda.device_count()
    index = 0 if count == 1 else info.local_rank
    if index >= count:
        raise RuntimeError(
            f"rank {info.rank} is node-local rank {info.local_rank} but this node shows "
            f"{count} GPUs; NCCL needs one GPU per rank: launch at most {count} processes "
            "per node, or bind one GPU to each rank (CUDA_VISIBLE_DEVICES)"
        )
    device = torch.device("cuda", index)
    torch.cuda.set_device(device)
    return device


@dataclass(frozen=True)
class JobStore:
    """The job's view of the rendezvous store.

    Parameters
    ----------
    store : torch.distributed.Store
        The rendezvous ``TCPStore`` under the job's secret prefix: every key the job
        reads or writes (torch.distributed's, the watchdog's, the data cache's) lives
        there.
    hosts_store : bool
        This process hosts the ``TCPStore`` (it must outlive the other ranks' reads).
    record_key : bytes
        Signs the watchdog's abort records (derived from the secret, never stored).
    """

    store: dist.Store
    hosts_store: bool
    record_key: bytes


def _job_store(store: dist.Store, secret: str, hosts_store: bool) -> JobStore:
    """Put ``store`` under the prefix that ``secret`` derives. The prefix and the record
    key are one-way functions of the secret: a client that lists the store's keys
    learns the prefix, not the secret, and so cannot sign an abort record."""

    def derive(purpose: bytes) -> hmac.HMAC:
        return hmac.new(secret.encode(), purpose, hashlib.sha256)

    prefix = "job-" + derive(b"store prefix").hexdigest()[:32]
    return JobStore(dist.PrefixStore(prefix, store), hosts_store, derive(b"abort record").digest())


def _host_store(
    address: str, port: int, world_size: int, timeout: datetime.timedelta
) -> dist.TCPStore:
    """The rendezvous store, listening on ``address`` only (``TCPStore`` alone listens on
    every interface): a name binds the address that the ranks' connections try first.
    Port 0 lets the kernel pick one while binding."""
    family, _, _, _, bound = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0]
    listener = socket.create_server(bound, family=family, backlog=_LISTEN_BACKLOG)
    return dist.TCPStore(
        address,
        listener.getsockname()[1],
        world_size,
        is_master=True,
        timeout=timeout,
        wait_for_workers=False,
        master_listen_fd=listener.detach(),  # the store owns the socket from here on
    )


def _store_over_mpi(rank: int, world_size: int, timeout: datetime.timedelta) -> JobStore:
    """The rendezvous store under MPI: rank 0 hosts it on loopback when every rank is
    on its node (else on ``MASTER_ADDR`` or its host's address), on ``MASTER_PORT`` or a
    port the kernel picks, draws the job's secret, and broadcasts the three with mpi4py;
    the other ranks connect to it."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    one_node = node.Get_size() == world_size
    node.Free()
    store, endpoint = None, None
    if rank == 0:
        address = (
            "127.0.0.1"
            if one_node
            else os.environ.get("MASTER_ADDR") or socket.gethostbyname(socket.gethostname())
        )
        store = _host_store(address, int(os.environ.get("MASTER_PORT", "0")), world_size, timeout)
        endpoint = (address, store.port, secrets.token_hex(32))
    address, port, secret = comm.bcast(endpoint, root=0)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = address, str(port)
    if store is None:
        store = dist.TCPStore(address, port, world_size, is_master=False, timeout=timeout)
    return _job_store(store, secret, rank == 0)


def _launcher_secret(info: LaunchInfo) -> str:
    """The secret a torchrun or srun launch hands in ``SCALEGNN_JOB_SECRET``.

    Refused when missing: torchrun's own run id is no substitute (its agent's store
    lists it in its key names, and its log prints it)."""
    secret = os.environ.get(SECRET_VARIABLE, "")
    if len(secret) < _MIN_SECRET_CHARS:
        found = f"has {len(secret)} characters" if secret else "is not set"
        raise ConfigError(
            f"{SECRET_VARIABLE} {found} for this {info.world_size}-process {info.launcher} "
            "launch: the job keeps its rendezvous keys under it, so that no process outside "
            "the job can read or set them. Launch with launch/torchrun.sh or launch/srun.sh "
            f"(they draw one), or export {SECRET_VARIABLE} with at least {_MIN_SECRET_CHARS} "
            "random characters (e.g. from `od -An -tx1 -N32 /dev/urandom | tr -d ' \\n'`), "
            "the same on every node"
        )
    return secret


def _store_from_launcher(info: LaunchInfo, timeout: datetime.timedelta) -> JobStore:
    """The rendezvous store at the launcher's ``MASTER_ADDR``/``MASTER_PORT``: hosted by
    torchrun's agent, or by rank 0 listening on that address only."""
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if name not in os.environ]
    if missing:
        raise RuntimeError(
            f"{' and '.join(missing)} not set for a {info.world_size}-process "
            f"{info.launcher} launch; export them (launch/srun.sh does) or launch with "
            "mpirun"
        )
    secret = _launcher_secret(info)
    address, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    agent_hosts_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    hosts_store = info.rank == 0 and not agent_hosts_store
    if hosts_store:
        store = _host_store(address, port, info.world_size, timeout)
    else:
        store = dist.TCPStore(address, port, info.world_size, is_master=False, timeout=timeout)
    return _job_store(store, secret, hosts_store)


def init_distributed(
    info: LaunchInfo, backend: str, timeout_s: float, device: torch.device | None = None
) -> JobStore | None:
    """Start torch.distributed for a multi-process launch; return the job's store.

    A single process needs nothing (returns ``None``). The store is the rendezvous
    ``TCPStore`` (hosted by rank 0, or by torchrun's agent) under the job's secret
    prefix; the watchdog and the data cache use it too. A CUDA ``device`` (from
    :func:`device_for`, already current) binds the process group to it.

    Raises
    ------
    ConfigError
        A torchrun or srun launch without ``SCALEGNN_JOB_SECRET``.
    """
    if info.world_size == 1 or dist.is_initialized():
        return None
    timeout = datetime.timedelta(seconds=timeout_s)
    if info.launcher == "mpi" or (info.launcher == "slurm" and "MASTER_ADDR" not in os.environ):
        job = _store_over_mpi(info.rank, info.world_size, timeout)
    else:
        job = _store_from_launcher(info, timeout)
    dist.init_process_group(
        backend=backend,
        store=job.store,
        rank=info.rank,
        world_size=info.world_size,
        timeout=timeout,
        device_id=device if device is not None and device.type == "cuda" else None,
    )
    return job
