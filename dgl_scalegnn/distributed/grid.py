"""The 4D process grid ``Gd x Gx x Gy x Gz`` and its process groups.

Rank layout: ``x`` varies fastest, then ``y``, then ``z``, then ``d``:

.. math::

    \\mathrm{rank} = x + G_x (y + G_y (z + G_z d)).

An X-group holds the ranks that differ only in ``x`` (one per ``(d, y, z)``), likewise
the Y- and Z-groups; a DP-group holds the ranks that differ only in ``d``; the TP-group
(the 3D grid of one data-parallel replica) the ranks that share ``d``. Every rank creates
every group in the same order, since ``torch.distributed.new_group`` is collective.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch.distributed as dist

from dgl_scalegnn.core.grid_shape import Coords, GridShape
from dgl_scalegnn.core.layout import Axis

__all__ = ["CommGroup", "Grid4D"]


@dataclass(frozen=True)
class CommGroup:
    """One process group of this rank, named for its role (``x``, ``y``, ``z``, ``dp``, ``tp``).

    ``handle`` is ``None`` when the group has one member: collectives on it are skipped.
    """

    kind: str
    ranks: tuple[int, ...]
    index: int
    handle: dist.ProcessGroup | None = field(default=None, compare=False, repr=False)

    @property
    def size(self) -> int:
        return len(self.ranks)


@dataclass(frozen=True)
class Grid4D:
    """This rank's place in the 4D grid and its process groups.

    Examples
    --------
    >>> grid = Grid4D.single_process()
    >>> str(grid.shape), grid.group(Axis.X).size
    ('1x1x1x1', 1)
    """

    shape: GridShape
    rank: int
    coords: Coords
    axis_groups: dict[Axis, CommGroup]
    dp_group: CommGroup
    tp_group: CommGroup

    def group(self, axis: Axis) -> CommGroup:
        return self.axis_groups[axis]

    def coord(self, axis: Axis) -> int:
        return self.coords.along(axis)

    def size(self, axis: Axis) -> int:
        return self.shape.size(axis)

    @classmethod
    def single_process(cls) -> Grid4D:
        return cls.build(GridShape(1, 1, 1, 1), rank=0)

    @classmethod
    def build(cls, shape: GridShape, rank: int) -> Grid4D:
        """Create every group of ``shape`` (collective over all ranks when distributed)."""
        distributed = dist.is_available() and dist.is_initialized()
        shape.check_world_size(dist.get_world_size() if distributed else 1)
        return cls._assemble(shape, rank, create_groups=distributed)

    @classmethod
    def view(cls, shape: GridShape, rank: int) -> Grid4D:
        """Rank ``rank``'s coordinates and group members, without process groups.

        For work that needs no communication, e.g. building every rank's share of a
        batch in one process to check it.
        """
        return cls._assemble(shape, rank, create_groups=False)

    @classmethod
    def _assemble(cls, shape: GridShape, rank: int, create_groups: bool) -> Grid4D:
        coords = shape.coords(rank)
        mine: dict[str, CommGroup] = {}
        for kind, varying in (("x", "x"), ("y", "y"), ("z", "z"), ("dp", "d"), ("tp", "xyz")):
            for ranks in shape.group_ranks(varying):
                # new_group is collective: every rank creates every group, in this order.
                handle = dist.new_group(ranks) if create_groups and len(ranks) > 1 else None
                if rank in ranks:
                    mine[kind] = CommGroup(kind, tuple(ranks), ranks.index(rank), handle)
        return cls(
            shape=shape,
            rank=rank,
            coords=coords,
            axis_groups={Axis.X: mine["x"], Axis.Y: mine["y"], Axis.Z: mine["z"]},
            dp_group=mine["dp"],
            tp_group=mine["tp"],
        )
