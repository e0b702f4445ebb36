"""The device a run trains on: whether CUDA is usable here and why not, the device and
backend a run takes (:func:`resolve_device`), each rank's GPU (:func:`device_for`), the
refusal of ranks that share one GPU (:func:`refuse_shared_gpus`), and TF32.

Order of start-up on GPUs: the rank's device is chosen and made current first, then the
process group is started bound to it
(:func:`~dgl_scalegnn.distributed.rendezvous.init_distributed`), so NCCL initialises its
communicators eagerly at start-up instead of lazily inside the first training step.
Where each rank sees a single GPU, only the GPUs' identities tell whether the launcher
bound a different one to each rank or all ranks share one: the ranks compare them
through the store first, and NCCL starts with the warm-up.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from dgl_scalegnn.config import ConfigError, switch_on
from dgl_scalegnn.distributed.launch import LaunchInfo

__all__ = [
    "DeviceChoice",
    "MIN_COMPUTE_CAPABILITY",
    "cuda_problem",
    "cuda_environment",
    "driver_version",
    "resolve_device",
    "device_for",
    "gpu_may_be_shared",
    "gpu_identity",
    "gpus",
    "refuse_shared_gpus",
    "use_tf32",
]

#: The oldest Linux driver branch each CUDA major release runs on (CUDA's minor-version
#: compatibility): torch 2.13's CUDA 13.0 build needs driver 580 or newer.
_MIN_DRIVER = {11: 450, 12: 525, 13: 580}
#: The oldest compute capability the CUDA 13 builds of torch 2.13 have kernels for
#: (Turing; Volta and older are not supported).
MIN_COMPUTE_CAPABILITY = (7, 5)
#: The loaded NVIDIA kernel module's version line, where a driver is installed.
_DRIVER_VERSION_FILE = Path("/proc/driver/nvidia/version")


@dataclass(frozen=True)
class DeviceChoice:
    """The device a run trains on, the backend that follows from it, and why."""

    device: str  # "cuda" or "cpu"
    backend: str  # "nccl" or "gloo"
    reason: str

    def describe(self, requested: str) -> str:
        """One line for the person starting the run.

        >>> DeviceChoice("cpu", "gloo", "torch 2.13.0+cpu has no CUDA").describe("auto")
        'device cpu, backend gloo (parallel.device auto): torch 2.13.0+cpu has no CUDA'
        """
        return (
            f"device {self.device}, backend {self.backend} (parallel.device {requested}): "
            f"{self.reason}"
        )


def driver_version() -> str | None:
    """The NVIDIA driver's version (e.g. ``580.65.06``): from the loaded kernel module,
    else from ``nvidia-smi``; ``None`` where neither is found."""
    try:
        line = _DRIVER_VERSION_FILE.read_text()
    except OSError:
        line = ""
    found = re.search(r"Kernel Module.*?\s(\d+\.\d+(?:\.\d+)?)\s", line)
    if found:
        return found.group(1)
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        said = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        ).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return said[0] if said and re.fullmatch(r"\d+(?:\.\d+)+", said[0]) else None


def _driver_cuda() -> str | None:
    """The newest CUDA version the driver supports, as torch's CUDA runtime reads it (a
    CUDA build of torch reads it even where the driver is too old for it)."""
    read = getattr(torch._C, "_cuda_getDriverVersion", None)
    try:
        version = read() if read is not None else 0
    except RuntimeError:
        return None
    return f"{version // 1000}.{version % 1000 // 10}" if version else None


def _driver_words() -> str:
    """``driver 580.65.06 (CUDA 13.0)``, or that none was found."""
    driver, cuda = driver_version(), _driver_cuda()
    if driver is None and cuda is None:
        return "no NVIDIA driver found"
    words = f"driver {driver or 'of unknown version'}"
    return f"{words} (CUDA {cuda})" if cuda else words


def gpus() -> list[dict[str, Any]]:
    """Each GPU torch sees: its index, name, compute capability, memory and
    multiprocessors."""
    found = []
    for index in range(torch.cuda.device_count()):
        properties = torch.cuda.get_device_properties(index)
        found.append(
            {
                "index": index,
                "name": properties.name,
                "compute_capability": f"{properties.major}.{properties.minor}",
                "memory_gib": round(properties.total_memory / 2**30, 2),
                "multiprocessors": properties.multi_processor_count,
            }
        )
    return found


def cuda_environment() -> str:
    """torch's CUDA version, the driver's, and the GPUs torch sees with their compute
    capabilities, in one phrase (what a refusal or the start-up line names)."""
    build = torch.version.cuda
    facts = [f"torch {torch.__version__} " + (f"with CUDA {build}" if build else "without CUDA")]
    facts.append(_driver_words())
    if build and torch.cuda.is_available():
        kinds = Counter(
            f"{g['name']} (compute capability {g['compute_capability']})" for g in gpus()
        )
        facts.append(", ".join(f"{count} x {kind}" for kind, count in kinds.items()))
    return ", ".join(facts)


def _why_torch_sees_no_gpu(build: str) -> str:
    needed = _MIN_DRIVER.get(int(build.split(".")[0]))
    driver = driver_version()
    if driver is None:
        return f"no NVIDIA driver found; torch {torch.__version__} is built for CUDA {build}"
    if needed is not None and int(driver.split(".")[0]) < needed:
        return (
            f"CUDA driver {driver} is older than torch {torch.__version__}'s CUDA {build} "
            f"needs (>= {needed})"
        )
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    hidden = f" with CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else ""
    return f"torch {torch.__version__} (CUDA {build}) sees no GPU{hidden}, driver {driver}"


def cuda_problem() -> str | None:
    """Why this process cannot train on CUDA, in one phrase; ``None`` where it can.

    CUDA is usable when torch is a CUDA build, sees a GPU (which needs a driver new
    enough for torch's CUDA), every GPU it sees has compute capability
    :data:`MIN_COMPUTE_CAPABILITY` or newer, and torch has NCCL.
    """
    build = torch.version.cuda
    if build is None:
        return f"torch {torch.__version__} has no CUDA"
    if not torch.cuda.is_available():
        return _why_torch_sees_no_gpu(build)
    for index in range(torch.cuda.device_count()):
        capability = torch.cuda.get_device_capability(index)
        if tuple(capability) < MIN_COMPUTE_CAPABILITY:
            return (
                f"GPU {index} ({torch.cuda.get_device_name(index)}) has compute capability "
                f"{capability[0]}.{capability[1]}; torch {torch.__version__}'s CUDA {build} "
                f"build runs on {'.'.join(map(str, MIN_COMPUTE_CAPABILITY))} and newer"
            )
    if not dist.is_nccl_available():
        return f"torch {torch.__version__} has no NCCL"
    return None


def resolve_device(requested: str) -> DeviceChoice:
    """The device and backend of a run that asks for ``requested`` (``auto``, ``cpu`` or
    ``cuda``, from :meth:`~dgl_scalegnn.config.ParallelConfig.requested_device`): CUDA
    with NCCL where it is usable (:func:`cuda_problem`), else the CPU with gloo.

    Raises
    ------
    ConfigError
        ``cuda`` was asked for where it is not usable: the message says why and names
        torch's CUDA version, the driver's and the GPUs' compute capabilities.
    """
    if requested == "cpu":
        return DeviceChoice("cpu", "gloo", "asked for")
    problem = cuda_problem()
    if problem is None:
        return DeviceChoice("cuda", "nccl", cuda_environment())
    if requested == "auto":
        return DeviceChoice("cpu", "gloo", problem)
    raise ConfigError(
        f"parallel.device: cuda (or backend nccl), but CUDA is not usable here: {problem} "
        f"({cuda_environment()}); docs/gpu.md lists what runs (torch 2.13 with CUDA 13, "
        "driver >= 580, compute capability >= 7.5): install that, or give parallel.device "
        "cpu (or auto)"
    )


def use_tf32(setting: bool | str, device: torch.device) -> bool:
    """Let float32 matrix products on CUDA run on TF32 tensor cores where ``setting`` is
    on (``auto``: on with CUDA); returns whether they do. Products then keep 10 mantissa
    bits of their inputs instead of 23, their sums stay float32; nothing changes on CPU."""
    on = device.type == "cuda" and switch_on(setting, device.type)
    if device.type == "cuda":
        torch.backends.cuda.matmul.fp32_precision = "tf32" if on else "ieee"
    return on


def device_for(info: LaunchInfo, backend: str) -> torch.device:
    """One GPU per rank (by node-local rank) with NCCL, made current; the CPU with gloo.

    Node-local rank ``i`` (``LOCAL_RANK``, ``SLURM_LOCALID``, MPI's shared-memory rank)
    takes GPU ``i`` of those it sees, every GPU of the node where the launcher leaves
    them visible (``launch/srun.sh``: NCCL finds NVLink and peer-to-peer paths only
    between GPUs a process sees), and more ranks on the node than GPUs are refused on
    each of them. A rank that sees one GPU (e.g. bound by ``srun --gpus-per-task=1`` or
    ``CUDA_VISIBLE_DEVICES``) uses it: whether another rank uses the same one is checked
    once the store is up (:func:`refuse_shared_gpus`).

    Raises
    ------
    ConfigError
        More ranks on this node than the GPUs it shows.
    """
    if backend != "nccl":
        return torch.device("cpu")
    count = torch.cuda.device_count()
    ranks_here = info.local_world_size or info.local_rank + 1
    if count != 1 and ranks_here > count:
        known = f" of the {ranks_here} on its node" if info.local_world_size else ""
        raise ConfigError(
            f"rank {info.rank} is node-local rank {info.local_rank}{known}, but the node "
            f"shows {count} GPUs; NCCL needs one GPU per rank: launch at most {count} "
            "processes per node, or bind one GPU to each rank (srun --gpus-per-task=1, or "
            "CUDA_VISIBLE_DEVICES set per rank)"
        )
    device = torch.device("cuda", 0 if count == 1 else info.local_rank)
    torch.cuda.set_device(device)
    return device


def gpu_may_be_shared(info: LaunchInfo, device: torch.device) -> bool:
    """Whether ranks of this job may share this rank's GPU: it is the only GPU the rank
    sees, and the job has several ranks (a launcher that binds one GPU per rank gives
    the same picture as ranks that all see one GPU). Every rank of a job whose nodes
    are alike decides alike."""
    return device.type == "cuda" and info.world_size > 1 and torch.cuda.device_count() == 1


def gpu_identity(device: torch.device) -> str:
    """The GPU's name and UUID (unique across machines)."""
    properties = torch.cuda.get_device_properties(device)
    return f"{properties.name} {properties.uuid}"


def _store_barrier(store: dist.Store, name: str, world_size: int) -> None:
    """Wait until all ``world_size`` ranks have reached ``name``, through the store."""
    if store.add(f"{name}/arrived", 1) == world_size:
        store.set(f"{name}/all", "1")
    store.wait([f"{name}/all"])


def refuse_shared_gpus(store: dist.Store, rank: int, world_size: int, gpu: str) -> None:
    """Refuse, on every rank, a job in which two ranks use the same GPU (NCCL would
    stop with "Duplicate GPU detected" on some of them and hang the others).

    Each rank counts itself on its ``gpu`` (:func:`gpu_identity`); after all have, a
    rank that is not alone on its GPU says so in the store, and every rank reads the
    verdict before any leaves (rank 0 hosts the store, which must outlive the reads).

    Raises
    ------
    ConfigError
        On every rank, naming the GPU and how many ranks share it.
    """
    claim = f"gpu-check/claims/{gpu}"
    store.add(claim, 1)
    _store_barrier(store, "gpu-check/claimed", world_size)
    sharing = store.add(claim, 0)
    if sharing > 1:
        store.compare_set(
            "gpu-check/shared",
            "",
            f"{sharing} ranks use one GPU, {gpu} (rank {rank} among them): each sees one GPU "
            "and it is the same one; NCCL needs one GPU per rank: bind a different GPU to "
            "each rank (srun --gpus-per-task=1, or CUDA_VISIBLE_DEVICES set per rank), or "
            "start at most one rank per GPU with all of them visible",
        )
    _store_barrier(store, "gpu-check/judged", world_size)
    verdict = store.get("gpu-check/shared").decode() if store.check(["gpu-check/shared"]) else ""
    _store_barrier(store, "gpu-check/read", world_size)
    if verdict:
        raise ConfigError(verdict)
