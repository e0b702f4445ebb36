"""What a rank's start-up sets for its host: the interface gloo and NCCL listen on, and
how many compile workers Inductor may start.

- A host with several networks: gloo and NCCL's bootstrap are pinned to the interface
  that reaches the other hosts (NCCL by exact name), not the first one NCCL finds; what
  the user set is kept. (tests/test_multihost.py runs gloo across real namespaced hosts.)
- Ranks on one node share its cores for Inductor's compile workers (each would start
  ``min(32, cores)``): 8 ranks on a 64-core node get 8 each; the user's
  ``TORCHINDUCTOR_COMPILE_THREADS`` is kept.

Both through :func:`~dgl_scalegnn.distributed.rendezvous.init_distributed`, its store and
process group stubbed.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch._inductor.config as inductor
import torch.distributed as dist

from dgl_scalegnn.distributed import rendezvous
from dgl_scalegnn.distributed.launch import LaunchInfo
from dgl_scalegnn.distributed.rendezvous import init_distributed

#: A multi-homed host: a management network first, the hosts' own network second.
_INTERFACES = {
    "lo": ["127.0.0.1"],
    "eno1": ["192.168.7.5"],
    "ens2": ["10.233.39.2"],
}
_REACHED_FROM_THE_OTHERS = "10.233.39.2"
_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TORCHINDUCTOR_COMPILE_THREADS")


@pytest.fixture
def start(monkeypatch):
    """``start(info)``: :func:`init_distributed` of a torchrun launch whose ranks span
    hosts where ``info.local_world_size`` is below the world size; the variables it may
    set are unset before and restored after."""
    for name in _VARIABLES:
        monkeypatch.setenv(name, "")  # restored after the test, whatever it sets
        monkeypatch.delenv(name)
    monkeypatch.setattr(dist, "TCPStore", lambda *args, **kwargs: dist.HashStore())
    monkeypatch.setattr(dist, "init_process_group", lambda **kwargs: None)
    monkeypatch.setenv("SCALEGNN_JOB_SECRET", "s" * 32)
    monkeypatch.setenv("MASTER_ADDR", "10.233.39.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setattr(rendezvous, "_reachable_address", lambda peers: _REACHED_FROM_THE_OTHERS)
    addresses = {
        name: [SimpleNamespace(address=address) for address in found]
        for name, found in _INTERFACES.items()
    }
    monkeypatch.setattr(rendezvous.psutil, "net_if_addrs", lambda: addresses)

    def started(info: LaunchInfo) -> None:
        init_distributed(info, "nccl", 60)

    saved = inductor.compile_threads  # a config module: monkeypatch cannot restore it
    yield started
    inductor.compile_threads = saved


def _torchrun(world_size: int, on_this_node: int) -> LaunchInfo:
    return LaunchInfo(1, world_size, 0, "torchrun", local_world_size=on_this_node)


#: One rank on each of two hosts.
ACROSS_HOSTS = _torchrun(2, 1)


def test_gloo_and_nccl_listen_where_the_other_hosts_reach_this_one(start, monkeypatch):
    start(ACROSS_HOSTS)
    assert os.environ["GLOO_SOCKET_IFNAME"] == "ens2"
    assert os.environ["NCCL_SOCKET_IFNAME"] == "=ens2"  # exactly ens2, no prefix


def test_interfaces_the_user_set_are_kept(start, monkeypatch):
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "ib")
    start(ACROSS_HOSTS)
    assert os.environ["NCCL_SOCKET_IFNAME"] == "ib"
    assert os.environ["GLOO_SOCKET_IFNAME"] == "ens2"


def _node(monkeypatch, cores: int, usable: int) -> None:
    """A node of ``cores`` cores of which this process may run on ``usable``."""
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(usable)))


@pytest.mark.parametrize(
    ("cores", "usable", "ranks", "workers"),
    [
        (64, 64, 8, 8),  # unbound (mpirun --bind-to none): the node's cores over its ranks
        (128, 16, 8, 16),  # bound to 16 cores (srun --cpus-per-task=16)
        (256, 256, 2, 32),  # Inductor's own cap
        (4, 4, 8, 1),  # more ranks than cores: one each
    ],
)
def test_ranks_on_a_node_share_its_cores_for_compile_workers(
    start, monkeypatch, cores, usable, ranks, workers
):
    _node(monkeypatch, cores, usable)
    start(_torchrun(ranks, ranks))
    assert inductor.compile_threads == workers
    assert os.environ["TORCHINDUCTOR_COMPILE_THREADS"] == str(workers)


def test_compile_workers_the_user_set_are_kept(start, monkeypatch):
    _node(monkeypatch, 64, 64)
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "3")
    inductor.compile_threads = 3  # as Inductor read it
    start(_torchrun(8, 8))
    assert inductor.compile_threads == 3
