"""Several hosts on one machine: Linux network namespaces joined by a bridge.

Each host is a network namespace of its own with loopback, one address on a private
test subnet and no route beyond it; its processes also get their own hostname (a UTS
namespace) and their own ``/etc/hosts`` (a mount namespace with a file of the test
bound over it), so the hosts find each other by name. A veth pair joins each host to a
bridge that lives in one more namespace of the harness: nothing here touches the root
namespace's network, and no packet can leave the namespaces. One line gives a test its
hosts, torn down when the block ends, also on failure::

    with cluster(tmp_path, 2) as hosts:
        subprocess.run(hosts.on("node1", ["hostname"]))  # prints node1

Needs root and ``ip netns`` (iproute2) with ``unshare`` (util-linux): where either is
missing, :func:`cluster` raises, saying which; it never skips.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.helpers import stand_in_slurm

#: Every namespace of the harness is named PREFIX<pid of its test process>-<n>-<host>:
#: the leftovers of a test process that was killed are found and removed by it.
PREFIX = "scalegnn-mh-"
#: The hosts' subnet (RFC 1918), used only inside the namespaces of the harness.
SUBNET = "10.233.39"
#: What Debian-style machines map their own name to in /etc/hosts.
DEBIAN_OWN_ADDRESS = "127.0.1.1"
_MASTER_PORT = 29500  # any port: each host has a network of its own


@dataclass(frozen=True)
class Host:
    """One host: its hostname, network namespace and address on the test subnet."""

    name: str
    namespace: str
    address: str


# enter HOST COMMAND...: run COMMAND as a process of HOST: in its network namespace,
# with its hostname and its /etc/hosts (exec all the way: COMMAND keeps the pid).
_ENTER = textwrap.dedent(
    """\
    #!/bin/sh
    host=$1
    shift
    exec ip netns exec "{prefix}$host" unshare --uts --mount -- sh -c \\
      'hostname "$0" && mount --bind "$1" /etc/hosts && shift && exec "$@"' \\
      "$host" "{directory}/hosts.$host" "$@"
    """
)
# An rsh agent for mpirun (plm_rsh_agent): `AGENT [OPTIONS] HOST COMMAND...` runs the
# command line on HOST through a shell, as ssh would: in a login's environment, not the
# caller's (what the ranks there need, mpirun must forward).
_RSH_AGENT = textwrap.dedent(
    """\
    #!/bin/sh
    while [ "${{1#-}}" != "$1" ]; do shift; done
    host=$1
    shift
    exec "{enter}" "$host" env -i HOME="$HOME" PATH=/usr/local/bin:/usr/bin:/bin sh -c "$*"
    """
)


class Cluster:
    """Hosts ``node0``, ``node1``... of one test, made by :func:`cluster`.

    ``enter`` is a script, ``enter HOST COMMAND...``, that runs a command on a host (any
    launcher's stand-in can use it); ``rsh_agent`` is the same for mpirun's rsh launcher.
    """

    def __init__(self, directory: Path, hosts: list[Host]) -> None:
        self.directory, self.hosts = directory, hosts
        self.enter = directory / "enter"
        self.rsh_agent = directory / "rsh-agent"

    def host(self, name: str) -> Host:
        return next(host for host in self.hosts if host.name == name)

    def on(self, name: str, argv: list[str]) -> list[str]:
        """``argv`` as a command line that runs it on host ``name``."""
        return [str(self.enter), name, *argv]

    def pids(self, name: str) -> list[int]:
        """The processes running on host ``name`` (every one was started by the test)."""
        return _namespace_pids(self.host(name).namespace)

    def kill(self, name: str) -> list[int]:
        """SIGKILL every process on host ``name``; returns their pids."""
        return _kill_namespace(self.host(name).namespace)

    def slurm(self, directory: Path, tasks: int) -> dict[str, str]:
        """The environment of an sbatch job on every host, whose stand-in ``srun``
        starts ``tasks`` tasks spread evenly over the hosts, each host's there
        (:func:`tests.helpers.stand_in_slurm`)."""
        names = [host.name for host in self.hosts]
        return stand_in_slurm(directory, tasks, _MASTER_PORT, names, on_node=self.enter)

    def hostfile(self, slots: int) -> Path:
        """An Open MPI hostfile naming every host with ``slots`` slots."""
        path = self.directory / "hostfile"
        path.write_text("".join(f"{host.name} slots={slots}\n" for host in self.hosts))
        return path


_NEEDS = "the multi-host harness needs root, `ip netns` (iproute2) and `unshare` (util-linux)"


def _check_tools() -> None:
    missing = [tool for tool in ("ip", "unshare", "mount", "hostname") if not shutil.which(tool)]
    if missing or os.geteuid() != 0:
        found = f"{' and '.join(missing)} not found" if missing else "not running as root"
        raise RuntimeError(f"{_NEEDS}: {found}")


def _run(argv: list[str]) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise RuntimeError(
            f"{_NEEDS}: `{shlex.join(argv)}` exited {result.returncode}: {result.stderr.strip()}"
        )
    return result.stdout


def _namespace_pids(namespace: str) -> list[int]:
    result = subprocess.run(
        ["ip", "netns", "pids", namespace], capture_output=True, text=True, timeout=30
    )
    return [int(pid) for pid in result.stdout.split()]


def _kill_namespace(namespace: str, timeout: float = 10.0) -> list[int]:
    """SIGKILL the processes of ``namespace`` until none is left."""
    killed: list[int] = []
    deadline = time.monotonic() + timeout
    while pids := _namespace_pids(namespace):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        killed += [pid for pid in pids if pid not in killed]
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {pids} of namespace {namespace} survive SIGKILL")
        time.sleep(0.05)
    return killed


def _remove(namespaces: list[str]) -> None:
    for namespace in namespaces:
        _kill_namespace(namespace)
        subprocess.run(["ip", "netns", "delete", namespace], capture_output=True, timeout=30)


def namespaces() -> list[str]:
    """The names of this machine's network namespaces (``ip netns``)."""
    return [line.split()[0] for line in _run(["ip", "netns", "list"]).splitlines() if line]


def _remove_leftovers() -> None:
    """Remove the namespaces of harness runs whose test process is gone (killed)."""

    def owner_alive(namespace: str) -> bool:
        pid = int(namespace[len(PREFIX) :].split("-")[0])
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True

    _remove([ns for ns in namespaces() if ns.startswith(PREFIX) and not owner_alive(ns)])


def _hosts_file(hosts: list[Host], own: Host, own_loopback: bool) -> str:
    lines = ["127.0.0.1 localhost"]
    for host in hosts:
        address = DEBIAN_OWN_ADDRESS if own_loopback and host is own else host.address
        lines.append(f"{address} {host.name}")
    return "\n".join(lines) + "\n"


_clusters = 0  # clusters made by this process: part of their namespaces' names


def _ip(namespace: str, *args: str) -> None:
    _run(["ip", "-n", namespace, *args])


def _build(bridge: str, hosts: list[Host]) -> None:
    """The bridge's namespace and each host's, joined by a veth pair (``eth0`` on the
    host's side)."""
    _run(["ip", "netns", "add", bridge])
    _ip(bridge, "link", "add", "br0", "type", "bridge")
    _ip(bridge, "link", "set", "br0", "up")
    for index, host in enumerate(hosts):
        _run(["ip", "netns", "add", host.namespace])
        port = f"veth{index}"
        _ip(bridge, "link", "add", port, "type", "veth", "peer", "eth0", "netns", host.namespace)
        _ip(bridge, "link", "set", port, "master", "br0", "up")
        _ip(host.namespace, "link", "set", "lo", "up")
        _ip(host.namespace, "addr", "add", f"{host.address}/24", "dev", "eth0")
        _ip(host.namespace, "link", "set", "eth0", "up")


@contextlib.contextmanager
def cluster(directory: Path, count: int, *, own_name_loopback: bool = False) -> Iterator[Cluster]:
    """``count`` hosts ``node0``... at ``SUBNET.1``... for the block.

    Parameters
    ----------
    directory : Path
        Where the harness keeps its scripts, hosts files and hostfile.
    count : int
        How many hosts.
    own_name_loopback : bool
        Each host's /etc/hosts maps its own name to 127.0.1.1, as on Debian-style
        machines (the other hosts' names still map to their addresses).
    """
    global _clusters
    _clusters += 1
    _check_tools()
    _remove_leftovers()
    stem = f"{PREFIX}{os.getpid()}-{_clusters}-"
    hosts = [Host(f"node{i}", f"{stem}node{i}", f"{SUBNET}.{i + 1}") for i in range(count)]
    directory.mkdir(parents=True, exist_ok=True)
    for host in hosts:
        text = _hosts_file(hosts, host, own_name_loopback)
        (directory / f"hosts.{host.name}").write_text(text)
    made = Cluster(directory, hosts)
    for path, text in (
        (made.enter, _ENTER.format(prefix=stem, directory=directory)),
        (made.rsh_agent, _RSH_AGENT.format(enter=made.enter)),
    ):
        path.write_text(text)
        path.chmod(0o755)
    try:
        _build(f"{stem}bridge", hosts)
        yield made
    finally:
        _remove([ns for ns in namespaces() if ns.startswith(stem)])
