"""Process bootstrap: who launched us, which rank we are, and torch.distributed start-up.

Ranks come from MPI (mpi4py) when launched by ``mpirun``, from Slurm's variables under
``srun``, from torchrun's environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``...), or
the process is alone. Under MPI (and under ``srun`` without ``MASTER_ADDR``), rank 0
hosts the rendezvous store on a port the kernel picks and broadcasts its address with
mpi4py;
torch.distributed then carries all the data. The backend is NCCL on
CUDA and gloo on CPU, from one code path.

Order of start-up on GPUs: the rank's device is chosen and made current first, then the
process group is started bound to it (``device_id``), so NCCL initialises its
communicators eagerly at start-up instead of lazily inside the first training step.
"""

from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["LaunchInfo", "detect_launch", "init_distributed", "resolve_backend", "device_for"]

_MPI_SIZE_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MV2_COMM_WORLD_SIZE")


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


def _store_over_mpi(rank: int, world_size: int, timeout: datetime.timedelta) -> dist.Store:
    """The rendezvous store under MPI: rank 0 hosts it, on ``MASTER_PORT`` or on a port
    the kernel picks while binding (no window in which another process can take it), and
    broadcasts its address and port with mpi4py; the other ranks connect to it."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    store, endpoint = None, None
    if rank == 0:
        address = os.environ.get("MASTER_ADDR") or socket.gethostbyname(socket.gethostname())
        store = dist.TCPStore(
            address,
            int(os.environ.get("MASTER_PORT", "0")),
            world_size,
            is_master=True,
            timeout=timeout,
            wait_for_workers=False,
        )
        endpoint = (address, store.port)
    address, port = comm.bcast(endpoint, root=0)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = address, str(port)
    if store is None:
        store = dist.TCPStore(address, port, world_size, is_master=False, timeout=timeout)
    return store


def init_distributed(
    info: LaunchInfo, backend: str, timeout_s: float, device: torch.device | None = None
) -> tuple[dist.Store, bool] | None:
    """Start torch.distributed for a multi-process launch; return its key-value store and
    whether this process hosts it.

    A single process needs nothing (returns ``None``). The store is the rendezvous
    ``TCPStore`` (hosted by rank 0, or by torchrun's agent); the watchdog uses it too.
    A CUDA ``device`` (from :func:`device_for`, already current) binds the process group
    to it.
    """
    if info.world_size == 1 or dist.is_initialized():
        return None
    timeout = datetime.timedelta(seconds=timeout_s)
    if info.launcher == "mpi" or (info.launcher == "slurm" and "MASTER_ADDR" not in os.environ):
        store, hosts_store = _store_over_mpi(info.rank, info.world_size, timeout), info.rank == 0
    else:
        missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if name not in os.environ]
        if missing:
            raise RuntimeError(
                f"{' and '.join(missing)} not set for a {info.world_size}-process "
                f"{info.launcher} launch; export them (launch/srun.sh does) or launch with "
                "mpirun"
            )
        agent_hosts_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        hosts_store = info.rank == 0 and not agent_hosts_store
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            info.world_size,
            is_master=hosts_store,
            timeout=timeout,
        )
    dist.init_process_group(
        backend=backend,
        store=store,
        rank=info.rank,
        world_size=info.world_size,
        timeout=timeout,
        device_id=device if device is not None and device.type == "cuda" else None,
    )
    return store, hosts_store
