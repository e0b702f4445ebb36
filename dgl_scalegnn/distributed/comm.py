"""Collectives of the 4D grid: eager helpers and the redistribution autograd function.

Each collective takes the group by role (a :class:`~dgl_scalegnn.distributed.grid.CommGroup`),
skips the call when the group has one member, charges its time and payload bytes to a
:class:`~dgl_scalegnn.profiling.Profiler`, and can cast a float32 payload to bfloat16
for the wire (the 3D PMM collectives only; statistics stay float32).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from dgl_scalegnn.config import ParallelConfig
from dgl_scalegnn.core.grid_shape import GridShape
from dgl_scalegnn.core.layout import Axis
from dgl_scalegnn.distributed.grid import CommGroup, Grid4D
from dgl_scalegnn.profiling import Profiler

__all__ = [
    "CommOptions",
    "Runtime",
    "PendingReduce",
    "all_reduce",
    "reduce_over_world",
    "agree_on",
    "start_all_reduce",
    "all_to_all",
    "warm_up_groups",
]


@dataclass(frozen=True)
class CommOptions:
    """Switches of the communication optimisations.

    ``bf16``: 3D PMM all-reduces travel as bfloat16. ``overlap``: in backward, the
    input-gradient and weight-gradient all-reduces of a linear run asynchronously on
    their orthogonal groups while the other gradient is computed.
    """

    bf16: bool = False
    overlap: bool = False

    @classmethod
    def from_config(cls, parallel: ParallelConfig) -> CommOptions:
        """The switches ``parallel.bf16_comm`` and ``parallel.overlap``."""
        return cls(bf16=parallel.bf16_comm, overlap=parallel.overlap)


@dataclass(frozen=True)
class Runtime:
    """What a parallel operator needs beyond its tensors: the grid, switches, profiler."""

    grid: Grid4D
    options: CommOptions
    profiler: Profiler

    @classmethod
    def single_process(cls) -> Runtime:
        return cls(Grid4D.single_process(), CommOptions(), Profiler(enabled=False))

    @classmethod
    def this_process(cls) -> Runtime:
        """A one-rank grid inside any world (a job of many ranks included): its groups
        have one member, so its operators send nothing."""
        return cls(Grid4D.view(GridShape(1, 1, 1, 1), 0), CommOptions(), Profiler(enabled=False))


def _skip(group: CommGroup) -> bool:
    """A one-member group needs no collective; a larger one must have a process group."""
    if group.size == 1:
        return True
    if group.handle is None:
        raise RuntimeError(
            f"the {group.kind}-group {group.ranks} has no process group: it comes from "
            "Grid4D.view, which is for communication-free work; use Grid4D.build"
        )
    return False


class PendingReduce:
    """An all-reduce in flight; :meth:`wait` returns the reduced tensor."""

    def __init__(
        self,
        result: torch.Tensor,
        wire: torch.Tensor,
        work: dist.Work | None,
        profiler: Profiler,
        component: str,
    ) -> None:
        self._result, self._wire, self._work = result, wire, work
        self._profiler, self._component = profiler, component

    def wait(self) -> torch.Tensor:
        if self._work is not None:
            with self._profiler.region(self._component):
                self._work.wait()
            self._work = None
        if self._wire is not self._result:
            self._result.copy_(self._wire)
            self._wire = self._result
        return self._result


def start_all_reduce(
    tensor: torch.Tensor,
    group: CommGroup,
    profiler: Profiler,
    *,
    component: str = "tp_allreduce",
    low_precision: bool = False,
    async_op: bool = False,
    op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM,
) -> PendingReduce:
    """Start an in-place all-reduce of ``tensor`` over ``group``."""
    if _skip(group):
        return PendingReduce(tensor, tensor, None, profiler, component)
    wire = tensor
    if low_precision and tensor.dtype == torch.float32:
        wire = tensor.to(torch.bfloat16)
    profiler.add_bytes(group.kind, wire.numel() * wire.element_size())
    with profiler.region(component):
        work = dist.all_reduce(wire, op=op, group=group.handle, async_op=async_op)
    return PendingReduce(tensor, wire, work if async_op else None, profiler, component)


def all_reduce(
    tensor: torch.Tensor,
    group: CommGroup,
    profiler: Profiler,
    *,
    component: str = "tp_allreduce",
    low_precision: bool = False,
    op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM,
) -> torch.Tensor:
    """All-reduce ``tensor`` in place over ``group`` and return it."""
    return start_all_reduce(
        tensor, group, profiler, component=component, low_precision=low_precision, op=op
    ).wait()


def reduce_over_world(
    tensor: torch.Tensor, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM
) -> torch.Tensor:
    """``tensor`` reduced in place over every rank of the job (one all-reduce on the
    default group; none on one process) and returned: for the few figures every rank
    must agree on, outside the grid's groups and the profiler."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(tensor, op=op)
    return tensor


def agree_on(
    value: float, op: dist.ReduceOp.RedOpType, device: torch.device | str = "cpu"
) -> float:
    """``value`` reduced over every rank of the job by ``op`` (collective; itself on one
    process), through a float64 tensor on ``device`` (the backend's): a figure every rank
    decides by alike."""
    tensor = torch.tensor([float(value)], dtype=torch.float64, device=device)
    return float(reduce_over_world(tensor, op).item())


def all_to_all(
    chunks: list[torch.Tensor],
    receive_numels: list[int],
    group: CommGroup,
    profiler: Profiler,
    *,
    component: str = "redistribute",
) -> list[torch.Tensor]:
    """Send ``chunks[i]`` (flattened) to member ``i`` of ``group``; receive flat chunks.

    Returns the received chunks, ``receive_numels[i]`` elements from member ``i``.
    """
    if _skip(group):
        return [chunks[0].reshape(-1)]
    reference = next((c for c in chunks if c.numel()), chunks[0])
    send = torch.cat([c.reshape(-1) for c in chunks]).to(reference.dtype)
    receive = send.new_empty(sum(receive_numels))
    sent_elsewhere = send.numel() - chunks[group.index].numel()
    profiler.add_bytes(group.kind, sent_elsewhere * send.element_size())
    with profiler.region(component):
        dist.all_to_all_single(
            receive,
            send,
            output_split_sizes=list(receive_numels),
            input_split_sizes=[c.numel() for c in chunks],
            group=group.handle,
        )
    return list(torch.split(receive, list(receive_numels)))


def warm_up_groups(grid: Grid4D, device: torch.device) -> None:
    """One small all-reduce on every process group of this rank, at start-up.

    NCCL builds a communicator on its first collective; without this the first training
    step would pay for all of them (and a rank that cannot reach the others would fail
    inside step 0 instead of at start-up). On gloo it is a cheap barrier per group.
    """
    # Every rank goes through the kinds in the same order, so no two groups wait on each other.
    for group in (*(grid.group(axis) for axis in Axis), grid.dp_group, grid.tp_group):
        if not _skip(group):
            dist.all_reduce(torch.zeros(1, device=device), group=group.handle)
