"""torch.distributed's start-up for a multi-process launch, on a rendezvous store that
nothing outside the job can steer (:func:`init_distributed`).

Under MPI (and under ``srun`` without ``MASTER_ADDR``), rank 0 hosts the rendezvous
store on a port the kernel picks and broadcasts its address with mpi4py; under torchrun
and ``srun`` the store is at the launcher's ``MASTER_ADDR``. torch.distributed then
carries all the data; the backend is NCCL on CUDA and gloo on CPU, from one code path.

The store rank 0 hosts listens only on the address the ranks use (loopback when every
rank is on one node), and every key of the job lives under a prefix derived from a
per-job secret (drawn by rank 0 and sent over MPI, or handed by the launcher in
``SCALEGNN_JOB_SECRET``). The secret also signs the watchdog's abort records, so that a
client that learns the prefix (a ``TCPStore`` lists its keys to anyone connected) still
cannot forge one.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import hmac
import ipaddress
import os
import secrets
import socket
from dataclasses import dataclass

import psutil
import torch
import torch.distributed as dist

from dgl_scalegnn.config import ConfigError
from dgl_scalegnn.distributed.launch import LaunchInfo, share_compile_workers

__all__ = ["JobStore", "SECRET_VARIABLE", "init_distributed"]

#: The per-job secret that torchrun and srun launches hand to every rank.
SECRET_VARIABLE = "SCALEGNN_JOB_SECRET"
_MIN_SECRET_CHARS = 32
_LISTEN_BACKLOG = 4096  # every rank connects at once at start-up (the kernel caps it)
_PEERS_TRIED = 3  # other hosts whose routes rank 0 asks for an address the others reach
#: What pins gloo's and NCCL's sockets to one interface (:func:`_pin_socket_interfaces`).
_SOCKET_INTERFACE_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


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


def _open_store(
    address: str, port: int, world_size: int, timeout: datetime.timedelta, host: bool
) -> dist.TCPStore:
    """The rendezvous store at ``address``: connected to, or hosted here (``host``)
    listening on ``address`` only (``TCPStore`` alone listens on every interface): a name
    binds the address that the ranks' connections try first. Port 0 lets the kernel pick
    one while binding."""
    if not host:
        return dist.TCPStore(address, port, world_size, is_master=False, timeout=timeout)
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


def _not_loopback(addresses: list[str]) -> str | None:
    """The first of ``addresses`` that is not a loopback address (each host's own)."""
    return next(
        (a for a in addresses if not ipaddress.ip_address(a.partition("%")[0]).is_loopback), None
    )


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
        if (usable := _not_loopback(found)) is not None:
            return usable
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
    if (usable := _not_loopback(found)) is not None:
        return usable
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
            store = _open_store(address, port, world_size, timeout, host=True)
            endpoint = (address, store.port, secrets.token_hex(32))
    endpoint = comm.bcast(endpoint, root=0)
    if isinstance(endpoint, ConfigError):
        raise endpoint
    address, port, secret = endpoint
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = address, str(port)
    if not one_node:
        _pin_socket_interfaces(peers)
    if store is None:
        store = _open_store(address, port, world_size, timeout, host=False)
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
    store = _open_store(address, port, info.world_size, timeout, hosts_store)
    return _job_store(store, secret, hosts_store)


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
