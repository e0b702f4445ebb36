"""Who started this process: its rank, the world size, its rank on its node and the
launcher (:func:`detect_launch`), found without starting any communication.

Ranks come from MPI (mpi4py) when launched by ``mpirun``, from Slurm's variables under
``srun``, from torchrun's environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``...), or
the process is alone. The ranks on a node share its cores, Inductor's compile workers
among them (:func:`share_compile_workers`).
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass

__all__ = ["LaunchInfo", "detect_launch", "share_compile_workers"]

#: Set by Open MPI's ``mpirun`` only (never by ``srun``).
_OPEN_MPI_SIZE = "OMPI_COMM_WORLD_SIZE"
#: Set by other MPI launchers, and by ``srun`` itself with ``--mpi=pmi2``, Cray PMI or PMIx.
_PMI_SIZE_VARIABLES = ("PMI_SIZE", "PMIX_SIZE", "MV2_COMM_WORLD_SIZE")
#: The most compile workers Inductor starts in one process (its own cap).
_MAX_COMPILE_WORKERS = 32


@dataclass(frozen=True)
class LaunchInfo:
    """This process's rank, the world size, its rank on the node, and the launcher; and
    how many ranks share its node, where the launcher says (``None`` otherwise)."""

    rank: int
    world_size: int
    local_rank: int
    launcher: str  # "mpi", "slurm", "torchrun" or "single"
    local_world_size: int | None = None


def _size(name: str) -> int:
    return int(os.environ.get(name, "1"))


def _srun_world() -> int | None:
    """The task count of an ``srun`` step of several tasks, ``None`` outside one."""
    tasks = _size("SLURM_NTASKS")
    return tasks if tasks > 1 and "SLURM_PROCID" in os.environ else None


def _launched_by_mpi() -> bool:
    """Open MPI's ``mpirun``, or another MPI launcher whose world is not the ``srun``
    step's: ``srun --mpi=pmi2`` (and Cray PMI, PMIx) sets ``PMI_SIZE`` (or ``PMIX_SIZE``)
    too, to the step's task count, and there the ranks read Slurm's variables instead
    of initialising MPI (the pip Open MPI speaks PMIx only: under PMI-2 it fails, or
    makes each task a world of one). Sizes alone decide, so every rank decides alike."""
    if _size(_OPEN_MPI_SIZE) > 1:
        return True
    sizes = {_size(name) for name in _PMI_SIZE_VARIABLES if name in os.environ}
    return max(sizes, default=1) > 1 and sizes != {_srun_world()}


def _slurm_tasks_on_node() -> int | None:
    """The tasks of this ``srun`` step on this node: Slurm writes the count per node as
    ``2(x3),1`` (three nodes of 2, then one of 1), indexed by ``SLURM_NODEID``."""
    for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"):
        spec = os.environ.get(name)
        if not spec:
            continue
        counts = []
        for count, repeat in re.findall(r"(\d+)(?:\(x(\d+)\))?", spec):
            counts += [int(count)] * int(repeat or 1)
        node = int(os.environ.get("SLURM_NODEID", "0"))
        return counts[node] if node < len(counts) else counts[-1]
    return None


def detect_launch() -> LaunchInfo:
    """Work out how this process was started, without starting any communication.

    torchrun's variables come first, then Open MPI's ``mpirun``, then an ``srun`` step
    (also with a PMI that sets ``PMI_SIZE`` to the step's size), then any other MPI
    launcher (mpi4py then gives the ranks).
    """
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        local_size = os.environ.get("LOCAL_WORLD_SIZE")
        return LaunchInfo(
            rank=int(os.environ["RANK"]),
            world_size=int(os.environ["WORLD_SIZE"]),
            local_rank=int(os.environ.get("LOCAL_RANK", "0")),
            launcher="torchrun",
            local_world_size=int(local_size) if local_size else None,
        )
    if _launched_by_mpi():
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        local = comm.Split_type(MPI.COMM_TYPE_SHARED)
        info = LaunchInfo(
            comm.Get_rank(), comm.Get_size(), local.Get_rank(), "mpi", local.Get_size()
        )
        local.Free()
        return info
    if _srun_world() is not None:
        return LaunchInfo(
            rank=int(os.environ["SLURM_PROCID"]),
            world_size=int(os.environ["SLURM_NTASKS"]),
            local_rank=int(os.environ.get("SLURM_LOCALID", "0")),
            launcher="slurm",
            local_world_size=_slurm_tasks_on_node(),
        )
    return LaunchInfo(rank=0, world_size=1, local_rank=0, launcher="single", local_world_size=1)


def share_compile_workers(info: LaunchInfo) -> int:
    """Give ``torch.compile``'s Inductor this rank's share of the node's cores for its
    compile workers, and return it: ``TORCHINDUCTOR_COMPILE_THREADS`` where set, else the
    cores this process may run on, at most the node's cores over its ranks
    (``info.local_world_size``) and Inductor's cap of 32. Each process would otherwise
    start ``min(32, cores)`` workers at its first compile: 256 processes on a node of 8
    ranks and 32 cores or more. Set in the environment (read where Inductor's config is
    first imported) and in that config where it already is."""
    given = os.environ.get("TORCHINDUCTOR_COMPILE_THREADS")
    if given:
        return int(given)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    node_share = (os.cpu_count() or 1) // max(1, info.local_world_size or 1)
    workers = max(1, min(_MAX_COMPILE_WORKERS, cores or 1, node_share))
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = str(workers)
    config = sys.modules.get("torch._inductor.config")
    if config is not None:
        config.compile_threads = workers
    return workers
