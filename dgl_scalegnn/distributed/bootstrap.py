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
Where each rank sees a single GPU, only the GPUs' identities tell whether the launcher
bound a different one to each rank or all ranks share one: the ranks compare them
through the store first (:func:`refuse_shared_gpus`), and NCCL starts with the warm-up.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import hmac
import ipaddress
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch
import torch.distributed as dist

from dgl_scalegnn.config import ConfigError, switch_on

__all__ = [
    "LaunchInfo",
    "JobStore",
    "DeviceChoice",
    "SECRET_VARIABLE",
    "MIN_COMPUTE_CAPABILITY",
    "detect_launch",
    "init_distributed",
    "cuda_problem",
    "cuda_environment",
    "driver_version",
    "resolve_device",
    "device_for",
    "gpu_may_be_shared",
    "gpu_identity",
    "refuse_shared_gpus",
    "use_tf32",
    "share_compile_workers",
]

#: Set by Open MPI's ``mpirun`` only (never by ``srun``).
_OPEN_MPI_SIZE = "OMPI_COMM_WORLD_SIZE"
#: Set by other MPI launchers, and by ``srun`` itself with ``--mpi=pmi2``, Cray PMI or PMIx.
_PMI_SIZE_VARIABLES = ("PMI_SIZE", "PMIX_SIZE", "MV2_COMM_WORLD_SIZE")

#: The oldest Linux driver branch each CUDA major release runs on (CUDA's minor-version
#: compatibility): torch 2.13's CUDA 13.0 build needs driver 580 or newer.
_MIN_DRIVER = {11: 450, 12: 525, 13: 580}
#: The oldest compute capability the CUDA 13 builds of torch 2.13 have kernels for
#: (Turing; Volta and older are not supported).
MIN_COMPUTE_CAPABILITY = (7, 5)
#: The loaded NVIDIA kernel module's version line, where a driver is installed.
_DRIVER_VERSION_FILE = Path("/proc/driver/nvidia/version")

#: The per-job secret that torchrun and srun launches hand to every rank.
SECRET_VARIABLE = "SCALEGNN_JOB_SECRET"
_MIN_SECRET_CHARS = 32
_LISTEN_BACKLOG = 4096  # every rank connects at once at start-up (the kernel caps it)
_PEERS_TRIED = 3  # other hosts whose routes rank 0 asks for an address the others reach
#: What pins gloo's and NCCL's sockets to one interface (:func:`_pin_socket_interfaces`).
_SOCKET_INTERFACE_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
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


def _gpus() -> str:
    """Each kind of GPU torch sees, with its compute capability and count."""
    kinds = Counter(
        f"{torch.cuda.get_device_name(i)} (compute capability "
        f"{'.'.join(map(str, torch.cuda.get_device_capability(i)))})"
        for i in range(torch.cuda.device_count())
    )
    return ", ".join(f"{count} x {kind}" for kind, count in kinds.items())


def cuda_environment() -> str:
    """torch's CUDA version, the driver's, and the GPUs torch sees with their compute
    capabilities, in one phrase (what a refusal or the start-up line names)."""
    build = torch.version.cuda
    facts = [f"torch {torch.__version__} " + (f"with CUDA {build}" if build else "without CUDA")]
    facts.append(_driver_words())
    if build and torch.cuda.is_available():
        facts.append(_gpus())
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


def _addresses(host: str) -> list[str]:
    """The addresses ``host`` resolves to here, IPv4 first (none if it does not resolve)."""
    try:
        found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return []
    found.sort(key=lambda info: info[0] != socket.AF_INET)
    return list(dict.fromkeys(str(info[4][0]) for info in found))


def _source_address(destination: str) -> str | None:
    """The address this host sends from towards ``destination`` (``None`` without a
    route): a UDP socket's ``connect`` asks the routing table and sends nothing."""
    family = socket.AF_INET6 if ":" in destination else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((destination, 9))
        except OSError:
            return None
        return str(probe.getsockname()[0])


def _is_loopback(address: str) -> bool:
    return ipaddress.ip_address(address.partition("%")[0]).is_loopback


def _reachable_address(peers: list[str]) -> str:
    """An address of this host that the ranks on the other hosts can reach.

    The address this host sends from towards the other hosts (``peers``, their names as
    they report them; the first few are tried): a host's own name often resolves to a
    loopback address (127.0.1.1 in Debian's /etc/hosts), which each other host would take
    for its own. Failing that (their names do not resolve here), a non-loopback address
    of this host's name.

    Raises
    ------
    ConfigError
        No usable address: the message names this host and the addresses tried.
    """
    host = socket.gethostname()
    tried = []
    for name in [*peers[:_PEERS_TRIED], host]:
        if name == host:
            found = _addresses(host)
        else:
            found = [s for a in _addresses(name) if (s := _source_address(a)) is not None]
        usable = [address for address in found if not _is_loopback(address)]
        if usable:
            return usable[0]
        what = "its own name" if name == host else f"towards {name}"
        tried.append(f"{what}: {', '.join(found) or 'none'}")
    raise ConfigError(
        f"no address of host {host} that the ranks on the other hosts can reach "
        f"({'; '.join(tried)}; a loopback address is each host's own): set MASTER_ADDR to "
        f"{host}'s address on the network the hosts share"
    )


def _store_address(peers: list[str]) -> str:
    """Where rank 0 hosts the store when the ranks span several hosts: ``MASTER_ADDR``
    when set (resolved here: the other ranks are given what rank 0 binds), else
    :func:`_reachable_address`."""
    given = os.environ.get("MASTER_ADDR")
    if not given:
        return _reachable_address(peers)
    found = _addresses(given)
    usable = [address for address in found if not _is_loopback(address)]
    if usable:
        return usable[0]
    host = socket.gethostname()
    raise ConfigError(
        f"MASTER_ADDR={given} resolves on {host} (rank 0) to "
        f"{', '.join(found) or 'no address'}, which the ranks on the other hosts cannot "
        f"reach: set MASTER_ADDR to {host}'s address on the network the hosts share, or "
        "unset it to let rank 0 choose one"
    )


def _pin_socket_interfaces(peers: list[str]) -> None:
    """Make gloo and NCCL's bootstrap listen where the other hosts reach this one (the
    interface of :func:`_reachable_address`). gloo's default device takes the address of
    the host's name, loopback on Debian-style hosts; NCCL takes the first ``ib*``
    interface, else the first that is neither loopback nor ``docker*``, which on a host
    with several networks (a management, storage or container network beside the one
    the hosts share) may be one the others cannot reach: its bootstrap then waits until
    the collective timeout. NCCL's is pinned by exact name (``=eth1``: a bare name is a
    prefix). ``GLOO_SOCKET_IFNAME`` and ``NCCL_SOCKET_IFNAME``, when set, are kept;
    NCCL's InfiniBand transport (``NCCL_IB_HCA``) is not affected."""
    wanted = [name for name in _SOCKET_INTERFACE_VARIABLES if name not in os.environ]
    if not wanted:
        return
    with contextlib.suppress(ConfigError):  # then the libraries' defaults, as before
        address = _reachable_address(peers)
        for interface, entries in psutil.net_if_addrs().items():
            if any(entry.address.partition("%")[0] == address for entry in entries):
                names = {"GLOO_SOCKET_IFNAME": interface, "NCCL_SOCKET_IFNAME": f"={interface}"}
                os.environ.update({name: names[name] for name in wanted})
                return


def _store_over_mpi(rank: int, world_size: int, timeout: datetime.timedelta) -> JobStore:
    """The rendezvous store under MPI: rank 0 hosts it on loopback when every rank is
    on its node (else on an address the other hosts reach, :func:`_store_address`),
    on ``MASTER_PORT`` or a port the kernel picks, draws the job's secret, and
    broadcasts the three with mpi4py; the other ranks connect to it. Across hosts each
    rank also pins gloo and NCCL to such an address of its own host.

    Raises
    ------
    ConfigError
        On every rank, when rank 0 finds no address for the store.
    """
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    one_node = node.Get_size() == world_size
    node.Free()
    # the other hosts' names, rank 0's first
    host = socket.gethostname()
    peers = [] if one_node else [h for h in dict.fromkeys(comm.allgather(host)) if h != host]
    store, endpoint = None, None
    if rank == 0:
        try:
            address = "127.0.0.1" if one_node else _store_address(peers)
        except ConfigError as error:
            endpoint = error  # every rank raises it (rank 0 alone says it)
        else:
            port = int(os.environ.get("MASTER_PORT", "0"))
            store = _host_store(address, port, world_size, timeout)
            endpoint = (address, store.port, secrets.token_hex(32))
    endpoint = comm.bcast(endpoint, root=0)
    if isinstance(endpoint, ConfigError):
        raise endpoint
    address, port, secret = endpoint
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = address, str(port)
    if not one_node:
        _pin_socket_interfaces(peers)
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
    if info.local_world_size is not None and info.local_world_size < info.world_size:
        _pin_socket_interfaces([address])  # across hosts: where they reach this one
    agent_hosts_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    hosts_store = info.rank == 0 and not agent_hosts_store
    if hosts_store:
        store = _host_store(address, port, info.world_size, timeout)
    else:
        store = dist.TCPStore(address, port, info.world_size, is_master=False, timeout=timeout)
    return _job_store(store, secret, hosts_store)


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


def init_distributed(
    info: LaunchInfo, backend: str, timeout_s: float, device: torch.device | None = None
) -> JobStore | None:
    """Start torch.distributed for a multi-process launch; return the job's store.

    A single process needs nothing (returns ``None``). The store is the rendezvous
    ``TCPStore`` (hosted by rank 0, or by torchrun's agent) under the job's secret
    prefix; the watchdog and the data cache use it too. A CUDA ``device`` (from
    :func:`device_for`, already current) binds the process group to it. Inductor's
    compile workers are the rank's share of its node's cores
    (:func:`share_compile_workers`).

    Raises
    ------
    ConfigError
        A torchrun or srun launch without ``SCALEGNN_JOB_SECRET``.
    """
    if info.world_size == 1 or dist.is_initialized():
        return None
    share_compile_workers(info)
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
